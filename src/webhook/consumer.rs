//! What a consumer's admission request is about, read the same way by the
//! mutating webhook ([`super::mutate`]) and the validating one
//! ([`super::validate`]): which consumer, which object, its namespace and
//! name, the object stored before, and whether there is anything to decide
//! at all. Pure.

use serde_json::Value;

use super::review::{AdmissionRequest, Operation};
use crate::rewrite::{Decision, Input};
use crate::vocabulary::consumers;

/// Which webhook reads the request: its refusals name its own
/// configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Webhook {
    Mutating,
    Validating,
}

/// The consumer object `request` is about, or `Ok(None)` when there is
/// nothing to decide (not a create or update, a subresource). A resource
/// that is no consumer, or a request without an object, is a bad request:
/// the webhook configuration sent what it should not.
pub fn read(request: &AdmissionRequest, webhook: Webhook) -> Result<Option<Input<'_>>, Decision> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Ok(None);
    }
    if request
        .sub_resource
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        return Ok(None);
    }
    let gvr = &request.resource;
    let consumer = consumers::find(&gvr.group, &gvr.resource).ok_or_else(|| {
        let (verb, configuration) = match webhook {
            Webhook::Mutating => ("handle", "webhook configuration"),
            Webhook::Validating => ("validate", "validating webhook configuration"),
        };
        Decision::bad_request(format!(
            "openflux does not {verb} resource {}.{}; check the rules of its {configuration}",
            gvr.resource, gvr.group
        ))
    })?;
    let object = request
        .object
        .as_ref()
        .filter(|o| o.is_object())
        .ok_or_else(|| Decision::bad_request("the admission request carries no object"))?;
    let namespace = request
        .namespace
        .as_deref()
        .filter(|s| !s.is_empty())
        .or_else(|| metadata_text(object, "namespace"))
        .unwrap_or("");
    let name = metadata_text(object, "name")
        .or(request.name.as_deref().filter(|s| !s.is_empty()))
        .or_else(|| metadata_text(object, "generateName"))
        .unwrap_or("");
    let stored = match request.operation {
        Operation::Update => request.old_object.as_ref(),
        _ => None,
    };
    Ok(Some(Input {
        consumer,
        object,
        stored,
        namespace,
        name,
    }))
}

/// `metadata.<field>` of an object, when it is a non-empty string.
fn metadata_text<'v>(object: &'v Value, field: &str) -> Option<&'v str> {
    object
        .get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
}
