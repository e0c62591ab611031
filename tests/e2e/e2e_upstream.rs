//! Upstream drift caught early: the consumer table
//! (`src/vocabulary/consumers.rs`) and the export writer, held to the CRDs
//! Flux serves. The consumers' CRDs are the ones the tests' control plane
//! runs (the newest Flux line the project pins); the exports are also held
//! to Flux 2.10's source CRDs, whose ExternalArtifact has
//! `status.exportedInputs`. A field openflux rewrites or writes that Flux
//! renamed, moved or dropped fails here, not in a user's cluster.

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use openflux::api::{Artifact, ArtifactSpec};
use openflux::cluster::target::{OciVersion, Target};
use openflux::export::plan::{desired_status, plan};
use openflux::export::release::target_resource;
use openflux::vocabulary::consumers::{RefField, RefShape, CONSUMERS};
use openflux_testkit as support;
use serde_json::{json, Value};
use support::operator::{flux_2_10_crds, yaml_documents};
use support::{cluster, Env};

/// The `openAPIV3Schema` of `crd` at `version`.
fn schema<'a>(crd: &'a Value, version: &str) -> &'a Value {
    let name = &crd["metadata"]["name"];
    crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version)
        .map(|v| &v["schema"]["openAPIV3Schema"])
        .unwrap_or_else(|| panic!("CRD {name} serves no version {version}"))
}

/// The schema of the field at `path` (properties, and the items of a list
/// where a step is `[]`), if the schema has it.
fn at<'a>(schema: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(schema, |s, step| match *step {
        "[]" => s.get("items"),
        _ => s.get("properties")?.get(step),
    })
}

/// Whether a value may be written at `path` under `schema`: each step is a
/// property (or a map's entry, or a list's item), or an enclosing field
/// keeps unknown fields.
fn admits(schema: &Value, path: &[String]) -> bool {
    let mut s = schema;
    for step in path {
        if s["x-kubernetes-preserve-unknown-fields"] == true {
            return true;
        }
        let next = match step.as_str() {
            "[]" => s.get("items"),
            _ => s
                .get("properties")
                .and_then(|p| p.get(step))
                .or_else(|| s.get("additionalProperties").filter(|a| a.is_object())),
        };
        match next {
            Some(next) => s = next,
            None => return false,
        }
    }
    true
}

/// The path of every leaf of `value`, a list's items as `[]`.
fn leaves(value: &Value, path: &mut Vec<String>, out: &mut BTreeSet<Vec<String>>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, v) in map {
                path.push(key.clone());
                leaves(v, path, out);
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => {
            path.push("[]".into());
            for v in items {
                leaves(v, path, out);
            }
            path.pop();
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The fields of `written` (an object's spec or status, at `root`) that
/// `schema` does not have.
fn not_admitted(schema: &Value, root: &str, written: &Value) -> Vec<String> {
    let mut paths = BTreeSet::new();
    leaves(written, &mut vec![root.to_string()], &mut paths);
    paths
        .into_iter()
        .filter(|p| !admits(schema, p))
        .map(|p| p.join("."))
        .collect()
}

/// The CRD `name` as the tests' control plane serves it.
async fn served_crd(env: &Env, name: &str) -> Value {
    let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let crd = api
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("CRD {name} on the control plane: {e}"));
    serde_json::to_value(crd).expect("a CRD as JSON")
}

/// The CRD of `file` in a Flux release's CRD directory.
fn release_crd(dir: &Path, file: &str) -> Value {
    yaml_documents(&dir.join(file))
        .into_iter()
        .find(|d| d["kind"] == "CustomResourceDefinition")
        .unwrap_or_else(|| panic!("no CRD in {}", dir.join(file).display()))
}

/// What `field` of `consumer` says against the CRD's schema: the problems
/// found (empty when the table still matches).
fn field_drift(schema: &Value, what: &str, field: &RefField) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(node) = at(schema, field.path) else {
        return vec![format!("{what}: no field {}", field.path.join("."))];
    };
    let reference = match field.shape {
        RefShape::One => node,
        RefShape::ListByKey(key) => {
            let Some(item) = node.get("items") else {
                return vec![format!("{what}: {} is not a list", field.path.join("."))];
            };
            if at(item, &[key]).is_none() {
                problems.push(format!("{what}: the list's items have no key {key}"));
            }
            item
        }
    };
    for required in ["kind", "name"] {
        if at(reference, &[required]).is_none() {
            problems.push(format!("{what}: a reference has no {required}"));
        }
    }
    if at(reference, &["apiVersion"]).is_some() != field.has_api_version {
        problems.push(format!(
            "{what}: the table says has_api_version {}, the CRD says otherwise",
            field.has_api_version
        ));
    }
    let table: BTreeSet<&str> = field.stock_kinds.iter().map(|s| s.kind).collect();
    match at(reference, &["kind"]).and_then(|k| k["enum"].as_array()) {
        Some(kinds) => {
            let served: BTreeSet<&str> = kinds.iter().filter_map(Value::as_str).collect();
            if served != table {
                problems.push(format!(
                    "{what}: the CRD accepts kinds {served:?}, the table lists {table:?}"
                ));
            }
        }
        None => problems.push(format!(
            "{what}: the CRD lists no kinds a reference accepts"
        )),
    }
    problems
}

/// Every Flux consumer in the table (the Pulumi Stack's CRD is the tests'
/// own, so it is not upstream): the field openflux rewrites is where the
/// table says, shaped as it says, and accepts exactly the stock kinds it
/// lists; so does the field it refuses custom sources in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_table_matches_the_served_consumer_crds() {
    let env = cluster().await;
    let mut problems = Vec::new();
    let mut checked = Vec::new();
    for consumer in CONSUMERS.iter().filter(|c| c.group.ends_with(".fluxcd.io")) {
        let name = format!("{}.{}", consumer.resource, consumer.group);
        let crd = served_crd(&env, &name).await;
        let schema = schema(&crd, consumer.version);
        let what = format!("{name}/{}", consumer.version);
        problems.extend(field_drift(schema, &what, &consumer.refs));
        if let Some(forbidden) = &consumer.forbidden {
            problems.extend(field_drift(schema, &what, &forbidden.field));
        }
        checked.push(what);
    }
    assert_eq!(checked.len(), 3, "checked: {checked:?}");
    assert!(problems.is_empty(), "{problems:#?}");
}

/// An Artifact of a custom source with every field the export copies,
/// declared inputs among them.
fn artifact() -> Artifact {
    let mut a = Artifact::new(
        "web",
        ArtifactSpec {
            url: "http://store.example:9090/apps/web/abc.tar.gz".into(),
            revision: "main@sha1:abc".into(),
            digest: Some("sha256:0123".into()),
            path: Some("apps/web/abc.tar.gz".into()),
            size: Some(10),
            last_update_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().expect("a time"),
            )),
            metadata: Some(
                [(
                    "org.opencontainers.image.source".to_string(),
                    "x".to_string(),
                )]
                .into(),
            ),
            exported_inputs: Some(
                [
                    ("tenant".to_string(), json!("a")),
                    ("replicas".to_string(), json!({"min": 1, "max": [2, 3]})),
                ]
                .into(),
            ),
        },
    );
    a.metadata.namespace = Some("apps".into());
    a.metadata.uid = Some("a-uid".into());
    a.metadata.generation = Some(2);
    a.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "sources.example.dev/v1alpha1".into(),
        kind: "WebSource".into(),
        name: "web".into(),
        uid: "s-uid".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    a
}

/// What the export writer writes for `target` (its spec and its status),
/// against `crd`'s schema: the fields it does not have.
fn export_drift(crd: &Value, target: Target, inputs_served: bool) -> Vec<String> {
    let version = target.api_version().rsplit('/').next().unwrap_or("v1");
    let schema = schema(crd, version);
    let artifact = artifact();
    let planned = plan(
        &artifact,
        "web-websource-abc",
        target,
        &target_resource(target),
        inputs_served,
    )
    .unwrap_or_else(|e| panic!("an export plan for {target}: {e}"));
    let status = desired_status(None, &planned, Some(3));
    let mut problems: Vec<String> = Vec::new();
    for (root, written) in [("spec", &planned.object["spec"]), ("status", &status)] {
        for path in not_admitted(schema, root, written) {
            problems.push(format!("{target} at {version}: {path}"));
        }
    }
    if inputs_served && target == Target::ExternalArtifact && status.get("exportedInputs").is_none()
    {
        problems.push("status.exportedInputs not written where the API has it".into());
    }
    problems
}

/// The export writer writes only fields the ExternalArtifact and the
/// shadow OCIRepository have, on the control plane's Flux and on Flux
/// 2.10's, and keeps the producer's inputs in `status.exportedInputs`
/// where the API has that field (2.10's must).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_writer_writes_what_the_served_source_crds_have() {
    let env = cluster().await;
    let newest = flux_2_10_crds().await;
    let crds = [
        (
            "the control plane's".to_string(),
            served_crd(&env, "externalartifacts.source.toolkit.fluxcd.io").await,
            served_crd(&env, "ocirepositories.source.toolkit.fluxcd.io").await,
        ),
        (
            format!("Flux 2.10's ({})", newest.display()),
            release_crd(&newest, "source.toolkit.fluxcd.io_externalartifacts.yaml"),
            release_crd(&newest, "source.toolkit.fluxcd.io_ocirepositories.yaml"),
        ),
    ];
    let mut problems = Vec::new();
    for (i, (whose, external, oci)) in crds.iter().enumerate() {
        let inputs = at(schema(external, "v1"), &["status", "exportedInputs"]).is_some();
        if i == 1 && !inputs {
            problems.push(format!(
                "{whose} ExternalArtifact has no status.exportedInputs"
            ));
        }
        for p in export_drift(external, Target::ExternalArtifact, inputs) {
            problems.push(format!("{whose}: {p}"));
        }
        for p in export_drift(oci, Target::Shadow(OciVersion::V1), inputs) {
            problems.push(format!("{whose}: {p}"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_schema_walk_finds_what_is_missing() {
    let schema = json!({"properties": {
        "spec": {"properties": {"a": {"type": "string"},
                                "list": {"type": "array", "items": {"properties": {"k": {}}}},
                                "map": {"type": "object", "additionalProperties": {"type": "string"}},
                                "free": {"x-kubernetes-preserve-unknown-fields": true}}}}});
    let written = json!({"a": "x", "b": "y", "list": [{"k": 1, "j": 2}], "map": {"any": "v"},
                         "free": {"deep": {"er": 1}}});
    assert_eq!(
        not_admitted(&schema, "spec", &written),
        ["spec.b", "spec.list.[].j"]
    );
}
