//! Tests of [`decide`] on recorded AdmissionReviews (tests/fixtures/admission)
//! and variations of them.

use serde_json::{json, Value};

use super::*;
use crate::api::SOURCE_REF_ANNOTATION;
use crate::cluster::facts::Facts;
use crate::index::OwnerIndex;
use crate::names::identity;
use crate::rewrite::testing::{artifact, facts_with, index_of};
use crate::vocabulary::consumers;
use crate::webhook::review;

const HTTP: &str = "sources.openflux.dev/v1alpha1";
const OTHER: &str = "other.example.com/v1";
const FLUX: &str = "source.toolkit.fluxcd.io/v1";

/// The export of HttpSource `name` (sources.openflux.dev).
fn http(name: &str) -> String {
    identity::source_export_name("sources.openflux.dev", "HttpSource", name)
}

/// The export of Artifact `name` referenced directly.
fn art(name: &str) -> String {
    identity::artifact_export_name(name)
}

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/admission/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn request(review: &Value) -> AdmissionRequest {
    review::parse(&serde_json::to_vec(review).unwrap()).unwrap()
}

/// The cluster every test runs against.
fn index() -> OwnerIndex {
    let artifacts = [
        artifact("apps", "web-latest", Some((HTTP, "HttpSource", "web"))),
        artifact("apps", "chart-latest", Some((HTTP, "HttpSource", "chart"))),
        artifact("apps", "m1", Some((HTTP, "HttpSource", "multi"))),
        artifact("apps", "m2", Some((HTTP, "HttpSource", "multi"))),
        artifact("apps", "dup-a", Some((HTTP, "HttpSource", "dup"))),
        artifact("apps", "dup-b", Some((OTHER, "HttpSource", "dup"))),
        artifact("apps", "loose", None),
        artifact(
            "apps",
            "gitrepository-podinfo",
            Some((FLUX, "GitRepository", "podinfo")),
        ),
        artifact(
            "apps",
            "helmchart-podinfo",
            Some((FLUX, "HelmChart", "podinfo")),
        ),
        artifact(
            "infra",
            "shared-latest",
            Some((HTTP, "HttpSource", "shared")),
        ),
    ];
    index_of(&artifacts)
}

fn opts() -> Options {
    Options::default()
}

fn facts() -> Facts {
    facts_with(crate::cluster::target::Target::ExternalArtifact)
}

/// `decide` against `index` and [`facts`].
fn decide_with(request: &AdmissionRequest, index: &OwnerIndex, options: &Options) -> Decision {
    let facts = facts();
    decide(
        request,
        View {
            index,
            facts: &facts,
            policies: &crate::policy::NONE,
        },
        options,
    )
}

fn decide_review(review: &Value) -> Decision {
    decide_with(&request(review), &index(), &opts())
}

/// The object the API server stores after `decision`.
fn apply(object: &Value, decision: &Decision) -> Value {
    let mut out = object.clone();
    match decision {
        Decision::Unchanged => {}
        Decision::Rewrite { patch, .. } => json_patch::patch(&mut out, patch).unwrap(),
        other => panic!("not admitted: {other:?}"),
    }
    out
}

fn object_of(review: &Value) -> Value {
    review["request"]["object"].clone()
}

fn with_ref(mut review: Value, pointer: &str, r: Value) -> Value {
    *review["request"]["object"].pointer_mut(pointer).unwrap() = r;
    review
}

fn kustomization(r: Value) -> Value {
    with_ref(fixture("kustomization-create-custom"), "/spec/sourceRef", r)
}

fn annotation(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][SOURCE_REF_ANNOTATION].as_str()
}

fn warnings(decision: &Decision) -> Vec<String> {
    match decision {
        Decision::Rewrite { warnings, .. } => warnings.clone(),
        _ => Vec::new(),
    }
}

fn denial(decision: &Decision) -> &str {
    match decision {
        Decision::Deny { message } | Decision::NotServed { message } => message,
        other => panic!("not denied: {other:?}"),
    }
}

/// An UPDATE of `stored` to `incoming`.
fn update(create: &Value, stored: &Value, incoming: &Value) -> Value {
    let mut review = create.clone();
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = stored.clone();
    review["request"]["object"] = incoming.clone();
    review
}

fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Asserts the rewrite is idempotent: the stored object is left alone, and
/// the original applied again over it (plain, as a JSON merge patch with
/// `kubectl apply`, and by server-side apply dropping the fields only the
/// webhook set) ends as the stored object, byte for byte.
fn assert_idempotent(create: &Value) -> Value {
    let original = object_of(create);
    let stored = apply(&original, &decide_review(create));

    let again = decide_review(&update(create, &stored, &stored));
    assert_eq!(
        again,
        Decision::Unchanged,
        "the stored object maps to itself"
    );

    // PUT of the original manifest.
    let put = update(create, &stored, &original);
    let after_put = apply(&original, &decide_review(&put));
    // Objects compare as JSON values, which serialize with sorted keys: equal
    // values are byte-identical objects.
    assert_eq!(after_put, stored, "the original sent again");

    // kubectl apply: the manifest merged over what is stored (a JSON merge
    // patch; nulls in the manifest would delete, kubectl sends none).
    let mut merged = stored.clone();
    json_patch::merge(&mut merged, &without_nulls(&original));
    let after_apply = apply(&merged, &decide_review(&update(create, &stored, &merged)));
    assert_eq!(after_apply, stored, "kubectl apply of the original");

    // Server-side apply: fields the applier no longer sends are removed,
    // including the annotation the webhook added on its behalf.
    let mut ssa = original.clone();
    if let Some(a) = ssa["metadata"]["annotations"].as_object_mut() {
        a.remove(SOURCE_REF_ANNOTATION);
    }
    let after_ssa = apply(&ssa, &decide_review(&update(create, &stored, &ssa)));
    assert_eq!(after_ssa, stored, "server-side apply of the original");

    // Dry-run is decided the same way.
    let mut dry = create.clone();
    dry["request"]["dryRun"] = json!(true);
    assert_eq!(decide_review(&dry), decide_review(create));
    stored
}

#[test]
fn stock_references_are_never_changed() {
    assert_eq!(
        decide_review(&fixture("kustomization-create-stock")),
        Decision::Unchanged
    );
    for r in [
        json!({"kind": "GitRepository", "name": "podinfo"}),
        json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository", "name": "x"}),
        json!({"apiVersion": "source.toolkit.fluxcd.io/v1beta2", "kind": "Bucket", "name": "x"}),
        json!({"apiVersion": FLUX, "kind": "ExternalArtifact", "name": "x", "namespace": "other"}),
    ] {
        assert_eq!(
            decide_review(&kustomization(r.clone())),
            Decision::Unchanged,
            "{r}"
        );
    }
}

#[test]
fn custom_reference_by_api_version_is_rewritten() {
    let review = fixture("kustomization-create-custom");
    let decision = decide_review(&review);
    let Decision::Rewrite { patch, warnings } = &decision else {
        panic!("{decision:?}");
    };
    assert!(warnings.is_empty());
    assert_eq!(
        serde_json::to_value(patch).unwrap(),
        json!([
            {"op": "replace", "path": "/spec/sourceRef",
             "value": {"apiVersion": FLUX, "kind": "ExternalArtifact", "name": http("web")}},
            {"op": "add", "path": "/metadata/annotations/openflux.dev~1source-ref",
             "value": r#"{"apiVersion":"sources.openflux.dev/v1alpha1","kind":"HttpSource","name":"web"}"#}
        ])
    );
    let stored = assert_idempotent(&review);
    // Everything else is as the person wrote it.
    let original = object_of(&review);
    assert_eq!(stored["spec"]["path"], original["spec"]["path"]);
    assert_eq!(
        stored["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
        original["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    );
}

#[test]
fn custom_reference_by_kind_only_is_rewritten_and_gets_annotations() {
    let mut review = kustomization(json!({"kind": "HttpSource", "name": "web"}));
    review["request"]["object"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    let decision = decide_review(&review);
    let Decision::Rewrite { patch, .. } = &decision else {
        panic!("{decision:?}");
    };
    assert_eq!(
        serde_json::to_value(&patch.0[1]).unwrap(),
        json!({"op": "add", "path": "/metadata/annotations",
               "value": {"openflux.dev/source-ref": r#"{"kind":"HttpSource","name":"web"}"#}})
    );
    let stored = apply(&object_of(&review), &decision);
    // No apiVersion was written, yet the rewrite sets the export's.
    assert_eq!(
        stored["spec"]["sourceRef"],
        json!({"apiVersion": FLUX, "kind": "ExternalArtifact", "name": http("web")})
    );
    assert_idempotent(&review);
}

#[test]
fn kubectl_apply_again_keeps_the_stored_object() {
    // Recorded: the original (kind only) merged over the rewritten object
    // keeps the apiVersion openflux wrote.
    let review = fixture("kustomization-update-apply-again");
    let decision = decide_review(&review);
    let after = apply(&object_of(&review), &decision);
    assert_eq!(after, review["request"]["oldObject"]);
    // The same leftover on a CREATE is a mistake, said so.
    let mut create = review.clone();
    create["request"]["operation"] = json!("CREATE");
    create["request"]["oldObject"] = Value::Null;
    let message = denial(&decide_review(&create)).to_string();
    assert!(message.contains("source.toolkit.fluxcd.io"), "{message}");
    assert!(message.contains("leave apiVersion out"), "{message}");
}

#[test]
fn namespace_is_kept_only_when_written() {
    let review =
        kustomization(json!({"kind": "HttpSource", "name": "shared", "namespace": "infra"}));
    let stored = apply(&object_of(&review), &decide_review(&review));
    assert_eq!(
        stored["spec"]["sourceRef"],
        json!({"apiVersion": FLUX, "kind": "ExternalArtifact", "name": http("shared"), "namespace": "infra"})
    );
    assert_eq!(
        annotation(&stored),
        Some(r#"{"kind":"HttpSource","name":"shared","namespace":"infra"}"#)
    );
    assert_idempotent(&review);
}

#[test]
fn cross_namespace_references_are_denied_with_the_flag() {
    let review =
        kustomization(json!({"kind": "HttpSource", "name": "shared", "namespace": "infra"}));
    let options = Options {
        no_cross_namespace_refs: true,
    };
    let decision = decide_with(&request(&review), &index(), &options);
    let message = denial(&decision);
    assert!(message.starts_with("openflux: "), "{message}");
    assert!(message.contains("--no-cross-namespace-refs"), "{message}");
    assert!(message.contains("infra/shared"), "{message}");
    // The object's own namespace, spelled out, is fine.
    let same = kustomization(json!({"kind": "HttpSource", "name": "web", "namespace": "apps"}));
    assert!(matches!(
        decide_with(&request(&same), &index(), &options),
        Decision::Rewrite { .. }
    ));
    // Stock references are Flux's business.
    let stock = kustomization(json!({"kind": "GitRepository", "name": "x", "namespace": "infra"}));
    assert_eq!(
        decide_with(&request(&stock), &index(), &options),
        Decision::Unchanged
    );
}

#[test]
fn missing_source_is_admitted_with_a_warning() {
    let review = kustomization(json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "later"}));
    let decision = decide_review(&review);
    assert_eq!(
        warnings(&decision),
        vec![format!("HttpSource apps/later has no Artifact yet; Flux will wait until openflux exports it as apps/{}", http("later"))]
    );
    let stored = apply(&object_of(&review), &decision);
    assert_eq!(stored["spec"]["sourceRef"]["name"], http("later"));
    // Once the source has its Artifact, the same manifest maps to the same object.
    let mut idx = index();
    idx.apply(&artifact(
        "apps",
        "later-1",
        Some((HTTP, "HttpSource", "later")),
    ));
    let put = update(&review, &stored, &object_of(&review));
    let after = apply(
        &object_of(&review),
        &decide_with(&request(&put), &idx, &opts()),
    );
    assert_eq!(after, stored);
}

#[test]
fn ambiguous_kind_is_denied_with_the_candidates() {
    let review = kustomization(json!({"kind": "HttpSource", "name": "dup"}));
    let message = denial(&decide_review(&review)).to_string();
    assert!(message.starts_with("openflux: "), "{message}");
    assert!(
        message.contains("HttpSource.other.example.com, HttpSource.sources.openflux.dev"),
        "{message}"
    );
    // API groups only: no Artifact of either source is named.
    assert!(
        !message.contains("dup-a") && !message.contains("dup-b"),
        "{message}"
    );
    assert!(message.contains("set apiVersion"), "{message}");
    // With apiVersion it resolves.
    let review = kustomization(json!({"apiVersion": OTHER, "kind": "HttpSource", "name": "dup"}));
    assert!(matches!(decide_review(&review), Decision::Rewrite { .. }));
}

#[test]
fn a_source_with_several_artifacts_gets_its_one_stable_export() {
    let review = kustomization(json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "multi"}));
    let before = apply(&object_of(&review), &decide_review(&review));
    assert_eq!(before["spec"]["sourceRef"]["name"], http("multi"));
    // A third Artifact changes nothing for the consumer.
    let mut idx = index();
    idx.apply(&artifact("apps", "m0", Some((HTTP, "HttpSource", "multi"))));
    let after = apply(
        &object_of(&review),
        &decide_with(&request(&review), &idx, &opts()),
    );
    assert_eq!(after, before);
}

#[test]
fn the_target_kind_follows_the_facts() {
    use crate::cluster::target::{OciVersion, Target};
    let review = kustomization(json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "web"}));
    let facts = facts_with(Target::Shadow(OciVersion::V1beta2));
    let index = index();
    let view = View {
        index: &index,
        facts: &facts,
        policies: &crate::policy::NONE,
    };
    let stored = apply(
        &object_of(&review),
        &decide(&request(&review), view, &opts()),
    );
    assert_eq!(
        stored["spec"]["sourceRef"],
        json!({"apiVersion": "source.toolkit.fluxcd.io/v1beta2", "kind": "OCIRepository", "name": http("web")})
    );
    // No target for the consumer: denied, saying why.
    let mut none = facts.clone();
    none.choices.insert(
        "Kustomization",
        Err(crate::cluster::target::NoTarget("no Flux here".into())),
    );
    let view = View {
        index: &index,
        facts: &none,
        policies: &crate::policy::NONE,
    };
    let message = denial(&decide(&request(&review), view, &opts())).to_string();
    assert!(message.contains("no Flux here"), "{message}");
}

#[test]
fn an_unserved_kind_is_denied_with_or_without_api_version() {
    let review = kustomization(json!({"kind": "Gadget", "name": "g"}));
    let message = denial(&decide_review(&review)).to_string();
    assert!(
        message.contains("no API of this cluster serves"),
        "{message}"
    );
    // With apiVersion: a kind no API serves in that group is denied too,
    // naming the kind, the group and the served kind meant.
    let review = kustomization(json!({"apiVersion": HTTP, "kind": "Htpsource", "name": "web"}));
    let message = denial(&decide_review(&review)).to_string();
    for part in [
        "kind Htpsource of API group sources.openflux.dev",
        "no API of this cluster serves",
        "the closest served: HttpSource.sources.openflux.dev",
    ] {
        assert!(message.contains(part), "{message}");
    }
    let review = kustomization(
        json!({"apiVersion": "widgets.example.com/v1", "kind": "Widgets", "name": "w"}),
    );
    let message = denial(&decide_review(&review)).to_string();
    assert!(
        message.contains("the closest served: Widget.widgets.example.com"),
        "{message}"
    );
    // A group no API serves yet (its CRD not installed): rewritten, with
    // the warning that Flux waits for the export.
    let review =
        kustomization(json!({"apiVersion": "elsewhere.example/v1", "kind": "Widget", "name": "w"}));
    assert_eq!(warnings(&decide_review(&review)).len(), 1);
    // Served in one group: resolved through it before any Artifact exists.
    let review = kustomization(json!({"kind": "Widget", "name": "w"}));
    let stored = apply(&object_of(&review), &decide_review(&review));
    assert_eq!(
        stored["spec"]["sourceRef"]["name"],
        identity::source_export_name("widgets.example.com", "Widget", "w")
    );
}

#[test]
fn artifact_references_point_at_what_the_artifact_is_consumed_through() {
    let cases = [
        // Owned by a custom source, its only Artifact: the source's export.
        (
            json!({"apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact", "name": "web-latest"}),
            json!({"apiVersion": FLUX, "kind": "ExternalArtifact", "name": http("web")}),
        ),
        // Not its source's default (m1 is): exported under its own name.
        (
            json!({"kind": "Artifact", "name": "m2"}),
            json!({"apiVersion": FLUX, "kind": "ExternalArtifact", "name": art("m2")}),
        ),
        // Standalone.
        (
            json!({"kind": "Artifact", "name": "loose"}),
            json!({"apiVersion": FLUX, "kind": "ExternalArtifact", "name": art("loose")}),
        ),
        // Mirrored from a stock source: that source itself.
        (
            json!({"kind": "Artifact", "name": "gitrepository-podinfo"}),
            json!({"apiVersion": FLUX, "kind": "GitRepository", "name": "podinfo"}),
        ),
    ];
    for (r, expected) in cases {
        let review = kustomization(r.clone());
        let decision = decide_review(&review);
        assert!(warnings(&decision).is_empty(), "{r}");
        let stored = apply(&object_of(&review), &decision);
        assert_eq!(stored["spec"]["sourceRef"], expected, "{r}");
        assert_idempotent(&review);
    }
    // An Artifact of some other API is a custom source kind.
    let review = kustomization(json!({"apiVersion": OTHER, "kind": "Artifact", "name": "x"}));
    assert_eq!(
        apply(&object_of(&review), &decide_review(&review))["spec"]["sourceRef"]["name"],
        identity::source_export_name("other.example.com", "Artifact", "x")
    );
}

#[test]
fn missing_artifact_is_admitted_with_a_warning() {
    let review = kustomization(json!({"kind": "Artifact", "name": "soon"}));
    assert_eq!(
        warnings(&decide_review(&review)),
        vec![format!("Artifact apps/soon does not exist yet; Flux will wait until openflux exports it as apps/{}", art("soon"))]
    );
}

#[test]
fn an_artifact_of_a_kind_the_consumer_cannot_take_is_denied() {
    let review = kustomization(json!({"kind": "Artifact", "name": "helmchart-podinfo"}));
    let message = denial(&decide_review(&review)).to_string();
    assert!(message.contains("HelmChart apps/podinfo"), "{message}");
    assert!(
        message.contains("GitRepository, OCIRepository, Bucket, ExternalArtifact"),
        "{message}"
    );
    // A HelmRelease takes it through chartRef.
    let review = with_ref(
        fixture("helmrelease-create-chartref"),
        "/spec/chartRef",
        json!({"kind": "Artifact", "name": "helmchart-podinfo"}),
    );
    let stored = apply(&object_of(&review), &decide_review(&review));
    assert_eq!(
        stored["spec"]["chartRef"],
        json!({"apiVersion": FLUX, "kind": "HelmChart", "name": "podinfo"})
    );
}

#[test]
fn helmrelease_chart_ref_to_a_custom_source_is_rewritten() {
    let review = fixture("helmrelease-create-chartref");
    let stored = apply(&object_of(&review), &decide_review(&review));
    assert_eq!(
        stored["spec"]["chartRef"],
        json!({"apiVersion": FLUX, "kind": "ExternalArtifact", "name": http("chart")})
    );
    assert_eq!(stored["spec"]["values"], json!({"replicaCount": 2}));
    assert_idempotent(&review);
}

#[test]
fn helmrelease_chart_template_with_a_custom_source_is_denied() {
    let review = fixture("helmrelease-create-chart-template");
    let message = denial(&decide_review(&review)).to_string();
    assert!(
        message.starts_with("openflux: HelmRelease apps/templated"),
        "{message}"
    );
    assert!(message.contains("spec.chart.spec.sourceRef"), "{message}");
    assert!(message.contains("spec.chartRef"), "{message}");
    // A stock chart template is Flux's as usual.
    let review = with_ref(
        review,
        "/spec/chart/spec/sourceRef",
        json!({"kind": "HelmRepository", "name": "podinfo"}),
    );
    assert_eq!(decide_review(&review), Decision::Unchanged);
}

#[test]
fn artifact_generator_sources_are_rewritten_one_by_one() {
    let review = fixture("artifactgenerator-create-mixed");
    let decision = decide_review(&review);
    let Decision::Rewrite { patch, .. } = &decision else {
        panic!("{decision:?}");
    };
    let paths: Vec<String> = patch.0.iter().map(|op| op.path().to_string()).collect();
    assert_eq!(
        paths,
        vec![
            "/spec/sources/1",
            "/spec/sources/2",
            "/metadata/annotations"
        ]
    );
    let stored = apply(&object_of(&review), &decision);
    assert_eq!(
        stored["spec"]["sources"],
        json!([
            {"alias": "git", "kind": "GitRepository", "name": "podinfo"},
            {"alias": "web", "kind": "ExternalArtifact", "name": http("web")},
            {"alias": "loose", "kind": "ExternalArtifact", "name": art("loose")}
        ]),
        "no apiVersion: the ArtifactGenerator source reference has none"
    );
    // source-watcher's schema: `^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`, at most
    // 253 characters.
    for source in stored["spec"]["sources"].as_array().unwrap() {
        let name = source["name"].as_str().unwrap();
        let label = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        assert!(name.len() <= 253, "{name}");
        assert!(name.starts_with(label) && name.ends_with(label), "{name}");
        assert!(name.chars().all(|c| label(c) || c == '-'), "{name}");
    }
    assert_eq!(
        annotation(&stored),
        Some(
            r#"{"loose":{"kind":"Artifact","name":"loose"},"web":{"kind":"HttpSource","name":"web"}}"#
        )
    );
    assert_idempotent(&review);

    // A custom source added to a rewritten object: earlier entries stay recorded.
    let mut edited = stored.clone();
    edited["spec"]["sources"]
        .as_array_mut()
        .unwrap()
        .push(json!({"alias": "chart", "kind": "HttpSource", "name": "chart"}));
    let after = apply(&edited, &decide_review(&update(&review, &stored, &edited)));
    assert_eq!(
        annotation(&after),
        Some(
            r#"{"chart":{"kind":"HttpSource","name":"chart"},"loose":{"kind":"Artifact","name":"loose"},"web":{"kind":"HttpSource","name":"web"}}"#
        )
    );
}

#[test]
fn already_rewritten_objects_are_left_alone() {
    let stored = apply(
        &object_of(&fixture("kustomization-create-custom")),
        &decide_review(&fixture("kustomization-create-custom")),
    );
    let mut review = fixture("kustomization-create-custom");
    review["request"]["object"] = stored;
    assert_eq!(decide_review(&review), Decision::Unchanged);
}

#[test]
fn nothing_to_do_for_deletes_connects_subresources_and_objects_being_deleted() {
    assert_eq!(
        decide_review(&fixture("kustomization-delete")),
        Decision::Unchanged
    );
    let mut connect = fixture("kustomization-create-custom");
    connect["request"]["operation"] = json!("CONNECT");
    assert_eq!(decide_review(&connect), Decision::Unchanged);
    let mut status = fixture("kustomization-create-custom");
    status["request"]["subResource"] = json!("status");
    assert_eq!(decide_review(&status), Decision::Unchanged);
    let mut deleting = fixture("kustomization-create-custom");
    deleting["request"]["object"]["metadata"]["deletionTimestamp"] = json!("2025-11-03T10:00:00Z");
    assert_eq!(decide_review(&deleting), Decision::Unchanged);
    // A HelmRelease without chartRef.
    let review = with_ref(
        fixture("helmrelease-create-chart-template"),
        "/spec/chart/spec/sourceRef",
        json!({"kind": "HelmRepository", "name": "podinfo"}),
    );
    assert_eq!(decide_review(&review), Decision::Unchanged);
}

#[test]
fn unsynced_index_answers_service_unavailable() {
    let review = fixture("kustomization-create-custom");
    let decision = decide_with(&request(&review), &OwnerIndex::new(), &opts());
    assert!(
        matches!(&decision, Decision::Error { code: 503, message } if message.contains("retry")),
        "{decision:?}"
    );
    // Stock references do not need the index.
    let stock = fixture("kustomization-create-stock");
    assert_eq!(
        decide_with(&request(&stock), &OwnerIndex::new(), &opts()),
        Decision::Unchanged
    );
}

fn bad_request(review: &Value) -> String {
    match decide_review(review) {
        Decision::Error { code: 400, message } => message,
        other => panic!("not a bad request: {other:?}"),
    }
}

#[test]
fn malformed_objects_are_bad_requests() {
    let base = fixture("kustomization-create-custom");

    let mut pods = base.clone();
    pods["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
    assert!(bad_request(&pods).contains("does not handle resource pods"));

    let mut no_object = base.clone();
    no_object["request"]["object"] = Value::Null;
    assert!(bad_request(&no_object).contains("no object"));

    let mut no_spec = base.clone();
    no_spec["request"]["object"]
        .as_object_mut()
        .unwrap()
        .remove("spec");
    assert_eq!(bad_request(&no_spec), "Kustomization apps/web has no spec");

    let mut no_namespace = base.clone();
    no_namespace["request"]["namespace"] = Value::Null;
    no_namespace["request"]["object"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    assert!(bad_request(&no_namespace).contains("no namespace"));

    let not_object = with_ref(base.clone(), "/spec/sourceRef", json!("HttpSource/web"));
    assert!(bad_request(&not_object).contains("spec.sourceRef is not an object"));

    let no_kind = with_ref(base.clone(), "/spec/sourceRef", json!({"name": "web"}));
    assert_eq!(
        bad_request(&no_kind),
        "Kustomization apps/web: spec.sourceRef.kind is not set"
    );

    let number = with_ref(
        base.clone(),
        "/spec/sourceRef",
        json!({"kind": "HttpSource", "name": 7}),
    );
    assert!(bad_request(&number).contains("name is not a string"));

    let ag = fixture("artifactgenerator-create-mixed");
    let no_alias = with_ref(
        ag.clone(),
        "/spec/sources/1",
        json!({"kind": "HttpSource", "name": "web"}),
    );
    assert!(bad_request(&no_alias).contains("spec.sources[1] has no alias"));
    let not_list = with_ref(ag, "/spec/sources", json!({"web": {}}));
    assert!(bad_request(&not_list).contains("not a list"));
}

#[test]
fn the_annotation_key_is_escaped_in_patches() {
    let review = fixture("kustomization-create-custom");
    let Decision::Rewrite { patch, .. } = decide_review(&review) else {
        panic!()
    };
    let text = serde_json::to_string(&patch).unwrap();
    assert!(
        text.contains("/metadata/annotations/openflux.dev~1source-ref"),
        "{text}"
    );
}

/// The table of source references shared with the webhook configuration's
/// end-to-end test (`e2e_policy`): openflux acts on exactly the references
/// the table sends it, and leaves every other one as it is.
#[test]
fn the_decision_follows_the_table_of_source_references() {
    let mut index = OwnerIndex::new();
    index.reset([]);
    for case in openflux_testkit::references::source_reference_cases() {
        let consumer = consumers::CONSUMERS
            .iter()
            .find(|c| c.kind == case.consumer)
            .unwrap_or_else(|| panic!("{case}: not a consumer"));
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"group": consumer.group, "version": consumer.version, "kind": consumer.kind},
                "resource": {"group": consumer.group, "version": consumer.version, "resource": consumer.resource},
                "namespace": "apps", "name": "case", "operation": "CREATE",
                "userInfo": {"username": "someone"},
                "object": case.object("apps", "case"),
            }
        });
        let decision = decide_with(&request(&review), &index, &opts());
        assert_eq!(
            !matches!(decision, Decision::Unchanged),
            case.openflux,
            "{case}: {decision:?}"
        );
    }
}
