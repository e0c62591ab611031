//! What an Artifact's `Ready` message says of its export: where it went and
//! why, what of it could not go, and what failed. Plain functions from data
//! to text.

use std::collections::BTreeSet;

use crate::api::{Artifact, ObjectReference};
use crate::cluster::facts::Facts;
use crate::cluster::target::Target;

/// The choices behind the targets, for the Artifact's message:
/// `Kustomization: <reason>; HelmRelease: <reason>`.
pub fn describe_choices(facts: &Facts) -> String {
    if facts.choices.is_empty() {
        return "no Flux consumer CRD (Kustomization, HelmRelease, ArtifactGenerator, Stack) is served".into();
    }
    let parts: Vec<String> = facts
        .choices
        .iter()
        .map(|(kind, c)| match c {
            Ok(c) => format!("{kind}: {}", c.reason),
            Err(no) => format!("{kind}: {no}"),
        })
        .collect();
    parts.join("; ")
}

/// What the Artifact's `Ready` message says when its producer declared
/// inputs that none of its exports can carry, and why; `None` when they
/// are carried (or there are none).
pub fn inputs_not_exported(
    artifact: &Artifact,
    targets: &BTreeSet<Target>,
    inputs_served: bool,
) -> Option<String> {
    if artifact
        .spec
        .exported_inputs
        .as_ref()
        .is_none_or(|i| i.is_empty())
    {
        return None;
    }
    if targets.contains(&Target::ExternalArtifact) {
        return (!inputs_served).then(|| {
            "its spec.exportedInputs are not exported: this cluster's ExternalArtifact API has no status.exportedInputs (source-controller v1.10 and later has it)".to_string()
        });
    }
    Some("its spec.exportedInputs are not exported: a shadow OCIRepository has no field for them (an ExternalArtifact has, from source-controller v1.10)".to_string())
}

/// The message of an Artifact whose export failed: what was being written
/// and what the API server answered.
pub fn failure_message(what: &str, answer: &str) -> String {
    format!("writing {what} failed, will retry: {answer}")
}

/// The message of an exported Artifact: the objects it was exported as
/// (`exported`, each named `name`), at which revision, the `reasons` the
/// targets were chosen, and what of it could not be exported (`note`).
pub fn exported_message(
    exported: &[ObjectReference],
    name: &str,
    artifact: &Artifact,
    reasons: &str,
    note: Option<String>,
) -> String {
    let kinds: Vec<&str> = exported.iter().map(|e| e.kind.as_str()).collect();
    let namespace = exported
        .first()
        .and_then(|e| e.namespace.as_deref())
        .unwrap_or_default();
    let message = format!(
        "exported as {} {namespace}/{name} at revision '{}' ({reasons})",
        kinds.join(" and "),
        artifact.spec.revision
    );
    match note {
        Some(note) => format!("{message}; {note}"),
        None => message,
    }
}
