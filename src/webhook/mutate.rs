//! The mutating webhook's decision for one admission request: the writer
//! stamp for an Artifact ([`super::writer`]), and for a consumer the
//! rewrite ([`crate::rewrite::decide`]) of the object the request carries.
//! This module only reads the request: which consumer, which object, which
//! namespace, whether there is anything to decide at all. Pure.

use serde_json::Value;

use super::review::{AdmissionRequest, Operation};
use super::writer;
use crate::rewrite::{self, Decision, Input, Options, View};
use crate::vocabulary::consumers;

/// Decides one admission request. Never panics and makes no I/O.
pub fn decide(request: &AdmissionRequest, view: View<'_>, options: &Options) -> Decision {
    if let Some(decision) = writer::stamp(request) {
        return decision;
    }
    match input(request) {
        Ok(Some(input)) => rewrite::decide(input, view, options),
        Ok(None) => Decision::Unchanged,
        Err(stop) => stop,
    }
}

/// The consumer object `request` is about, or `Ok(None)` when there is
/// nothing to decide (not a create or update, a subresource).
fn input(request: &AdmissionRequest) -> Result<Option<Input<'_>>, Decision> {
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
        Decision::bad_request(format!(
            "openflux does not handle resource {}.{}; check the rules of its webhook configuration",
            gvr.resource, gvr.group
        ))
    })?;
    let object = request
        .object
        .as_ref()
        .filter(|o| o.is_object())
        .ok_or_else(|| Decision::bad_request("the admission request carries no object"))?;
    let meta_text = |field: &str| {
        object
            .get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let namespace = request
        .namespace
        .as_deref()
        .filter(|s| !s.is_empty())
        .or_else(|| meta_text("namespace"))
        .unwrap_or("");
    let name = meta_text("name")
        .or(request.name.as_deref().filter(|s| !s.is_empty()))
        .or_else(|| meta_text("generateName"))
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

#[cfg(test)]
mod tests;
