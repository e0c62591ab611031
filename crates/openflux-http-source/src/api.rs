//! The `HttpSource` custom resource (`sources.openflux.dev/v1alpha1`).
//!
//! An HttpSource names a URL serving a tar.gz of manifests or a single YAML
//! file. Its controller fetches it on an interval, turns it into a normalized
//! artifact and publishes that artifact as an openflux `Artifact`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `apiVersion` of the HttpSource resource.
pub const API_VERSION: &str = "sources.openflux.dev/v1alpha1";
/// Kind of the HttpSource resource.
pub const KIND: &str = "HttpSource";

/// Pattern of a Go duration as Flux accepts it in `interval` and `timeout`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";
/// Longest `interval` accepted (the CRD's CEL rule; the controller clamps
/// to it): a year, 8760h.
pub const MAX_INTERVAL: std::time::Duration = std::time::Duration::from_secs(8760 * 3600);
/// Longest `timeout` accepted (the CRD's CEL rule; the controller clamps
/// to it): 1h.
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);
/// Pattern of an expected digest.
pub const DIGEST_PATTERN: &str = r"^sha256:[a-f0-9]{64}$";

/// The annotation that asks for a reconcile now (as `flux reconcile` sets it).
pub const REQUESTED_AT_ANNOTATION: &str = "reconcile.fluxcd.io/requestedAt";

/// Condition types, as Flux sources write them.
pub mod condition {
    pub const READY: &str = "Ready";
    pub const RECONCILING: &str = "Reconciling";
    pub const STALLED: &str = "Stalled";
}

/// Condition reasons, as Flux sources write them where Flux has one.
pub mod reason {
    /// The artifact is stored and published.
    pub const SUCCEEDED: &str = "Succeeded";
    /// A fetch is under way or will be retried.
    pub const PROGRESSING_WITH_RETRY: &str = "ProgressingWithRetry";
    /// The spec cannot be acted on; fix it.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The referenced Secret is missing or has no usable credentials.
    pub const AUTHENTICATION_FAILED: &str = "AuthenticationFailed";
    /// The URL could not be fetched (network error or HTTP error status).
    pub const FETCH_FAILED: &str = "FetchFailed";
    /// The remote content is neither a tar(.gz) archive nor YAML manifests.
    pub const INVALID_ARTIFACT: &str = "InvalidArtifact";
    /// The archive holds unsafe entries or is too large.
    pub const ARCHIVE_REJECTED: &str = "ArchiveRejected";
    /// The artifact's digest differs from `spec.digest`.
    pub const DIGEST_MISMATCH: &str = "DigestMismatch";
    /// The artifact could not be written to or read from storage.
    pub const STORAGE_OPERATION_FAILED: &str = "StorageOperationFailed";
    /// The Artifact object could not be written.
    pub const ARTIFACT_WRITE_FAILED: &str = "ArtifactWriteFailed";
    /// The URL, a redirect or the proxy is at an address the controller
    /// refuses to fetch from (`--allow-network`).
    pub const BLOCKED_ADDRESS: &str = "BlockedAddress";
    /// Event reason for a newly stored revision (Flux's wording).
    pub const NEW_ARTIFACT: &str = "NewArtifact";
}

fn default_timeout() -> String {
    "60s".to_string()
}

/// Fetches a tar.gz of manifests (or a single YAML file) over HTTP(S) and
/// publishes it as an openflux Artifact.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "sources.openflux.dev",
    version = "v1alpha1",
    kind = "HttpSource",
    namespaced,
    status = "HttpSourceStatus",
    shortname = "hs",
    category = "openflux",
    doc = "HttpSource fetches a tar.gz of manifests or a single YAML file from a URL on an interval and publishes it as an openflux Artifact.",
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".spec.url"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.artifact.revision"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct HttpSourceSpec {
    /// HTTP or HTTPS URL of a tar.gz (or tar) of manifests, or of a single YAML file.
    #[schemars(regex(pattern = r"^https?://"))]
    pub url: String,
    /// How often to check the URL for changes, as a Go duration (e.g. `1m`,
    /// `30s`), greater than zero and at most `8760h`.
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) > duration('0s') && duration(self) <= duration('8760h')",
        "message": "interval must be greater than 0s and at most 8760h"
    }]))]
    pub interval: String,
    /// Timeout of one fetch (redirects and download included), as a Go
    /// duration greater than zero and at most `1h`. Defaults to `60s`.
    #[serde(default = "default_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) > duration('0s') && duration(self) <= duration('1h')",
        "message": "timeout must be greater than 0s and at most 1h"
    }]))]
    pub timeout: String,
    /// Expected digest of the normalized artifact, `sha256:<hex>` (the value
    /// the controller reports in `.status.artifact.digest`). A different
    /// artifact is not published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DIGEST_PATTERN))]
    pub digest: Option<String>,
    /// Secret in the same namespace with credentials: keys `username` and
    /// `password` (basic auth) and/or `headers` (one `Name: value` a line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,
    /// Secret in the same namespace with TLS material, as Flux's sources
    /// read it: `ca.crt` (PEM CA certificates trusted beside the system's
    /// roots) and/or `tls.crt` and `tls.key` (a client certificate and key
    /// for mutual TLS). Type `Opaque` or `kubernetes.io/tls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_secret_ref: Option<LocalObjectReference>,
    /// Secret in the same namespace with the proxy to fetch through, as
    /// Flux's sources read it: `address` (an `http://` or `https://` URL)
    /// and optionally `username` and `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_secret_ref: Option<LocalObjectReference>,
    /// Patterns (gitignore format, one a line) of paths to leave out of the
    /// artifact. When unset, Flux's default exclusions apply (VCS metadata,
    /// CI configuration, images and archives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore: Option<String>,
    /// Stop fetching; the last artifact stays published.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// A reference to an object in the same namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referent.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// What the controller observed and published.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpSourceStatus {
    /// The generation of the spec the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Reconciling and Stalled, with Flux's meaning.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The artifact currently published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<ArtifactSummary>,
    /// The last `reconcile.fluxcd.io/requestedAt` value handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
}

/// The published artifact, with the field names of Flux's `.status.artifact`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactSummary {
    /// Where the artifact can be downloaded.
    pub url: String,
    /// `sha256:<hex>` of the artifact.
    pub revision: String,
    /// `sha256:<hex>` of the artifact.
    pub digest: String,
    /// Path of the artifact relative to the storage root.
    pub path: String,
    /// Size of the artifact in bytes.
    pub size: i64,
    /// When the artifact last changed.
    pub last_update_time: Time,
}

impl HttpSource {
    /// The condition of the given type, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// The committed CRD must be what the types generate: regenerate it with
    /// `openflux-http-source crds > manifests/http-source/crd.yaml`.
    #[test]
    fn committed_crd_matches_the_types() {
        let committed = include_str!("../../../manifests/http-source/crd.yaml");
        let generated = crate::crd_yaml().expect("serialize CRD");
        assert!(
            committed == generated,
            "manifests/http-source/crd.yaml is stale: run `cargo run --bin openflux-http-source -- crds > manifests/http-source/crd.yaml`"
        );
    }

    #[test]
    fn crd_has_the_user_facing_shape() {
        let crd = HttpSource::crd();
        assert_eq!(format!("{}/v1alpha1", crd.spec.group), API_VERSION);
        assert_eq!(crd.spec.names.kind, KIND);
        assert_eq!(crd.spec.names.short_names, Some(vec!["hs".to_string()]));
        assert_eq!(
            crd.spec.names.categories,
            Some(vec!["openflux".to_string()])
        );
        let version = &crd.spec.versions[0];
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<_> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["URL", "Revision", "Ready", "Status", "Age"]);
    }

    #[test]
    fn spec_defaults_and_json_names() {
        let spec: HttpSourceSpec = serde_json::from_value(serde_json::json!({
            "url": "https://example.com/a.tar.gz",
            "interval": "1m",
            "secretRef": {"name": "creds"}
        }))
        .unwrap();
        assert_eq!(spec.timeout, "60s");
        assert!(!spec.suspend);
        assert_eq!(spec.secret_ref.unwrap().name, "creds");
        let spec: HttpSourceSpec = serde_json::from_value(serde_json::json!({
            "url": "https://example.com/a.tar.gz",
            "interval": "1m",
            "certSecretRef": {"name": "tls"},
            "proxySecretRef": {"name": "proxy"}
        }))
        .unwrap();
        assert_eq!(spec.cert_secret_ref.unwrap().name, "tls");
        assert_eq!(spec.proxy_secret_ref.unwrap().name, "proxy");
    }

    /// `interval` and `timeout` are bounded by the schema: the pattern, a
    /// length, and a CEL rule the API server evaluates.
    #[test]
    fn durations_are_bounded_in_the_schema() {
        let crd = serde_json::to_value(HttpSource::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        for (field, max) in [("interval", "8760h"), ("timeout", "1h")] {
            let schema = &spec[field];
            assert_eq!(schema["pattern"], DURATION_PATTERN, "{field}");
            assert_eq!(schema["maxLength"], 32, "{field}");
            let rule = schema["x-kubernetes-validations"][0]["rule"]
                .as_str()
                .unwrap_or_default();
            assert!(
                rule.contains(&format!("duration('{max}')")),
                "{field}: {rule}"
            );
        }
        assert_eq!(
            openflux_api::duration::parse("8760h").unwrap(),
            MAX_INTERVAL
        );
        assert_eq!(openflux_api::duration::parse("1h").unwrap(), MAX_TIMEOUT);
    }
}
