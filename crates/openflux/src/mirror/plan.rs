//! What the mirror decides, from a stock source object alone: the Artifact
//! it implies (or that it has none), whether a stored Artifact already says
//! it, and the status openflux keeps on it. Plain functions from data to data.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::core::DynamicObject;
use kube::ResourceExt;

use crate::api::{
    Artifact, ArtifactSpec, StockSource, FLUX_SOURCE_GROUP, MANAGED_BY, MANAGED_BY_LABEL,
    SOURCE_KIND_LABEL, SOURCE_NAME_LABEL,
};
use crate::{naming, shard};

/// What the mirror should do for one source.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Nothing: the source is openflux's own export.
    Skip,
    /// The source has no artifact: its Artifact, if any, goes.
    Remove { name: String },
    /// The source's artifact, as an Artifact.
    Mirror(Box<Artifact>),
}

/// Why a source's artifact cannot be mirrored.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{kind} {namespace}/{name}: status.artifact is malformed: {detail}")]
pub struct InvalidSource {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub detail: String,
}

/// The Artifact a stock source implies. Pure: decides from the object alone.
pub fn plan(
    stock: &StockSource,
    api_version: &str,
    source: &DynamicObject,
) -> Result<Plan, InvalidSource> {
    let kind = stock.kind;
    let name = source.name_any();
    let namespace = source.namespace().unwrap_or_default();
    if is_own_export(stock, source) {
        return Ok(Plan::Skip);
    }
    let artifact_name = naming::mirror_artifact_name(stock, &name);
    // A slimmed source carries its artifact as JSON text (see [`slim`]).
    let compact = source
        .data
        .as_str()
        .map(serde_json::from_str::<serde_json::Value>)
        .transpose()
        .map_err(|e| InvalidSource {
            kind: kind.to_string(),
            namespace: namespace.clone(),
            name: name.clone(),
            detail: e.to_string(),
        })?;
    let raw = match &compact {
        Some(artifact) => Some(artifact),
        None => source.data.get("status").and_then(|s| s.get("artifact")),
    };
    let Some(raw) = raw else {
        return Ok(Plan::Remove {
            name: artifact_name,
        });
    };
    if raw.is_null() {
        return Ok(Plan::Remove {
            name: artifact_name,
        });
    }
    let spec: ArtifactSpec = serde_json::from_value(raw.clone()).map_err(|e| InvalidSource {
        kind: kind.to_string(),
        namespace: namespace.clone(),
        name: name.clone(),
        detail: e.to_string(),
    })?;
    let owner = OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.clone(),
        uid: source.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let artifact = Artifact {
        metadata: ObjectMeta {
            name: Some(artifact_name),
            namespace: Some(namespace),
            labels: Some(
                BTreeMap::from([
                    (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                    (
                        SOURCE_KIND_LABEL.to_string(),
                        naming::label_value(&kind.to_ascii_lowercase()),
                    ),
                    (SOURCE_NAME_LABEL.to_string(), naming::label_value(&name)),
                ])
                .into_iter()
                .chain(shard::shard_label_of(source.labels()))
                .collect(),
            ),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    };
    Ok(Plan::Mirror(Box::new(artifact)))
}

/// Whether `source` is an object openflux exported itself (an
/// ExternalArtifact, or a shadow of any kind): mirroring it would loop.
pub fn is_own_export(stock: &StockSource, source: &DynamicObject) -> bool {
    let labels = source.labels();
    let managed = labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY);
    managed
        && (*stock == StockSource::EXTERNAL_ARTIFACT
            || labels.contains_key(crate::shadow::SHADOW_LABEL))
}

/// Drops what the mirror never reads from a cached source object, and keeps
/// its `status.artifact` as one JSON text in place of the object's data
/// ([`plan`] reads it back): a tree of maps costs about three times the
/// memory of its text, for every source in the cluster.
pub fn slim(source: &mut DynamicObject) {
    source.metadata.managed_fields = None;
    source.metadata.annotations = None;
    let artifact = source.data.pointer("/status/artifact");
    source.data = match artifact {
        Some(a) if !a.is_null() => serde_json::Value::String(a.to_string()),
        _ => serde_json::Value::Null,
    };
}

/// Drops what openflux never reads from a cached Artifact: managed fields,
/// and the annotations of an Artifact mirrored from a Flux source (its
/// writer is openflux; nothing else on it is read).
pub fn slim_artifact(artifact: &mut Artifact) {
    artifact.metadata.managed_fields = None;
    let mirrored = artifact
        .controller_owner()
        .is_some_and(|o| crate::api::split_api_version(&o.api_version).0 == FLUX_SOURCE_GROUP);
    if mirrored {
        artifact.metadata.annotations = None;
    }
}

/// Whether `current` already says everything `desired` says.
pub fn up_to_date(current: &Artifact, desired: &Artifact) -> bool {
    if current.spec != desired.spec {
        return false;
    }
    let labels = current.labels();
    let labels_ok = desired
        .labels()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    let owners = current
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let owner_ok = desired.metadata.owner_references.iter().flatten().all(|d| {
        owners
            .iter()
            .any(|o| o.uid == d.uid && o.controller == Some(true))
    });
    labels_ok && owner_ok && shard::same_shard(labels, desired.labels())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source(kind: &str, status: serde_json::Value, labels: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": kind,
            "metadata": {"name": "podinfo", "namespace": "apps", "uid": "u-1", "labels": labels},
            "spec": {},
            "status": status,
        }))
        .unwrap()
    }

    /// A GitRepository with an artifact in its status.
    fn podinfo() -> DynamicObject {
        source(
            "GitRepository",
            json!({"artifact": flux_artifact()}),
            json!({}),
        )
    }

    /// The Artifact the mirror plans for the GitRepository `s`.
    fn mirrored(s: &DynamicObject) -> Artifact {
        match plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            s,
        )
        .unwrap()
        {
            Plan::Mirror(a) => *a,
            other => panic!("expected a mirror plan, got {other:?}"),
        }
    }

    fn flux_artifact() -> serde_json::Value {
        json!({
            "digest": "sha256:aa",
            "lastUpdateTime": "2025-05-06T07:08:09Z",
            "path": "gitrepository/apps/podinfo/abc.tar.gz",
            "revision": "main@sha1:abc",
            "size": 42,
            "url": "http://source-controller.flux-system.svc/gitrepository/apps/podinfo/abc.tar.gz"
        })
    }

    #[test]
    fn mirrors_status_artifact_field_for_field() {
        let s = podinfo();
        let a = mirrored(&s);
        assert_eq!(a.name_any(), "gitrepository-podinfo");
        assert_eq!(a.namespace().as_deref(), Some("apps"));
        assert_eq!(serde_json::to_value(&a.spec).unwrap(), flux_artifact());
        let owner = a.controller_owner().unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("GitRepository", "u-1")
        );
        assert_eq!(a.labels().get(SOURCE_KIND_LABEL).unwrap(), "gitrepository");
        assert_eq!(a.labels().get(SOURCE_NAME_LABEL).unwrap(), "podinfo");
    }

    #[test]
    fn no_artifact_means_remove() {
        let s = source("Bucket", json!({"conditions": []}), json!({}));
        assert_eq!(
            plan(&StockSource::BUCKET, "source.toolkit.fluxcd.io/v1", &s).unwrap(),
            Plan::Remove {
                name: "bucket-podinfo".into()
            }
        );
        let s = source("Bucket", json!({"artifact": null}), json!({}));
        assert!(matches!(
            plan(&StockSource::BUCKET, "v", &s).unwrap(),
            Plan::Remove { .. }
        ));
    }

    #[test]
    fn own_exports_are_never_mirrored_but_foreign_ones_are() {
        let ours = source(
            "ExternalArtifact",
            json!({"artifact": flux_artifact()}),
            json!({MANAGED_BY_LABEL: MANAGED_BY}),
        );
        assert_eq!(
            plan(
                &StockSource::EXTERNAL_ARTIFACT,
                "source.toolkit.fluxcd.io/v1",
                &ours
            )
            .unwrap(),
            Plan::Skip
        );
        let foreign = source(
            "ExternalArtifact",
            json!({"artifact": flux_artifact()}),
            json!({}),
        );
        assert!(matches!(
            plan(
                &StockSource::EXTERNAL_ARTIFACT,
                "source.toolkit.fluxcd.io/v1",
                &foreign
            )
            .unwrap(),
            Plan::Mirror(_)
        ));
    }

    #[test]
    fn malformed_artifact_is_an_error_not_a_panic() {
        let s = source("GitRepository", json!({"artifact": {"url": 5}}), json!({}));
        let err = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("GitRepository apps/podinfo"),
            "{err}"
        );
    }

    #[test]
    fn up_to_date_compares_spec_labels_and_owner() {
        let s = podinfo();
        let desired = mirrored(&s);
        let mut current = desired.clone();
        current.metadata.resource_version = Some("7".into());
        current
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("extra".into(), "kept".into());
        assert!(up_to_date(&current, &desired));
        current.spec.revision = "main@sha1:def".into();
        assert!(!up_to_date(&current, &desired));
        let mut orphan = desired.clone();
        orphan.metadata.owner_references = None;
        assert!(!up_to_date(&orphan, &desired));
    }

    #[test]
    fn the_mirrored_artifact_is_in_its_sources_shard() {
        let key = crate::shard::SHARD_LABEL;
        let sharded = source(
            "GitRepository",
            json!({"artifact": flux_artifact()}),
            json!({key: "shard1"}),
        );
        let desired = mirrored(&sharded);
        assert_eq!(desired.labels()[key], "shard1");
        let unsharded = mirrored(&podinfo());
        assert!(!unsharded.labels().contains_key(key));
        // Moving the source moves its Artifact: either way it is rewritten.
        assert!(!up_to_date(&unsharded, &desired));
        assert!(!up_to_date(&desired, &unsharded));
        assert!(up_to_date(&desired, &desired.clone()));
    }

    #[test]
    fn slimmed_sources_plan_the_same() {
        let mut s = source(
            "GitRepository",
            json!({"artifact": flux_artifact(), "conditions": []}),
            json!({"a": "b"}),
        );
        let before = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap();
        slim(&mut s);
        assert_eq!(s.data, json!(flux_artifact().to_string()));
        assert_eq!(
            plan(
                &StockSource::GIT_REPOSITORY,
                "source.toolkit.fluxcd.io/v1",
                &s
            )
            .unwrap(),
            before
        );
        let mut gone = source("GitRepository", json!({}), json!({}));
        slim(&mut gone);
        assert!(matches!(
            plan(&StockSource::GIT_REPOSITORY, "v", &gone).unwrap(),
            Plan::Remove { .. }
        ));
    }
}
