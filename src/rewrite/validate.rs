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

use super::admission::{AdmissionRequest, Webhook};
use super::writer;
use crate::policy::{self, candidates, candidates::Reading};
use crate::rewrite::refs::{locate, SourceRef};
use crate::rewrite::{Decision, Input, Options, View};

/// The validating webhook's decision on one request: admitted
/// ([`Decision::Unchanged`]) or denied. Never patches, never panics. An
/// Artifact is judged on whether openflux's controllers could decode it
/// ([`writer::judge`]), as the mutating webhook judges it.
pub fn decide(request: &AdmissionRequest, view: View<'_>, options: &Options) -> Decision {
    if let Some(decision) = writer::judge(request) {
        return decision;
    }
    let input = match request.consumer(Webhook::Validating) {
        Ok(Some(input)) => input,
        Ok(None) => return Decision::Unchanged,
        Err(stop) => return stop,
    };
    let deleting = input
        .object
        .get("metadata")
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null());
    if deleting {
        return Decision::Unchanged;
    }
    if input.namespace.is_empty() {
        return Decision::bad_request(format!("the {} has no namespace", input.consumer.kind));
    }
    judge(&input, input.object, None, view, options)
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
    let input = request.consumer(Webhook::Mutating).ok()??;
    if input.namespace.is_empty() {
        return None;
    }
    let policies = view.policies;
    if policies.synced && policies.knows(input.namespace) && !policies.restricts(input.namespace) {
        return None;
    }
    let mut rewritten = input.object.clone();
    if let Err(error) = json_patch::patch(&mut rewritten, &patch.0) {
        return Some(Decision::internal(format!(
            "openflux could not apply its own rewrite to check it: {error}"
        )));
    }
    match judge(&input, &rewritten, Some(input.object), view, options) {
        Decision::Unchanged => None,
        other => Some(other),
    }
}

/// Every reference of `object` (the request's consumer, or openflux's
/// rewrite of it) that may name an export, judged. `original` is the object
/// before openflux's rewrite (the cross-namespace rule was applied then),
/// whose references the messages name.
fn judge(
    input: &Input<'_>,
    object: &Value,
    original: Option<&Value>,
    view: View<'_>,
    options: &Options,
) -> Decision {
    let namespace = input.namespace;
    let display = format!("{} {namespace}/{}", input.consumer.kind, input.name);
    let field = &input.consumer.refs;
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
