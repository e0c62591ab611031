//! What the export controller decides: the object an Artifact is exported
//! as, whether the exported object already says it, the status it should
//! carry, and whether its name is taken. Plain functions from data to data.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::core::{ApiResource, DynamicObject};
use kube::ResourceExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{
    conditions, reason, Artifact, API_VERSION, ARTIFACT_LABEL, KIND, MANAGED_BY, MANAGED_BY_LABEL,
    READY,
};
use crate::cluster::target::Target;
use crate::export::shadow;
use crate::names;
use crate::vocabulary::marks::SHADOW_LABEL;

/// The object an Artifact is exported as, and its status.
#[derive(Debug, PartialEq)]
pub struct ExportPlan {
    /// apiVersion, kind, metadata and spec, for a server-side apply.
    pub object: Value,
    /// `status.artifact` of the exported object.
    pub artifact: Value,
    /// Message of the exported object's `Ready` condition.
    pub message: String,
    /// Whether the object is a shadow, whose status also carries
    /// `observedGeneration` (helm-controller requires it).
    pub shadow: bool,
    /// The `reconcile.fluxcd.io/requestedAt` a person set on a shadow, which
    /// openflux handed to the custom source: its status says it was handled
    /// (`lastHandledReconcileAt`), as Flux's own sources do.
    pub handled: Option<String>,
    /// The producer's inputs, for `status.exportedInputs` of an
    /// ExternalArtifact whose API has that field.
    pub inputs: Option<Value>,
}

/// The annotation Flux's tools set to ask for a reconcile.
pub const REQUESTED_AT: &str = "reconcile.fluxcd.io/requestedAt";

/// The reconcile request on an exported object, if any.
pub fn requested_at(object: &DynamicObject) -> Option<&str> {
    object
        .metadata
        .annotations
        .as_ref()?
        .get(REQUESTED_AT)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// Decides what `artifact` is exported as; `Err` says, for a person, why it
/// cannot be exported. `inputs_served`: whether the cluster's
/// ExternalArtifact API has `status.exportedInputs`. Pure.
pub fn plan(
    artifact: &Artifact,
    export_name: &str,
    target: Target,
    resource: &ApiResource,
    inputs_served: bool,
) -> Result<ExportPlan, String> {
    let name = artifact.name_any();
    let namespace = artifact.namespace().unwrap_or_default();
    let spec = &artifact.spec;
    if !(spec.url.starts_with("http://") || spec.url.starts_with("https://")) {
        return Err(format!(
            "spec.url {:?} is not an http:// or https:// address; Flux consumers download artifacts over HTTP",
            spec.url
        ));
    }
    let Some(digest) = spec.digest.clone() else {
        return Err("spec.digest is missing; Flux consumers verify every download against it, set it to sha256:<hex of the file at spec.url>".to_string());
    };
    let uid = artifact
        .uid()
        .ok_or_else(|| "the Artifact has no uid yet".to_string())?;
    let source_ref = match artifact.controller_owner() {
        Some(o) => json!({
            "apiVersion": o.api_version,
            "kind": o.kind,
            "name": o.name,
            "namespace": namespace,
        }),
        None => json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": name,
            "namespace": namespace,
        }),
    };
    let mut labels = json!({
        MANAGED_BY_LABEL: MANAGED_BY,
        ARTIFACT_LABEL: names::label_value(&name),
    });
    if target.is_shadow() {
        labels[SHADOW_LABEL] = json!("true");
    }
    let origin = format!(
        "{}.{}/{namespace}/{}",
        source_ref["kind"].as_str().unwrap_or_default(),
        crate::api::split_api_version(source_ref["apiVersion"].as_str().unwrap_or_default()).0,
        source_ref["name"].as_str().unwrap_or_default()
    );
    let object_spec = match target {
        Target::ExternalArtifact => json!({ "sourceRef": source_ref }),
        Target::Shadow(_) => shadow::spec(&namespace, export_name),
    };
    let object = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {
            "name": export_name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": name,
                "uid": uid,
                "controller": true,
            }],
        },
        "spec": object_spec,
    });
    let last_update = spec
        .last_update_time
        .clone()
        .or_else(|| artifact.metadata.creation_timestamp.clone())
        .unwrap_or(Time(Timestamp::UNIX_EPOCH));
    let (revision, path) = match target {
        Target::ExternalArtifact => (
            shadow::content_revision(&spec.revision, &digest),
            spec.path
                .clone()
                .unwrap_or_else(|| path_from_url(&spec.url, &name)),
        ),
        Target::Shadow(_) => (
            shadow::revision(&spec.revision, &digest),
            shadow::path(&namespace, export_name, &digest),
        ),
    };
    let mut exported = json!({
        "url": spec.url,
        "revision": revision,
        "digest": digest,
        "path": path,
        "lastUpdateTime": last_update,
    });
    if let Some(size) = spec.size {
        exported["size"] = json!(size);
    }
    let mut metadata: serde_json::Map<String, Value> = spec
        .metadata
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    shadow::add_origin(&mut metadata, &origin, &spec.revision);
    exported["metadata"] = Value::Object(metadata);
    Ok(ExportPlan {
        object,
        artifact: exported,
        message: format!("stored artifact for revision '{}'", spec.revision),
        shadow: target.is_shadow(),
        handled: None,
        inputs: exported_inputs(artifact, target, inputs_served),
    })
}

/// The producer's declared inputs as `status.exportedInputs` carries them:
/// only on an ExternalArtifact whose API has the field (elsewhere the API
/// server would drop them), and only when there are any.
pub fn exported_inputs(artifact: &Artifact, target: Target, inputs_served: bool) -> Option<Value> {
    let inputs = artifact.spec.exported_inputs.as_ref()?;
    if inputs.is_empty() || !inputs_served || target != Target::ExternalArtifact {
        return None;
    }
    Some(json!(inputs))
}

/// Every name `artifact` may have been exported under, by this release or
/// an earlier one: its source's export and its own (whichever it is now),
/// the names earlier releases gave both, and the export its status records
/// (its owner may have changed since). Exports are only ever named so, so
/// retiring looks these up instead of scanning every export.
pub fn former_export_names(artifact: &Artifact) -> std::collections::BTreeSet<String> {
    let name = artifact.name_any();
    let mut names = std::collections::BTreeSet::from([
        names::identity::artifact_export_name(&name),
        names::identity::dotted_artifact_export_name(&name),
        names::legacy_artifact_export_name(&name),
    ]);
    if let Some(owner) = artifact.controller_owner() {
        let (group, _) = crate::api::split_api_version(&owner.api_version);
        names.insert(names::identity::source_export_name(
            group,
            &owner.kind,
            &owner.name,
        ));
        names.insert(names::identity::dotted_source_export_name(
            group,
            &owner.kind,
            &owner.name,
        ));
        names.insert(names::legacy_export_name(&owner.kind, &owner.name));
    }
    if let Some(recorded) = artifact
        .status
        .as_ref()
        .and_then(|s| s.exported_ref.as_ref())
    {
        names.insert(recorded.name.clone());
    }
    names
}

/// The path part of `url` (no leading slash, no query), or `<name>.tar.gz`.
pub fn path_from_url(url: &str, name: &str) -> String {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = after_scheme.split_once('/').map_or("", |(_, p)| p);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if path.is_empty() {
        format!("{name}.tar.gz")
    } else {
        path.to_string()
    }
}

/// Whether the exported object `current` already has the metadata and spec
/// of `desired` (labels and owner as a subset; other writers may add).
pub fn object_up_to_date(current: &DynamicObject, desired: &Value) -> bool {
    let spec_ok = current.data.get("spec") == desired.get("spec");
    let labels = current.labels();
    let labels_ok = desired["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let owners = current
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let owner_ok = desired["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|d| {
            owners
                .iter()
                .any(|o| Some(o.uid.as_str()) == d["uid"].as_str())
        });
    spec_ok && labels_ok && owner_ok
}

/// The `Ready` condition for `artifact`'s status.
pub fn ready(artifact: &Artifact, ok: bool, reason: &str, message: &str) -> Condition {
    conditions::ready(
        ok,
        reason,
        message,
        artifact.metadata.generation,
        artifact.ready_condition(),
        &conditions::now(),
    )
}

/// The status the exported object should have, keeping the transition time
/// of its current `Ready` condition when that stays true.
pub fn desired_status(
    current: Option<&DynamicObject>,
    plan: &ExportPlan,
    generation: Option<i64>,
) -> Value {
    let previous: Option<Condition> = current
        .and_then(|c| c.data.get("status"))
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == READY))
        .and_then(|c| Condition::deserialize(c).ok());
    let condition = conditions::ready(
        true,
        reason::SUCCEEDED,
        &plan.message,
        generation,
        previous.as_ref(),
        &conditions::now(),
    );
    let mut status = json!({ "artifact": plan.artifact, "conditions": [condition] });
    if let (true, Some(generation)) = (plan.shadow, generation) {
        status["observedGeneration"] = json!(generation);
    }
    if let (true, Some(handled)) = (plan.shadow, &plan.handled) {
        status["lastHandledReconcileAt"] = json!(handled);
    }
    if let Some(inputs) = &plan.inputs {
        status["exportedInputs"] = inputs.clone();
    }
    status
}

/// Whether the exported object's status already is `desired` (ignoring the
/// transition time).
pub fn status_up_to_date(current: &DynamicObject, desired: &Value) -> bool {
    let Some(status) = current.data.get("status") else {
        return false;
    };
    let same = |field: &str| status.get(field) == desired.get(field);
    if ![
        "artifact",
        "observedGeneration",
        "lastHandledReconcileAt",
        "exportedInputs",
    ]
    .into_iter()
    .all(same)
    {
        return false;
    }
    let strip = |v: Option<&Value>| -> Vec<Value> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| {
                let mut c = c.clone();
                if let Some(o) = c.as_object_mut() {
                    o.remove("lastTransitionTime");
                }
                c
            })
            .collect()
    };
    strip(status.get("conditions")) == strip(desired.get("conditions"))
}

/// Why the name an Artifact would be exported under is taken, if it is.
pub fn conflict(existing: &DynamicObject, artifact_uid: &str) -> Option<String> {
    let managed = existing.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY);
    let ours = existing
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == artifact_uid);
    if ours {
        return None;
    }
    let ns = existing.namespace().unwrap_or_default();
    let name = existing.name_any();
    let kind = existing
        .types
        .as_ref()
        .map_or("the exported object", |t| t.kind.as_str());
    Some(if managed {
        let other = existing
            .labels()
            .get(ARTIFACT_LABEL)
            .cloned()
            .unwrap_or_default();
        format!(
            "{kind} {ns}/{name} is already exported for Artifact {ns}/{other}; rename this Artifact or its source so that their export names differ"
        )
    } else {
        format!(
            "{kind} {ns}/{name} exists and is not managed by openflux; delete or rename it so openflux can export this Artifact"
        )
    })
}

/// Labels selecting the objects openflux exports.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ArtifactSpec;
    use crate::export::message::inputs_not_exported;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::core::GroupVersionKind;

    fn target() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "ExternalArtifact"),
            "externalartifacts",
        )
    }

    fn artifact(owner: bool, digest: Option<&str>) -> Artifact {
        let mut a = Artifact::new(
            "web",
            ArtifactSpec {
                url: "http://store.example:9090/apps/web/abc.tar.gz?x=1".into(),
                revision: "latest@sha256:abc".into(),
                digest: digest.map(String::from),
                size: Some(10),
                ..Default::default()
            },
        );
        a.metadata.namespace = Some("apps".into());
        a.metadata.uid = Some("a-uid".into());
        a.metadata.creation_timestamp = Some(Time("2025-01-01T00:00:00Z".parse().unwrap()));
        if owner {
            a.metadata.owner_references = Some(vec![OwnerReference {
                api_version: "sources.openflux.dev/v1alpha1".into(),
                kind: "HttpSource".into(),
                name: "web".into(),
                uid: "s-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]);
        }
        a
    }

    #[test]
    fn the_names_an_artifact_may_have_been_exported_under() {
        let mut owned = artifact(true, Some("sha256:abc"));
        owned.status = Some(crate::api::ArtifactStatus {
            exported_ref: Some(crate::api::ObjectReference {
                api_version: "source.toolkit.fluxcd.io/v1".into(),
                kind: "ExternalArtifact".into(),
                name: "web.oldkind.sources.openflux.dev".into(),
                namespace: Some("apps".into()),
            }),
            ..Default::default()
        });
        let names = former_export_names(&owned);
        let http = names::identity::source_export_name("sources.openflux.dev", "HttpSource", "web");
        let art = names::identity::artifact_export_name("web");
        let want = [
            "artifact-web",
            "httpsource-web",
            "web.artifact.openflux.dev",
            "web.httpsource.sources.openflux.dev",
            "web.oldkind.sources.openflux.dev",
            &http,
            &art,
        ];
        assert_eq!(names, want.iter().map(|n| n.to_string()).collect());
        let standalone = former_export_names(&artifact(false, None));
        let want = ["artifact-web", "web.artifact.openflux.dev", &art];
        assert_eq!(standalone, want.iter().map(|n| n.to_string()).collect());
    }

    #[test]
    fn exports_custom_artifact_with_source_ref_owner_and_status() {
        let p = plan(
            &artifact(true, Some("sha256:abc")),
            "httpsource-web",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap();
        assert_eq!(p.object["kind"], "ExternalArtifact");
        assert_eq!(p.object["metadata"]["name"], "httpsource-web");
        assert_eq!(p.object["metadata"]["namespace"], "apps");
        assert_eq!(p.object["metadata"]["labels"][MANAGED_BY_LABEL], "openflux");
        assert_eq!(p.object["metadata"]["ownerReferences"][0]["uid"], "a-uid");
        assert_eq!(
            p.object["metadata"]["ownerReferences"][0]["kind"],
            "Artifact"
        );
        assert_eq!(
            p.object["spec"]["sourceRef"],
            json!({"apiVersion": "sources.openflux.dev/v1alpha1", "kind": "HttpSource", "name": "web", "namespace": "apps"})
        );
        assert_eq!(
            p.artifact,
            json!({
                "url": "http://store.example:9090/apps/web/abc.tar.gz?x=1",
                "revision": "latest@sha256:abc",
                "digest": "sha256:abc",
                "path": "apps/web/abc.tar.gz",
                "size": 10,
                "lastUpdateTime": "2025-01-01T00:00:00Z",
                "metadata": {
                    "org.opencontainers.image.source": "HttpSource.sources.openflux.dev/apps/web",
                    "org.opencontainers.image.revision": "latest@sha256:abc",
                },
            })
        );
        assert!(!p.shadow);
    }

    #[test]
    fn new_content_under_the_same_producer_revision_is_a_new_exported_revision() {
        // The producer kept `latest@sha256:abc` but its file changed.
        let p = plan(
            &artifact(true, Some("sha256:abd")),
            "httpsource-web",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap();
        assert_eq!(p.artifact["revision"], "latest@sha256:abd");
        assert_eq!(
            p.artifact["metadata"]["org.opencontainers.image.revision"],
            "latest@sha256:abc"
        );
    }

    #[test]
    fn shadows_are_suspended_oci_repositories_helm_controller_can_read() {
        let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let shadow = Target::Shadow(crate::cluster::target::OciVersion::V1);
        let gvk = GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "OCIRepository");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "ocirepositories");
        let p = plan(
            &artifact(true, Some(digest)),
            "web.x",
            shadow,
            &resource,
            false,
        )
        .unwrap();
        assert!(p.shadow);
        assert_eq!(p.object["kind"], "OCIRepository");
        assert_eq!(p.object["metadata"]["labels"][SHADOW_LABEL], "true");
        assert_eq!(p.object["spec"]["suspend"], true);
        assert!(p.object["spec"].get("sourceRef").is_none());
        // A revision helm-controller cannot parse becomes the digest; the
        // producer's stays in the origin metadata.
        assert_eq!(p.artifact["revision"], digest);
        assert_eq!(
            p.artifact["metadata"]["org.opencontainers.image.revision"],
            "latest@sha256:abc"
        );
        assert!(p.artifact["path"]
            .as_str()
            .unwrap()
            .starts_with("openflux/apps/web.x/"));
        let status = desired_status(None, &p, Some(3));
        assert_eq!(status["observedGeneration"], 3);
        let conditions = status["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1, "only Ready: {status}");
        // An ExternalArtifact's status has no observedGeneration.
        let ea = plan(
            &artifact(true, Some(digest)),
            "web.x",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap();
        assert!(desired_status(None, &ea, Some(3))
            .get("observedGeneration")
            .is_none());
    }

    /// One row: declared inputs, target, whether the API has the field,
    /// the `status.exportedInputs` the export carries, and whether the
    /// Artifact's message says they were not exported.
    #[test]
    fn declared_inputs_reach_external_artifacts_whose_api_has_the_field() {
        let shadow = Target::Shadow(crate::cluster::target::OciVersion::V1);
        let ea = Target::ExternalArtifact;
        let inputs = json!({"tenant": "team-a", "replicas": 3, "regions": ["eu", "us"], "db": {"tier": "gold"}});
        type Row = (Option<Value>, Target, bool, Option<Value>, bool);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            (Some(inputs.clone()), ea, true, Some(inputs.clone()), false),
            (Some(inputs.clone()), ea, false, None, true),
            (Some(inputs.clone()), shadow, true, None, true),
            (Some(json!({})), ea, true, None, false),
            (None, ea, true, None, false),
            (None, shadow, false, None, false),
        ];
        for (i, (declared, to, served, want, noted)) in rows.into_iter().enumerate() {
            let mut a = artifact(true, Some("sha256:abc"));
            a.spec.exported_inputs = declared.map(|v| serde_json::from_value(v).unwrap());
            let resource = match to {
                Target::ExternalArtifact => target(),
                Target::Shadow(_) => ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "OCIRepository"),
                    "ocirepositories",
                ),
            };
            let p = plan(&a, "web.x", to, &resource, served).unwrap();
            let status = desired_status(None, &p, Some(1));
            assert_eq!(status.get("exportedInputs").cloned(), want, "row {i}");
            let targets = std::collections::BTreeSet::from([to]);
            let note = inputs_not_exported(&a, &targets, served);
            assert_eq!(note.is_some(), noted, "row {i}: {note:?}");
        }
    }

    #[test]
    fn a_change_of_inputs_is_a_change_of_status() {
        let mut a = artifact(true, Some("sha256:abc"));
        a.spec.exported_inputs = Some([("env".to_string(), json!("dev"))].into());
        let p = plan(&a, "web.x", Target::ExternalArtifact, &target(), true).unwrap();
        let mut current = dynamic(p.object.clone());
        current.data["status"] = desired_status(None, &p, Some(1));
        assert!(status_up_to_date(
            &current,
            &desired_status(Some(&current), &p, Some(1))
        ));
        a.spec.exported_inputs = Some([("env".to_string(), json!("prod"))].into());
        let changed = plan(&a, "web.x", Target::ExternalArtifact, &target(), true).unwrap();
        assert!(!status_up_to_date(
            &current,
            &desired_status(Some(&current), &changed, Some(1))
        ));
        // Inputs withdrawn: the field goes.
        a.spec.exported_inputs = None;
        let gone = plan(&a, "web.x", Target::ExternalArtifact, &target(), true).unwrap();
        let desired = desired_status(Some(&current), &gone, Some(1));
        assert!(desired.get("exportedInputs").is_none());
        assert!(!status_up_to_date(&current, &desired));
    }

    #[test]
    fn standalone_artifact_points_at_itself() {
        let p = plan(
            &artifact(false, Some("sha256:abc")),
            "artifact-web",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap();
        assert_eq!(p.object["spec"]["sourceRef"]["kind"], "Artifact");
        assert_eq!(
            p.object["spec"]["sourceRef"]["apiVersion"],
            "openflux.dev/v1alpha1"
        );
    }

    #[test]
    fn refuses_artifacts_flux_could_not_use() {
        let err = plan(
            &artifact(true, None),
            "x",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap_err();
        assert!(err.contains("spec.digest is missing"), "{err}");
        let mut a = artifact(true, Some("sha256:abc"));
        a.spec.url = "file:///etc/passwd".into();
        assert!(plan(&a, "x", Target::ExternalArtifact, &target(), false)
            .unwrap_err()
            .contains("not an http"));
    }

    #[test]
    fn paths_from_urls() {
        assert_eq!(path_from_url("http://h:1/a/b.tgz", "n"), "a/b.tgz");
        assert_eq!(path_from_url("https://h", "n"), "n.tar.gz");
        assert_eq!(path_from_url("http://h/x.tgz#f", "n"), "x.tgz");
    }

    fn dynamic(value: Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn up_to_date_checks_and_status_comparison() {
        let p = plan(
            &artifact(true, Some("sha256:abc")),
            "httpsource-web",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap();
        let mut current = dynamic(p.object.clone());
        assert!(object_up_to_date(&current, &p.object));
        let desired = desired_status(Some(&current), &p, Some(1));
        assert!(!status_up_to_date(&current, &desired));
        current.data["status"] = desired.clone();
        assert!(status_up_to_date(&current, &desired));
        // Same status later: the transition time is kept.
        let again = desired_status(Some(&current), &p, Some(1));
        assert_eq!(again, desired);
        // A new revision changes the status.
        let mut newer = artifact(true, Some("sha256:def"));
        newer.spec.revision = "latest@sha256:def".into();
        let p2 = plan(
            &newer,
            "httpsource-web",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap();
        assert!(!status_up_to_date(
            &current,
            &desired_status(Some(&current), &p2, Some(1))
        ));
    }

    #[test]
    fn conflicts_name_the_way_out() {
        let p = plan(
            &artifact(true, Some("sha256:abc")),
            "httpsource-web",
            Target::ExternalArtifact,
            &target(),
            false,
        )
        .unwrap();
        let ours = dynamic(p.object.clone());
        assert_eq!(conflict(&ours, "a-uid"), None);
        let mut foreign = ours.clone();
        foreign.metadata.labels = None;
        foreign.metadata.owner_references = None;
        let message = conflict(&foreign, "a-uid").unwrap();
        assert!(message.contains("not managed by openflux"), "{message}");
        assert!(message.contains("delete or rename it"), "{message}");
        let other = ours.clone();
        let message = conflict(&other, "other-uid").unwrap();
        assert!(message.contains("already exported"), "{message}");
        assert!(
            message.contains("rename this Artifact or its source"),
            "{message}"
        );
    }
}
