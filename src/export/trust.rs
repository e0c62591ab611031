//! Who may speak for a source: the rule an Artifact must pass before any
//! consumer is pointed at it (docs/security.md).
//!
//! An Artifact names its source in a controller ownerReference. Anyone
//! allowed to create Artifacts in a namespace could write such a reference,
//! so openflux trusts an Artifact for its owner only when
//!
//! 1. the ownerReference's UID is the live source's (Kubernetes' garbage
//!    collector deletes an Artifact whose owner UID does not exist, and the
//!    index matches the UID of every reference), and
//! 2. the identity that last wrote the Artifact's spec may update the
//!    source's status, the right a source's own controller has: openflux's
//!    admission webhook records that identity ([`WRITER_ANNOTATION`], always
//!    overwritten from the request's userInfo, never taken from the object),
//!    and the export controller asks the API server with a
//!    SubjectAccessReview ([`access_review`]) before exporting.
//!
//! Mirrored Artifacts are written by openflux itself for stock sources and
//! need no review. Everything here is pure.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::vocabulary::marks::{ADOPTED_FROM_LABEL, ADOPTED_WRITER_ANNOTATION, WRITER_ANNOTATION};

/// What an export of an Artifact is made of, as paths in the object: the
/// webhook records as writer whoever changes any of them, and keeps the
/// recorded writer on an update that changes none. The spec fields are
/// those of every Artifact API openflux reads (their schemas admit no
/// others); `spec.exportedInputs` is what an ExternalArtifact carries in
/// `status.exportedInputs`, read by the templates of its consumers. A test
/// changes each field of an Artifact in turn and fails when one the export
/// copies is missing here.
pub const EXPORT_INPUTS: [&[&str]; 11] = [
    &["spec", "url"],
    &["spec", "revision"],
    &["spec", "digest"],
    &["spec", "path"],
    &["spec", "size"],
    &["spec", "lastUpdateTime"],
    &["spec", "metadata"],
    &["spec", "exportedInputs"],
    &["metadata", "ownerReferences"],
    &["metadata", "labels", ADOPTED_FROM_LABEL],
    &["metadata", "annotations", ADOPTED_WRITER_ANNOTATION],
];

/// Namespaces the shipped webhook configuration's entry for Artifacts
/// leaves out (its `namespaceSelector`): no writer is recorded there, so an
/// Artifact's writer annotation there is whatever its author claimed.
pub const UNSEEN_NAMESPACES: [&str; 2] = ["kube-system", "openflux-system"];

/// The verdict on an Artifact in a namespace the webhook does not see, if
/// it is one: never trusted from its annotation.
pub fn unseen(namespace: &str) -> Option<Verdict> {
    UNSEEN_NAMESPACES.contains(&namespace).then(|| {
        Verdict::Untrusted(format!(
            "openflux's admission webhook does not see Artifacts in {namespace}, so who wrote this one \
             is not known (its {WRITER_ANNOTATION} annotation says what its author wrote there); \
             publish Artifacts for custom sources in another namespace"
        ))
    })
}

/// The identity of a writer, as the API server authenticated it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

impl Writer {
    /// Reads `request.userInfo` of an AdmissionReview.
    pub fn from_user_info(user_info: &Value) -> Option<Self> {
        let username = user_info.get("username")?.as_str()?.to_string();
        let uid = user_info
            .get("uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let groups = user_info
            .get("groups")
            .and_then(Value::as_array)
            .map(|g| {
                g.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            username,
            uid,
            groups,
        })
    }

    /// The annotation value (compact JSON, fields in a fixed order).
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the annotation value; `None` when absent or malformed (then the
    /// Artifact is not trusted).
    pub fn from_annotation(value: &str) -> Option<Self> {
        serde_json::from_str::<Self>(value)
            .ok()
            .filter(|w| !w.username.is_empty())
    }
}

/// The source an Artifact claims, as the review needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim<'a> {
    pub group: &'a str,
    /// Plural resource name of the source's kind (from discovery).
    pub resource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// The SubjectAccessReview asking whether `writer` may update the status of
/// the claimed source.
pub fn access_review(writer: &Writer, claim: &Claim<'_>) -> Value {
    let mut spec = json!({
        "user": writer.username,
        "groups": writer.groups,
        "resourceAttributes": {
            "group": claim.group,
            "resource": claim.resource,
            "subresource": "status",
            "verb": "update",
            "namespace": claim.namespace,
            "name": claim.name,
        },
    });
    if !writer.uid.is_empty() {
        spec["uid"] = json!(writer.uid);
    }
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": spec,
    })
}

/// The verdict on one Artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Trusted,
    /// Not exported; the message says why and what to do.
    Untrusted(String),
}

/// Reads the answer of a SubjectAccessReview.
pub fn verdict(writer: &Writer, claim: &Claim<'_>, review_status: &Value) -> Verdict {
    if review_status.get("allowed").and_then(Value::as_bool) == Some(true) {
        return Verdict::Trusted;
    }
    Verdict::Untrusted(format!(
        "{} wrote this Artifact but may not update the status of {}/{} {}.{}; only an identity allowed to update the source's status (its controller) may publish Artifacts for it",
        writer.username, claim.namespace, claim.name, claim.resource, claim.group
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unseen_namespaces_are_those_the_shipped_webhook_skips_for_artifacts() {
        use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
        for file in [
            "webhook-config/mutating-webhook.yaml",
            "webhook-config/local/mutating-webhook.yaml",
        ] {
            let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            let config: MutatingWebhookConfiguration = serde_yaml_ng::from_str(&text).unwrap();
            let artifacts = config
                .webhooks
                .unwrap_or_default()
                .into_iter()
                .find(|w| w.name == "artifacts.openflux.dev")
                .unwrap_or_else(|| panic!("{file}: no entry for Artifacts"));
            let expressions = artifacts
                .namespace_selector
                .and_then(|s| s.match_expressions)
                .unwrap_or_default();
            let skipped: Vec<String> = expressions
                .iter()
                .filter(|e| e.key == "kubernetes.io/metadata.name" && e.operator == "NotIn")
                .flat_map(|e| e.values.clone().unwrap_or_default())
                .collect();
            assert_eq!(skipped, UNSEEN_NAMESPACES, "{file}");
            assert_eq!(expressions.len(), 1, "{file}: {expressions:?}");
        }
        assert!(unseen("apps").is_none());
        assert!(matches!(unseen("kube-system"), Some(Verdict::Untrusted(_))));
    }

    /// The admission policy's Flux namespace (whose source-controller may
    /// touch shadows) defaults to openflux's `--flux-namespace`.
    #[test]
    fn the_policy_names_the_flux_namespace_openflux_defaults_to() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            run: crate::runtime::flags::RunArgs,
        }
        let defaults = Cli::parse_from(["openflux"]);
        let path = format!(
            "{}/webhook-config/externalartifact-policy.yaml",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap())
            .collect();
        let policy = docs
            .iter()
            .find(|doc| doc["kind"] == "ValidatingAdmissionPolicy")
            .expect("the policy");
        // First, where docs/install.md's kustomize patch replaces it.
        let variable = &policy["spec"]["variables"][0];
        assert_eq!(variable["name"], json!("fluxNamespace"));
        assert_eq!(
            variable["expression"],
            json!(format!("'{}'", defaults.run.flux_namespace))
        );
        // No parameter: a built-in paramKind stops resolving once its
        // binding is deleted and created again, until the API server
        // restarts.
        assert!(policy["spec"].get("paramKind").is_none(), "{policy}");
        for doc in &docs {
            assert!(doc["spec"].get("paramRef").is_none(), "{doc}");
        }
    }

    /// Every field whose change moves what an export says is in
    /// [`EXPORT_INPUTS`]: each field of an Artifact's spec (read from the
    /// CRD's schema, so a field added there is walked too) and of its
    /// metadata a writer may change is changed on its own, and the export
    /// planned for every target is compared with the one before.
    #[test]
    fn every_field_the_export_copies_is_a_writer_input() {
        use crate::api::Artifact;
        use crate::cluster::target::{OciVersion, Target};
        use crate::export::plan::plan;
        use kube::core::{ApiResource, GroupVersionKind};
        use kube::CustomResourceExt;

        let base = json!({
            "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
            "metadata": {"name": "web", "namespace": "apps", "uid": "a-uid",
                         "creationTimestamp": "2025-01-01T00:00:00Z",
                         "labels": {"team": "a"}, "annotations": {"note": "n"},
                         "ownerReferences": [{"apiVersion": "sources.example.com/v1", "kind": "Web",
                                              "name": "web", "uid": "s-uid", "controller": true}]},
            "spec": {"url": "http://store.example/apps/web/a.tar.gz", "revision": "v1@sha256:ab",
                     "digest": "sha256:ab", "path": "apps/web/a.tar.gz", "size": 10,
                     "lastUpdateTime": "2025-02-01T00:00:00Z", "metadata": {"k": "v"},
                     "exportedInputs": {"env": "dev", "db": {"tier": "gold"}}},
        });
        let exports = |object: &Value| {
            let artifact: Artifact = serde_json::from_value(object.clone()).unwrap();
            let external = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "ExternalArtifact"),
                "externalartifacts",
            );
            let shadow = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "OCIRepository"),
                "ocirepositories",
            );
            [
                (Target::ExternalArtifact, &external, true),
                (Target::ExternalArtifact, &external, false),
                (Target::Shadow(OciVersion::V1), &shadow, true),
            ]
            .map(|(target, resource, served)| plan(&artifact, "web-x", target, resource, served))
        };
        let before = exports(&base);
        assert!(before.iter().all(Result::is_ok), "{before:?}");

        // Each field of the spec, as the CRD's schema names them.
        let crd = serde_json::to_value(Artifact::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let spec_fields = schema["properties"]["spec"]["properties"]
            .as_object()
            .expect("the spec's schema names its fields");
        let mut changes: Vec<(Vec<String>, Value)> = spec_fields
            .iter()
            .map(|(field, schema)| {
                let now = &base["spec"][field];
                let changed = match (schema["type"].as_str(), schema["format"].as_str()) {
                    (Some("integer"), _) => json!(now.as_i64().unwrap_or_default() + 1),
                    (Some("string"), Some("date-time")) => json!("2030-01-01T00:00:00Z"),
                    (Some("string"), _) => json!(format!("{}0", now.as_str().unwrap_or("a"))),
                    (Some("object"), _) => {
                        let mut more = now.clone();
                        more["added"] = json!("x");
                        more
                    }
                    other => {
                        panic!("spec.{field}: a schema type this test does not change: {other:?}")
                    }
                };
                (vec!["spec".to_string(), field.clone()], changed)
            })
            .collect();
        assert!(changes.len() >= 8, "{changes:?}");
        // What a writer may change of the metadata (the API server fixes
        // name, namespace, uid and creationTimestamp).
        let owner = json!([{"apiVersion": "sources.example.com/v1", "kind": "Web",
                            "name": "other", "uid": "s-uid-2", "controller": true}]);
        for (path, value) in [
            (&["metadata", "ownerReferences"][..], owner),
            (&["metadata", "labels"][..], json!({"team": "b"})),
            (&["metadata", "annotations"][..], json!({"note": "m"})),
            (&["metadata", "finalizers"][..], json!(["example.com/keep"])),
        ] {
            changes.push((path.iter().map(|s| s.to_string()).collect(), value));
        }

        let covered = |path: &[String]| {
            EXPORT_INPUTS.iter().any(|input| {
                let n = input.len().min(path.len());
                input[..n].iter().zip(&path[..n]).all(|(a, b)| a == b)
            })
        };
        let mut moved = Vec::new();
        for (path, value) in changes {
            let mut object = base.clone();
            let (last, parents) = path.split_last().unwrap();
            let parent = parents
                .iter()
                .fold(&mut object, |o, key| &mut o[key.as_str()]);
            parent[last.as_str()] = value;
            if exports(&object) != before {
                moved.push(path.join("."));
                assert!(
                    covered(&path),
                    "a change of {} moves the export, but EXPORT_INPUTS does not list it: \
                     whoever changes it must be recorded as the Artifact's writer",
                    path.join(".")
                );
            }
        }
        // The walk saw the fields it should: every spec field and the owner.
        assert_eq!(moved.len(), spec_fields.len() + 1, "{moved:?}");
    }

    #[test]
    fn writers_round_trip_through_the_annotation() {
        let info = json!({"username": "system:serviceaccount:src:ctl", "uid": "u1",
            "groups": ["system:serviceaccounts", "system:authenticated"]});
        let writer = Writer::from_user_info(&info).unwrap();
        let text = writer.to_annotation();
        assert_eq!(Writer::from_annotation(&text), Some(writer));
        assert_eq!(Writer::from_annotation("not json"), None);
        assert_eq!(Writer::from_annotation(r#"{"username":""}"#), None);
        assert_eq!(Writer::from_user_info(&json!({"groups": []})), None);
    }

    #[test]
    fn the_review_asks_for_the_status_of_the_claimed_source() {
        let writer = Writer {
            username: "alice".into(),
            uid: String::new(),
            groups: vec!["devs".into()],
        };
        let claim = Claim {
            group: "sources.openflux.dev",
            resource: "httpsources",
            namespace: "apps",
            name: "web",
        };
        let review = access_review(&writer, &claim);
        let attrs = &review["spec"]["resourceAttributes"];
        assert_eq!(attrs["subresource"], "status");
        assert_eq!(attrs["verb"], "update");
        assert_eq!(attrs["resource"], "httpsources");
        assert_eq!(attrs["namespace"], "apps");
        assert_eq!(review["spec"]["user"], "alice");
        assert_eq!(review["spec"]["groups"], json!(["devs"]));
        assert!(review["spec"].get("uid").is_none());
        assert_eq!(
            verdict(&writer, &claim, &json!({"allowed": true})),
            Verdict::Trusted
        );
        let Verdict::Untrusted(message) = verdict(&writer, &claim, &json!({"allowed": false}))
        else {
            panic!("denied must not be trusted");
        };
        assert!(
            message.contains("alice") && message.contains("apps/web"),
            "{message}"
        );
        assert!(matches!(
            verdict(&writer, &claim, &json!({})),
            Verdict::Untrusted(_)
        ));
    }
}
