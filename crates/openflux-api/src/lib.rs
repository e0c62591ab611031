//! The public API of openflux: the `Artifact` custom resource
//! (`openflux.dev/v1alpha1`) and the constants producers and consumers share.
//!
//! A producer (a custom source controller) writes `spec`; openflux writes
//! `status`. The spec carries the same fields, under the same JSON names, as
//! the artifact of a Flux source's `.status.artifact`, so values copy 1:1.

pub mod duration;
pub mod policy;
#[cfg(feature = "producer")]
pub mod producer;
#[cfg(feature = "runtime")]
pub mod runtime;
#[cfg(feature = "spiffe")]
pub mod spiffe;
pub mod timestamp;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;

pub mod conditions;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of the Artifact resource.
pub const GROUP: &str = "openflux.dev";
/// Served version of the Artifact resource.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of the Artifact resource.
pub const API_VERSION: &str = "openflux.dev/v1alpha1";
/// Kind of the Artifact resource.
pub const KIND: &str = "Artifact";

/// Field manager used for every server-side apply openflux makes.
pub const FIELD_MANAGER: &str = "openflux";

/// Label on every object openflux creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "openflux";
/// Label naming the kind of the source an Artifact was mirrored from.
pub const SOURCE_KIND_LABEL: &str = "openflux.dev/source-kind";
/// Label naming the source an Artifact was mirrored from.
pub const SOURCE_NAME_LABEL: &str = "openflux.dev/source-name";
/// Label on an exported object naming the Artifact it was exported from.
pub const ARTIFACT_LABEL: &str = "openflux.dev/artifact";
/// Flux's sharding label: a controller started with
/// `--watch-label-selector=sharding.fluxcd.io/key=<shard>` reconciles the
/// objects carrying it with that value. An Artifact belongs to the shard of
/// its source: its producer copies this label from the source (the
/// [`producer`] helpers do), and openflux exports it in that shard.
pub const SHARD_LABEL: &str = "sharding.fluxcd.io/key";
/// Annotation the webhook keeps the original source reference in.
pub const SOURCE_REF_ANNOTATION: &str = "openflux.dev/source-ref";

/// The Flux source API group.
pub const FLUX_SOURCE_GROUP: &str = "source.toolkit.fluxcd.io";

/// A source kind of stock Flux, in API group [`FLUX_SOURCE_GROUP`]. openflux
/// mirrors these kinds and never exports Artifacts they own: consumers read
/// them directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StockSource {
    pub kind: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// Versions to look for on the API server, preferred first.
    pub versions: &'static [&'static str],
}

impl StockSource {
    pub const GIT_REPOSITORY: Self = Self::new("GitRepository", "gitrepositories", &["v1"]);
    pub const OCI_REPOSITORY: Self =
        Self::new("OCIRepository", "ocirepositories", &["v1", "v1beta2"]);
    pub const BUCKET: Self = Self::new("Bucket", "buckets", &["v1"]);
    pub const HELM_CHART: Self = Self::new("HelmChart", "helmcharts", &["v1"]);
    pub const HELM_REPOSITORY: Self = Self::new("HelmRepository", "helmrepositories", &["v1"]);
    /// Flux's open door (RFC-0012), and what openflux exports custom sources as.
    pub const EXTERNAL_ARTIFACT: Self = Self::new("ExternalArtifact", "externalartifacts", &["v1"]);

    const fn new(
        kind: &'static str,
        plural: &'static str,
        versions: &'static [&'static str],
    ) -> Self {
        Self {
            kind,
            plural,
            versions,
        }
    }

    /// The stock source kind named `kind` (of any version of [`FLUX_SOURCE_GROUP`]).
    pub fn by_kind(kind: &str) -> Option<&'static StockSource> {
        STOCK_SOURCES.iter().find(|s| s.kind == kind)
    }

    /// The stock source kind `group`/`kind` names, if it names one.
    pub fn find(group: &str, kind: &str) -> Option<&'static StockSource> {
        (group == FLUX_SOURCE_GROUP)
            .then(|| Self::by_kind(kind))
            .flatten()
    }
}

/// Every source kind of stock Flux: the one table the mirror, the index, the
/// webhook's consumers and the naming rules read.
pub static STOCK_SOURCES: [StockSource; 6] = [
    StockSource::GIT_REPOSITORY,
    StockSource::OCI_REPOSITORY,
    StockSource::BUCKET,
    StockSource::HELM_CHART,
    StockSource::HELM_REPOSITORY,
    StockSource::EXTERNAL_ARTIFACT,
];

/// Whether `group`/`kind` names a stock Flux source kind.
pub fn is_stock_source(group: &str, kind: &str) -> bool {
    StockSource::find(group, kind).is_some()
}

/// The condition type every openflux status carries (kstatus compatible).
pub const READY: &str = "Ready";

/// Pattern of an artifact digest: `<algorithm>:<encoded>`, as Flux writes it.
pub const DIGEST_PATTERN: &str = r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$";

/// An artifact produced by a source: where to download it and what it is.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "openflux.dev",
    version = "v1alpha1",
    kind = "Artifact",
    namespaced,
    status = "ArtifactStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "oart",
    category = "openflux",
    doc = "Artifact is the uniform, independent description of an artifact produced by a source (a Flux source or a custom one). Producers write spec; openflux writes status (Artifacts it mirrors from Flux's own sources have none).",
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".metadata.ownerReferences[?(@.controller==true)].kind"}"#,
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".metadata.ownerReferences[?(@.controller==true)].name"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".spec.revision"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactSpec {
    /// HTTP address the artifact (a tar.gz) can be downloaded from.
    #[schemars(length(min = 1))]
    pub url: String,
    /// Human-readable identifier of the artifact's content, e.g. `main@sha1:<sha>`.
    #[schemars(length(min = 1))]
    pub revision: String,
    /// Digest of the file behind url, `<algorithm>:<checksum>`, e.g. `sha256:<hex>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$"))]
    pub digest: Option<String>,
    /// Path of the artifact relative to its storage root (derived from url when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Size of the file in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// When the producer last updated the artifact.
    // Read as the API server's `date-time` check reads it
    // (`timestamp::parse`): a value that cannot be read is absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "timestamp::optional"
    )]
    pub last_update_time: Option<Time>,
    /// Free-form metadata (for example OCI annotations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Structured data the producer declares for consumers that template
    /// from their sources (for example flux-operator's ResourceSets): each
    /// key maps to any JSON value. openflux copies it into the exported
    /// ExternalArtifact's `status.exportedInputs` where the cluster's
    /// ExternalArtifact API has that field (source-controller v1.10 and
    /// later); shadow OCIRepositories have no such field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "exported_inputs_schema")]
    pub exported_inputs: Option<BTreeMap<String, serde_json::Value>>,
}

/// The schema of [`ArtifactSpec::exported_inputs`]: the same as Flux's
/// `ExternalArtifact` `status.exportedInputs` (an object whose values are
/// any JSON, kept as written).
fn exported_inputs_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "additionalProperties": {"x-kubernetes-preserve-unknown-fields": true},
    })
}

/// What openflux observed and did with an Artifact.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactStatus {
    /// The generation of the Artifact openflux last handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Kind/name` of the source that produced the Artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The object stock Flux consumers read this Artifact through, if exported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_ref: Option<ObjectReference>,
    /// Conditions; `Ready` tells whether the Artifact is usable by Flux consumers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A reference to an object, by apiVersion, kind, name and namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Reasons openflux writes into `Ready` conditions.
pub mod reason {
    /// The Artifact was exported to a Flux-consumable object.
    pub const EXPORTED: &str = "Exported";
    /// The Artifact cannot be exported as it is (for example it has no digest).
    pub const INVALID_ARTIFACT: &str = "InvalidArtifact";
    /// Another object already holds the name the export would use.
    pub const EXPORT_CONFLICT: &str = "ExportConflict";
    /// The Flux API to export to is not installed in the cluster.
    pub const EXPORT_TARGET_MISSING: &str = "ExportTargetMissing";
    /// The Artifact's writer may not speak for the source it claims.
    pub const UNTRUSTED: &str = "Untrusted";
    /// The API server refused (or never answered) a write of the export.
    pub const EXPORT_FAILED: &str = "ExportFailed";
    /// Flux's generic success reason, used on exported objects.
    pub const SUCCEEDED: &str = "Succeeded";
}

impl Artifact {
    /// The controller ownerReference of this Artifact, if any.
    pub fn controller_owner(
        &self,
    ) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
        self.metadata
            .owner_references
            .as_ref()?
            .iter()
            .find(|o| o.controller == Some(true))
    }

    /// The `Ready` condition, if openflux wrote one.
    pub fn ready_condition(&self) -> Option<&Condition> {
        conditions::find(&self.status.as_ref()?.conditions, READY)
    }
}

/// The Artifact CustomResourceDefinition as YAML, as `openflux crds` prints it
/// and `manifests/crds/artifacts.yaml` carries it.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    Ok(format!(
        "---\n{}",
        serde_yaml_ng::to_string(&Artifact::crd())?
    ))
}

/// Splits an `apiVersion` into its group (empty for the core group) and version.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One Artifact exists per Flux source: `kubectl get all` lists none of
    /// them, `kubectl get openflux` lists them all.
    #[test]
    fn artifacts_are_in_openfluxs_category_only() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(Artifact::crd()).unwrap();
        assert_eq!(
            crd["spec"]["names"]["categories"],
            serde_json::json!(["openflux"])
        );
    }

    #[test]
    fn splits_api_versions() {
        assert_eq!(split_api_version("v1"), ("", "v1"));
        assert_eq!(
            split_api_version("source.toolkit.fluxcd.io/v1"),
            ("source.toolkit.fluxcd.io", "v1")
        );
    }

    #[test]
    fn stock_sources_are_found_by_group_and_kind_only() {
        assert_eq!(
            StockSource::find(FLUX_SOURCE_GROUP, "OCIRepository"),
            Some(&StockSource::OCI_REPOSITORY)
        );
        assert!(is_stock_source(FLUX_SOURCE_GROUP, "ExternalArtifact"));
        assert!(!is_stock_source("example.com", "GitRepository"));
        assert!(!is_stock_source(FLUX_SOURCE_GROUP, "HttpSource"));
        assert_eq!(StockSource::by_kind("Bucket"), Some(&StockSource::BUCKET));
        assert_eq!(StockSource::by_kind("bucket"), None);
    }

    #[test]
    fn spec_round_trips_flux_json_names() {
        let json = serde_json::json!({
            "url": "http://example/a.tar.gz",
            "revision": "main@sha1:abc",
            "digest": "sha256:00ff",
            "path": "a.tar.gz",
            "size": 12,
            "lastUpdateTime": "2025-01-02T03:04:05Z",
            "metadata": {"k": "v"},
            "exportedInputs": {"tenant": "a", "replicas": 3, "env": {"tier": ["x"]}}
        });
        let spec: ArtifactSpec = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(spec.size, Some(12));
        assert_eq!(serde_json::to_value(&spec).unwrap(), json);
    }
}
