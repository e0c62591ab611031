//! Tests of [`decide`] on consumer objects, without an admission request.
//! The webhook's adapter is tested on recorded AdmissionReviews
//! (`webhook::mutate`), the re-pointer on its own table
//! (`consumers::repoint`).

use serde_json::{json, Value};

use super::testing::{artifact, facts_with, index_of};
use super::*;
use crate::cluster::target::Target;
use crate::vocabulary::consumers::CONSUMERS;

const HTTP: &str = "sources.openflux.dev/v1alpha1";
const FLUX: &str = "source.toolkit.fluxcd.io/v1";

fn kustomization(source_ref: Value) -> Value {
    json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
        "kind": "Kustomization",
        "metadata": {"name": "app", "namespace": "apps"},
        "spec": {"interval": "5m", "path": "./", "sourceRef": source_ref}
    })
}

/// `decide` for a Kustomization in `namespace` against one HttpSource
/// `apps/web` with an Artifact.
fn decide_kustomization(object: &Value, stored: Option<&Value>, namespace: &str) -> Decision {
    let index = index_of(&[artifact(
        "apps",
        "web-latest",
        Some((HTTP, "HttpSource", "web")),
    )]);
    let facts = facts_with(Target::ExternalArtifact);
    let view = View {
        index: &index,
        facts: &facts,
        policies: &crate::policy::NONE,
    };
    let input = Input {
        consumer: &CONSUMERS[0],
        object,
        stored,
        namespace,
        name: "app",
    };
    decide(input, view, &Options::default())
}

fn rewritten(object: &Value, decision: &Decision) -> Value {
    let Decision::Rewrite { patch, .. } = decision else {
        panic!("expected a rewrite, got {decision:?}");
    };
    let mut object = object.clone();
    json_patch::patch(&mut object, patch).unwrap();
    object
}

#[test]
fn a_reference_by_kind_points_at_the_export_in_the_namespace_given() {
    assert_eq!(CONSUMERS[0].kind, "Kustomization");
    let object = kustomization(json!({"kind": "HttpSource", "name": "web"}));
    let after = rewritten(&object, &decide_kustomization(&object, None, "apps"));
    assert_eq!(
        after["spec"]["sourceRef"],
        json!({"kind": "ExternalArtifact", "name": identity::source_export_name("sources.openflux.dev", "HttpSource", "web"), "apiVersion": FLUX})
    );
    assert_eq!(
        annotation_of(&after),
        Some(r#"{"kind":"HttpSource","name":"web"}"#)
    );
    // The namespace is the input's: in another one, no Artifact is known.
    let object = kustomization(json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "web"}));
    let elsewhere = decide_kustomization(&object, None, "other");
    let Decision::Rewrite { warnings, .. } = &elsewhere else {
        panic!("expected a rewrite with a warning, got {elsewhere:?}");
    };
    assert!(
        warnings[0].contains("HttpSource other/web has no Artifact yet"),
        "{warnings:?}"
    );
}

#[test]
fn an_object_being_deleted_is_left_as_it_is() {
    let mut object = kustomization(json!({"kind": "HttpSource", "name": "web"}));
    object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    assert_eq!(
        decide_kustomization(&object, None, "apps"),
        Decision::Unchanged
    );
}

#[test]
fn an_object_without_a_namespace_or_a_spec_is_refused() {
    let object = kustomization(json!({"kind": "HttpSource", "name": "web"}));
    let Decision::Error { code: 400, message } = decide_kustomization(&object, None, "") else {
        panic!("expected a bad request");
    };
    assert_eq!(message, "the Kustomization has no namespace");
    let Decision::Error { code: 400, message } =
        decide_kustomization(&json!({"metadata": {"name": "app"}}), None, "apps")
    else {
        panic!("expected a bad request");
    };
    assert!(message.ends_with("has no spec"), "{message}");
}

/// `kubectl apply` of a manifest whose reference has no apiVersion, merged
/// over the stored rewrite, keeps openflux's apiVersion beside the custom
/// kind: taken as the original only when a stored rewrite explains it.
#[test]
fn a_flux_api_version_beside_a_custom_kind_needs_a_stored_rewrite_to_explain_it() {
    let original = kustomization(json!({"kind": "HttpSource", "name": "web"}));
    let stored = rewritten(&original, &decide_kustomization(&original, None, "apps"));
    let mut merged =
        kustomization(json!({"apiVersion": FLUX, "kind": "HttpSource", "name": "web"}));
    merged["metadata"] = stored["metadata"].clone();
    let again = rewritten(
        &merged,
        &decide_kustomization(&merged, Some(&stored), "apps"),
    );
    assert_eq!(again, stored);
    let Decision::Deny { message } = decide_kustomization(&merged, None, "apps") else {
        panic!("without a stored rewrite the apiVersion is a mistake");
    };
    assert!(message.contains("leave apiVersion out"), "{message}");
}
