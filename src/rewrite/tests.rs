//! Tests of [`decide`] on consumer objects, without an admission request.
//! The webhook's adapter is tested on recorded AdmissionReviews
//! (`rewrite::mutate`), the re-pointer on its own table
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

/// Every field of a reference is held to its Kubernetes length before any
/// other work, and the refusal names the field without echoing the value:
/// at the limit a field passes, one past it is refused, and so is a value
/// of megabytes.
#[test]
fn references_over_the_kubernetes_limits_are_refused_before_any_other_work() {
    use super::refs::{MAX_GROUP, MAX_KIND, MAX_NAME, MAX_NAMESPACE, MAX_VERSION};
    let kind = |n: usize| format!("H{}", "q".repeat(n - 1));
    let label = |n: usize| format!("a{}", "b".repeat(n - 1));
    let group = |n: usize| {
        // Labels of 50 joined by '.', cut to n.
        let long = vec!["x".repeat(49); n / 50 + 1].join(".");
        let mut g = long[..n].to_string();
        if g.ends_with('.') {
            g.replace_range(n - 1.., "y");
        }
        g
    };
    /// A field, a reference whose field has `n` bytes, the field's limit.
    type Case = (&'static str, Box<dyn Fn(usize) -> Value>, usize);
    let cases: Vec<Case> = vec![
        (
            "kind",
            Box::new(move |n| json!({"apiVersion": HTTP, "kind": kind(n), "name": "web"})),
            MAX_KIND,
        ),
        (
            "name",
            Box::new(move |n| json!({"apiVersion": HTTP, "kind": "HttpSource", "name": label(n)})),
            MAX_NAME,
        ),
        (
            "namespace",
            Box::new(
                move |n| json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "web", "namespace": label(n)}),
            ),
            MAX_NAMESPACE,
        ),
        (
            "apiVersion",
            Box::new(
                move |n| json!({"apiVersion": format!("{}/v1", group(n)), "kind": "HttpSource", "name": "web"}),
            ),
            MAX_GROUP,
        ),
        (
            "apiVersion",
            Box::new(
                move |n| json!({"apiVersion": format!("sources.openflux.dev/{}", label(n)), "kind": "HttpSource", "name": "web"}),
            ),
            MAX_VERSION,
        ),
    ];
    for (field, reference, max) in &cases {
        for n in [*max, max + 1, 3 << 20] {
            let object = kustomization(reference(n));
            let decision = decide_kustomization(&object, None, "apps");
            let refused = matches!(&decision, Decision::Error { code: 400, message }
                if message.contains(&format!("spec.sourceRef.{field} is {n} bytes long")) && message.len() < 400);
            assert_eq!(
                refused,
                n > *max,
                "{field} of {n} bytes: {:.300}",
                format!("{decision:?}")
            );
        }
    }
}

/// A custom reference must be spelled as Kubernetes spells kinds, groups,
/// versions, names and namespaces; a stock one is Flux's to judge.
#[test]
fn custom_references_must_be_well_formed() {
    for (reference, field) in [
        (
            json!({"apiVersion": HTTP, "kind": "Http Source", "name": "web"}),
            "kind",
        ),
        (
            json!({"apiVersion": HTTP, "kind": "1HttpSource", "name": "web"}),
            "kind",
        ),
        (
            json!({"apiVersion": "Sources.Example/v1", "kind": "HttpSource", "name": "web"}),
            "apiVersion",
        ),
        (
            json!({"apiVersion": "sources.example.com/V1", "kind": "HttpSource", "name": "web"}),
            "apiVersion",
        ),
        (
            json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "Web"}),
            "name",
        ),
        (
            json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "web", "namespace": "a.b"}),
            "namespace",
        ),
    ] {
        let decision = decide_kustomization(&kustomization(reference.clone()), None, "apps");
        assert!(
            matches!(&decision, Decision::Error { code: 400, message } if message.contains(&format!("spec.sourceRef.{field} "))),
            "{reference}: {decision:?}"
        );
    }
    // A name of 253 characters with no dot is a valid object name.
    let long = json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "w".repeat(253)});
    assert!(
        !matches!(
            decide_kustomization(&kustomization(long), None, "apps"),
            Decision::Error { .. }
        ),
        "a 253-character name"
    );
    let stock = json!({"apiVersion": FLUX, "kind": "GitRepository", "name": "Not_A_Name"});
    assert_eq!(
        decide_kustomization(&kustomization(stock), None, "apps"),
        Decision::Unchanged
    );
}
