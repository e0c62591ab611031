//! An admission request as the decisions read it: what it is about, and
//! its objects pruned to what the decisions read ([`prune`]). The webhook's
//! codec (`crate::webhook::review`) reads one from an AdmissionReview.
//!
//! A consumer's request is read the same way by the mutating decision
//! ([`super::mutate`]) and the validating one ([`super::validate`]):
//! which consumer, which object, its namespace and name, the object stored
//! before, and whether there is anything to decide at all. Pure.

use serde::Deserialize;
use serde_json::Value;

use super::{Decision, Input};
use crate::vocabulary::consumers;

pub mod prune;

/// What an admission request is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

/// A resource as the API server names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct GroupVersionResource {
    pub group: String,
    pub version: String,
    pub resource: String,
}

/// The request of an AdmissionReview, as far as openflux reads it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    /// The object, with only what the decision reads ([`prune`]).
    #[serde(default, deserialize_with = "prune::pruned_object")]
    pub object: Option<Value>,
    /// The object before an update, pruned alike.
    #[serde(default, deserialize_with = "prune::pruned_object")]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// Who sent the request, as the API server authenticated them: the
    /// fields openflux reads ([`prune::user_keep`]).
    #[serde(default, deserialize_with = "prune::pruned_user")]
    pub user_info: Option<Value>,
}

/// Which webhook reads the request: its refusals name its own
/// configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Webhook {
    Mutating,
    Validating,
}

impl AdmissionRequest {
    /// The consumer object the request is about, or `Ok(None)` when there
    /// is nothing to decide (not a create or update, a subresource). A
    /// resource that is no consumer, or a request without an object, is a
    /// bad request: the webhook configuration sent what it should not.
    pub fn consumer(&self, webhook: Webhook) -> Result<Option<Input<'_>>, Decision> {
        if !matches!(self.operation, Operation::Create | Operation::Update) {
            return Ok(None);
        }
        if self.sub_resource.as_deref().is_some_and(|s| !s.is_empty()) {
            return Ok(None);
        }
        let gvr = &self.resource;
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
        let object = self
            .object
            .as_ref()
            .filter(|o| o.is_object())
            .ok_or_else(|| Decision::bad_request("the admission request carries no object"))?;
        let namespace = self
            .namespace
            .as_deref()
            .filter(|s| !s.is_empty())
            .or_else(|| metadata_text(object, "namespace"))
            .unwrap_or("");
        let name = metadata_text(object, "name")
            .or(self.name.as_deref().filter(|s| !s.is_empty()))
            .or_else(|| metadata_text(object, "generateName"))
            .unwrap_or("");
        let stored = match self.operation {
            Operation::Update => self.old_object.as_ref(),
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
}

/// `metadata.<field>` of an object, when it is a non-empty string.
fn metadata_text<'v>(object: &'v Value, field: &str) -> Option<&'v str> {
    object
        .get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
}
