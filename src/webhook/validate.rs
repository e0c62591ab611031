//! The rules judged on a consumer's final references, after every mutation:
//! the tenant policy ([`crate::policy`]) and, with
//! `--no-cross-namespace-refs`, Flux's cross-namespace rule. Pure.
//!
//! A rule the mutating webhook alone enforced would be sidestepped by naming
//! an export directly (`kind: ExternalArtifact`, or `OCIRepository` for a
//! shadow, with the export's name), which the mutating webhook's
//! `matchConditions` never send to openflux. So openflux's validating
//! webhook sees every consumer whose reference has the shape of an export's
//! name ([`candidates::has_export_shape`]), whoever wrote it, and the
//! mutating webhook judges its own rewrite by the same function before it
//! answers ([`check_rewrite`]), so a denial comes with the person's own
//! reference in view.

use json_patch::Patch;
use serde_json::Value;

use super::review::{AdmissionRequest, Operation};
use crate::policy::{self, candidates, candidates::Reading};
use crate::rewrite::refs::{locate, SourceRef};
use crate::rewrite::{Decision, Options, View};
use crate::vocabulary::consumers::{self, Consumer};

/// The validating webhook's decision on one request: admitted
/// ([`Decision::Unchanged`]) or denied. Never patches, never panics.
pub fn decide(request: &AdmissionRequest, view: View<'_>, options: &Options) -> Decision {
    if !matches!(request.operation, Operation::Create | Operation::Update)
        || request
            .sub_resource
            .as_deref()
            .is_some_and(|s| !s.is_empty())
    {
        return Decision::Unchanged;
    }
    let Some(consumer) = consumers::find(&request.resource.group, &request.resource.resource)
    else {
        return Decision::bad_request(format!(
            "openflux does not validate resource {}.{}; check the rules of its validating webhook configuration",
            request.resource.resource, request.resource.group
        ));
    };
    let Some(object) = request.object.as_ref().filter(|o| o.is_object()) else {
        return Decision::bad_request("the admission request carries no object");
    };
    if metadata_field(object, "deletionTimestamp").is_some_and(|t| !t.is_null()) {
        return Decision::Unchanged;
    }
    let Some(namespace) = namespace_of(request, object) else {
        return Decision::bad_request(format!("the {} has no namespace", consumer.kind));
    };
    judge(consumer, object, None, namespace, view, options)
}

/// The mutating webhook's own rewrite, judged as the validating webhook
/// will judge it: `Some(denial)` when the rewritten object breaks the tenant
/// policy. The cross-namespace rule was applied while rewriting.
pub fn check_rewrite(
    request: &AdmissionRequest,
    patch: &Patch,
    view: View<'_>,
    options: &Options,
) -> Option<Decision> {
    let consumer = consumers::find(&request.resource.group, &request.resource.resource)?;
    let object = request.object.as_ref()?;
    let namespace = namespace_of(request, object)?;
    let policies = view.policies;
    if policies.synced && policies.knows(namespace) && !policies.restricts(namespace) {
        return None;
    }
    let mut rewritten = object.clone();
    if let Err(error) = json_patch::patch(&mut rewritten, &patch.0) {
        return Some(Decision::internal(format!(
            "openflux could not apply its own rewrite to check it: {error}"
        )));
    }
    match judge(consumer, &rewritten, Some(object), namespace, view, options) {
        Decision::Unchanged => None,
        other => Some(other),
    }
}

/// `metadata.<field>` of an object (looked up by keys: a JSON pointer
/// would allocate each of its tokens).
fn metadata_field<'v>(object: &'v Value, field: &str) -> Option<&'v Value> {
    object.get("metadata")?.get(field)
}

fn namespace_of<'r>(request: &'r AdmissionRequest, object: &'r Value) -> Option<&'r str> {
    request
        .namespace
        .as_deref()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            metadata_field(object, "namespace")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        })
}

/// Every reference of `object` that may name an export, judged. `original`
/// is the object before openflux's rewrite (the cross-namespace rule was
/// applied then), whose references the messages name.
fn judge(
    consumer: &'static Consumer,
    object: &Value,
    original: Option<&Value>,
    namespace: &str,
    view: View<'_>,
    options: &Options,
) -> Decision {
    let name = metadata_field(object, "name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let display = format!("{} {namespace}/{name}", consumer.kind);
    let field = &consumer.refs;
    let found = match locate(object, field, &display) {
        Ok(found) => found,
        Err(stop) => return stop,
    };
    for found in found {
        let r = match SourceRef::from_value(found.value) {
            Ok(r) => r,
            Err(e) => return Decision::bad_request(format!("{display}: {}.{e}", found.label)),
        };
        let api_version = r.api_version.as_deref().filter(|_| field.has_api_version);
        let source_ns = r.namespace.as_deref().unwrap_or(namespace);
        if !candidates::is_export_kind(api_version, &r.kind)
            || !candidates::has_export_shape(&r.name)
        {
            continue;
        }
        if original.is_none() && options.no_cross_namespace_refs && source_ns != namespace {
            return Decision::Deny {
                message: format!(
                    "openflux: {display} refers to {} {source_ns}/{} in {}, an export of openflux in another \
                     namespace, and cross-namespace references are disabled (--no-cross-namespace-refs); use a \
                     source in namespace {namespace} or remove {}.namespace",
                    r.kind, r.name, found.label, found.label
                ),
            };
        }
        let loading = |what: &str| {
            Decision::Error {
            code: 503,
            message: format!(
                "openflux has not finished loading its {what} and cannot check {} {source_ns}/{} yet; retry in a \
                 few seconds",
                r.kind, r.name
            ),
        }
        };
        if !view.policies.synced || !view.policies.knows(namespace) {
            return loading("SourcePolicies and namespaces");
        }
        if !view.policies.restricts(namespace) {
            continue;
        }
        if !view.index.is_synced() || !view.facts.synced {
            return loading("Artifacts and source kinds");
        }
        let Reading::Export(kinds) = candidates::read(
            api_version,
            &r.kind,
            &r.name,
            source_ns,
            view.index,
            view.facts,
        ) else {
            continue;
        };
        let verdict = view.policies.judge(namespace, &kinds);
        let what = original
            .and_then(|o| o.pointer(found.pointer.as_str()))
            .and_then(|v| SourceRef::from_value(v).ok())
            .filter(|o| o.name != r.name)
            .map(|o| {
                let ns = o.namespace.as_deref().unwrap_or(namespace);
                format!("{} {ns}/{} (exported as {})", o.kind, o.name, r.name)
            })
            .unwrap_or_else(|| format!("{} {source_ns}/{}", r.kind, r.name));
        let label = found.label.to_string();
        if let Some(message) = policy::denial(&display, namespace, &label, &what, &verdict) {
            return Decision::Deny { message };
        }
    }
    Decision::Unchanged
}

#[cfg(test)]
mod tests;
