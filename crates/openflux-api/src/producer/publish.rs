//! Publishing a source's artifact as an openflux `Artifact`.
//!
//! The Artifact is the whole contract with openflux: it lives in the
//! source's namespace, carries a controller ownerReference to the source
//! (with the source's UID, so it speaks for that very object and is garbage
//! collected with it) and is written by server-side apply under the
//! producer's own field manager. Only `spec` is written: `status` belongs to
//! openflux, which reports there whether and where the Artifact was exported
//! ([`exported_ref`]).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};

use crate::{Artifact, ArtifactSpec, SHARD_LABEL};

/// Why an Artifact could not be built or written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The source has no UID or namespace (it was not read from the API
    /// server): an owner reference needs both.
    #[error("source {0} has no uid or namespace")]
    Incomplete(String),
    #[error("writing Artifact {namespace}/{name}: {source}")]
    Kube {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The controller ownerReference to `source`, blocking its deletion until
/// the Artifact is gone (the producer then needs `update` on the source's
/// `finalizers` subresource).
pub fn owner_reference<K>(source: &K) -> Result<OwnerReference, PublishError>
where
    K: Resource<DynamicType = ()>,
{
    let uid = source
        .uid()
        .ok_or_else(|| PublishError::Incomplete(describe(source)))?;
    Ok(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: source.name_any(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// The Artifact `name` in the source's namespace, owned by the source and
/// in the source's shard: the source's [`SHARD_LABEL`] is copied, so the
/// openflux shard that reconciles the source's kind of object exports it.
pub fn artifact_for<K>(source: &K, name: &str, spec: ArtifactSpec) -> Result<Artifact, PublishError>
where
    K: Resource<DynamicType = ()>,
{
    let namespace = source
        .namespace()
        .ok_or_else(|| PublishError::Incomplete(describe(source)))?;
    let mut artifact = Artifact::new(name, spec);
    artifact.metadata.namespace = Some(namespace);
    artifact.metadata.owner_references = Some(vec![owner_reference(source)?]);
    if let Some(shard) = source.labels().get(SHARD_LABEL) {
        artifact.metadata.labels = Some([(SHARD_LABEL.to_string(), shard.clone())].into());
    }
    Ok(artifact)
}

/// Where openflux exported an Artifact to (`status.exportedRef`): the object
/// stock Flux consumers, `flux trace` and notification Alerts see for the
/// source.
pub fn exported_ref(artifact: &Artifact) -> Option<ObjectReference> {
    let exported = artifact.status.as_ref()?.exported_ref.as_ref()?;
    Some(ObjectReference {
        api_version: Some(exported.api_version.clone()),
        kind: Some(exported.kind.clone()),
        name: Some(exported.name.clone()),
        namespace: exported.namespace.clone().or_else(|| artifact.namespace()),
        ..ObjectReference::default()
    })
}

fn describe<K: Resource<DynamicType = ()>>(source: &K) -> String {
    format!("{}/{}", K::kind(&()), source.name_any())
}

/// Writes Artifacts by server-side apply under one field manager.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    field_manager: String,
}

impl Publisher {
    pub fn new(client: Client, field_manager: impl Into<String>) -> Self {
        Publisher {
            client,
            field_manager: field_manager.into(),
        }
    }

    pub fn field_manager(&self) -> &str {
        &self.field_manager
    }

    /// Publishes `spec` as the Artifact `name` of `source` (see
    /// [`artifact_for`]) and returns the Artifact as stored, status included.
    /// Applying an unchanged spec is a no-op for the API server.
    pub async fn publish<K>(
        &self,
        source: &K,
        name: &str,
        spec: ArtifactSpec,
    ) -> Result<Artifact, PublishError>
    where
        K: Resource<DynamicType = ()>,
    {
        self.apply(&artifact_for(source, name, spec)?).await
    }

    /// Applies a complete Artifact (with namespace and owner).
    pub async fn apply(&self, artifact: &Artifact) -> Result<Artifact, PublishError> {
        let namespace = artifact
            .namespace()
            .ok_or_else(|| PublishError::Incomplete(format!("Artifact/{}", artifact.name_any())))?;
        let name = artifact.name_any();
        let api: Api<Artifact> = Api::namespaced(self.client.clone(), &namespace);
        api.patch(
            &name,
            &PatchParams::apply(&self.field_manager).force(),
            &Patch::Apply(artifact),
        )
        .await
        .map_err(|source| PublishError::Kube {
            namespace,
            name,
            source,
        })
    }

    /// The stored Artifact `namespace`/`name`, if any.
    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<Artifact>, PublishError> {
        let api: Api<Artifact> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name)
            .await
            .map_err(|source| PublishError::Kube {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn source() -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "app", "namespace": "team", "uid": "u-1"},
        }))
        .unwrap()
    }

    fn spec() -> ArtifactSpec {
        ArtifactSpec {
            url: "http://storage/team/app/ab.tar.gz".into(),
            revision: "sha256:ab".into(),
            digest: Some("sha256:ab".into()),
            path: Some("team/app/ab.tar.gz".into()),
            size: Some(42),
            last_update_time: Some(Time(Timestamp::from_second(1_700_000_000).unwrap())),
            metadata: None,
            exported_inputs: None,
        }
    }

    #[test]
    fn the_artifact_is_owned_by_its_source() {
        let artifact = artifact_for(&source(), "app", spec()).unwrap();
        assert_eq!(
            serde_json::to_value(&artifact).unwrap(),
            serde_json::json!({
                "apiVersion": "openflux.dev/v1alpha1",
                "kind": "Artifact",
                "metadata": {
                    "name": "app",
                    "namespace": "team",
                    "ownerReferences": [{
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "app",
                        "uid": "u-1",
                        "controller": true,
                        "blockOwnerDeletion": true
                    }]
                },
                "spec": {
                    "url": "http://storage/team/app/ab.tar.gz",
                    "revision": "sha256:ab",
                    "digest": "sha256:ab",
                    "path": "team/app/ab.tar.gz",
                    "size": 42,
                    "lastUpdateTime": "2023-11-14T22:13:20Z"
                }
            })
        );
    }

    #[test]
    fn the_artifact_is_in_its_sources_shard() {
        let unsharded = artifact_for(&source(), "app", spec()).unwrap();
        assert_eq!(unsharded.metadata.labels, None);
        let mut sharded = source();
        sharded.metadata.labels = Some(
            [
                (SHARD_LABEL.to_string(), "shard1".to_string()),
                ("team".to_string(), "a".to_string()),
            ]
            .into(),
        );
        let artifact = artifact_for(&sharded, "app", spec()).unwrap();
        assert_eq!(
            artifact.metadata.labels,
            Some([(SHARD_LABEL.to_string(), "shard1".to_string())].into()),
            "only the shard label is copied"
        );
    }

    #[test]
    fn a_source_without_uid_or_namespace_cannot_own() {
        let mut no_uid = source();
        no_uid.metadata.uid = None;
        let err = artifact_for(&no_uid, "app", spec()).unwrap_err();
        assert!(err.to_string().contains("ConfigMap/app"), "{err}");
        let mut no_ns = source();
        no_ns.metadata.namespace = None;
        assert!(artifact_for(&no_ns, "app", spec()).is_err());
    }

    #[test]
    fn reads_where_the_artifact_was_exported() {
        let mut artifact = artifact_for(&source(), "app", spec()).unwrap();
        assert_eq!(exported_ref(&artifact), None);
        artifact.status = Some(crate::ArtifactStatus {
            exported_ref: Some(crate::ObjectReference {
                api_version: "source.toolkit.fluxcd.io/v1".into(),
                kind: "ExternalArtifact".into(),
                name: "configmap-app".into(),
                namespace: None,
            }),
            ..Default::default()
        });
        let exported = exported_ref(&artifact).unwrap();
        assert_eq!(exported.kind.as_deref(), Some("ExternalArtifact"));
        assert_eq!(exported.name.as_deref(), Some("configmap-app"));
        assert_eq!(exported.namespace.as_deref(), Some("team"));
    }
}
