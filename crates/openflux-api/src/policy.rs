//! `SourcePolicy` (`openflux.dev/v1alpha1`, cluster-scoped): which custom
//! source kinds the Flux consumers in which namespaces may deploy from.
//!
//! Isolation works as Kubernetes users know it from NetworkPolicy: a
//! namespace that no SourcePolicy selects may reference every custom source
//! kind (openflux's behaviour without policies); a namespace that one or
//! more SourcePolicies select may reference only the kinds those policies
//! allow together. Stock Flux source kinds are never restricted.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kind of the SourcePolicy resource.
pub const SOURCE_POLICY_KIND: &str = "SourcePolicy";
/// The `kind` of an [`AllowedKind`] that stands for every kind of its group.
pub const ANY_KIND: &str = "*";

/// Which custom source kinds consumers in the selected namespaces may use.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "openflux.dev",
    version = "v1alpha1",
    kind = "SourcePolicy",
    derive = "PartialEq",
    derive = "Default",
    shortname = "spol",
    category = "openflux",
    doc = "SourcePolicy says which custom source kinds the Flux consumers (Kustomization, HelmRelease, ArtifactGenerator, Pulumi Stack) in the namespaces it selects may deploy from. A namespace no SourcePolicy selects may use every kind; a namespace that SourcePolicies select may use only the kinds they allow together. Stock Flux source kinds are never restricted.",
    printcolumn = r#"{"name":"Namespaces","type":"string","jsonPath":".spec.namespaceSelector"}"#,
    printcolumn = r#"{"name":"Allowed Kinds","type":"string","jsonPath":".spec.allowedKinds"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SourcePolicySpec {
    /// Namespaces this policy applies to. An empty selector selects every
    /// namespace.
    #[serde(default)]
    pub namespace_selector: NamespaceSelector,
    /// Custom source kinds the consumers in the selected namespaces may
    /// reference. Empty: none (the selected namespaces may use only the
    /// kinds other policies selecting them allow).
    #[serde(default)]
    pub allowed_kinds: Vec<AllowedKind>,
}

/// A label selector on namespaces, as Kubernetes writes one: every
/// `matchLabels` entry and every expression must hold.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelector {
    /// Labels the namespace must carry with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on the namespace's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One requirement of a [`NamespaceSelector`].
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectorRequirement {
    /// The label key.
    #[schemars(length(min = 1))]
    pub key: String,
    /// How the label's value relates to `values`.
    pub operator: SelectorOperator,
    /// Values for `In` and `NotIn`; empty for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The operator of a [`SelectorRequirement`].
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is set.
    Exists,
    /// The label is not set.
    DoesNotExist,
}

/// A custom source kind: its API group and kind, or `*` for every kind of
/// the group.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllowedKind {
    /// API group of the source kind, e.g. `source.example.dev`.
    #[schemars(length(min = 1))]
    pub group: String,
    /// Kind, e.g. `HttpSource`, or `*` for every kind of the group.
    #[schemars(length(min = 1))]
    pub kind: String,
}

/// The SourcePolicy CustomResourceDefinition as YAML, as
/// `openflux crds --source-policy` prints it and
/// `manifests/crds/sourcepolicies.yaml` carries it.
pub fn source_policy_crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    Ok(format!(
        "---\n{}",
        serde_yaml_ng::to_string(&SourcePolicy::crd())?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// `kubectl get sourcepolicies` shows whom a policy selects and what
    /// it allows. The API server prints the first match of a column's
    /// path, so the whole list is one column, not `[*].kind`.
    #[test]
    fn kubectl_get_shows_the_selector_and_the_allowed_kinds() {
        let crd = serde_json::to_value(SourcePolicy::crd()).unwrap();
        let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap();
        let shown: Vec<&str> = columns
            .iter()
            .filter(|c| c.get("priority").is_none_or(|p| p == 0))
            .map(|c| c["jsonPath"].as_str().unwrap())
            .collect();
        assert_eq!(
            shown,
            [
                ".spec.namespaceSelector",
                ".spec.allowedKinds",
                ".metadata.creationTimestamp"
            ]
        );
    }

    #[test]
    fn the_crd_is_cluster_scoped_and_checks_the_operator() {
        let crd = serde_json::to_value(SourcePolicy::crd()).unwrap();
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let op = &schema["properties"]["spec"]["properties"]["namespaceSelector"]["properties"]
            ["matchExpressions"]["items"]["properties"]["operator"];
        assert_eq!(
            op["enum"],
            serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"])
        );
    }

    #[test]
    fn a_written_policy_reads_back() {
        let policy: SourcePolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "openflux.dev/v1alpha1",
            "kind": "SourcePolicy",
            "metadata": {"name": "team-a"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"team": "a"},
                    "matchExpressions": [{"key": "env", "operator": "Exists"}]},
                "allowedKinds": [{"group": "source.example.dev", "kind": "*"}]
            }
        }))
        .unwrap();
        assert_eq!(policy.spec.allowed_kinds[0].kind, ANY_KIND);
        assert_eq!(
            policy.spec.namespace_selector.match_expressions[0].operator,
            SelectorOperator::Exists
        );
    }
}
