//! Controllers that read ExternalArtifacts without a reference openflux
//! rewrites: they find them by name or labels (flux-operator's
//! ResourceSetInputProvider of type `ExternalArtifact` lists them and
//! templates from their name, namespace, labels and
//! `status.artifact.revision`). For them the export must be an
//! ExternalArtifact whatever the consumers with references get, so where
//! one is installed every custom source is exported as an ExternalArtifact
//! too (beside the shadow OCIRepository, when the consumers need that).
//!
//! Pure: a table and the decision it implies.

use serde_json::Value;

use crate::cluster::evidence::enum_values;
use crate::cluster::target::{Choice, ClusterFacts, ExportMode, NoTarget, Target};

/// A kind whose objects list ExternalArtifacts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lister {
    pub kind: &'static str,
    pub group: &'static str,
    /// The version whose schema is read.
    pub version: &'static str,
    /// Plural resource name.
    pub resource: &'static str,
    /// The field that says an object reads ExternalArtifacts ...
    pub type_path: &'static [&'static str],
    /// ... when it has this value (and the schema's `enum` allows it).
    pub type_value: &'static str,
    /// Who runs it, for messages.
    pub controller: &'static str,
}

impl Lister {
    /// The name of its CRD.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.resource, self.group)
    }

    /// Whether its CRD, as served, lets its objects read ExternalArtifacts:
    /// the `enum` of the type field lists the value (a release before the
    /// provider type existed does not).
    pub fn reads_external_artifacts(&self, crd: &Value) -> bool {
        enum_values(crd, self.version, self.type_path)
            .is_some_and(|values| values.iter().any(|v| v == self.type_value))
    }

    /// What a cluster with this lister's CRD `crd` needs: an ExternalArtifact
    /// for every custom source where one can be written; `None` where the
    /// CRD does not offer the type.
    pub fn choose(
        &self,
        mode: ExportMode,
        cluster: &ClusterFacts,
        crd: &Value,
    ) -> Option<Result<Choice, NoTarget>> {
        if !self.reads_external_artifacts(crd) {
            return None;
        }
        let what = format!(
            "{}s of type {} ({}) list ExternalArtifacts",
            self.kind, self.type_value, self.controller
        );
        Some(match mode {
            ExportMode::Shadow => Err(NoTarget(format!(
                "--export=shadow: {what}, and custom sources are exported as shadow OCIRepositories only"
            ))),
            _ if !cluster.external_artifact_served => Err(NoTarget(format!(
                "{what}, but ExternalArtifact (source.toolkit.fluxcd.io/v1) is not served: Flux 2.7 or later has it"
            ))),
            _ => Ok(Choice {
                target: Target::ExternalArtifact,
                reason: format!("{what} whatever the feature gates say"),
            }),
        })
    }
}

/// Every lister openflux knows.
pub static LISTERS: [Lister; 1] = [Lister {
    kind: "ResourceSetInputProvider",
    group: "fluxcd.controlplane.io",
    version: "v1",
    resource: "resourcesetinputproviders",
    type_path: &["spec", "type"],
    type_value: "ExternalArtifact",
    controller: "flux-operator",
}];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::target::OciVersion;
    use serde_json::json;

    fn crd(version: &str, types: Option<&[&str]>) -> Value {
        let mut field = json!({"type": "string"});
        if let Some(types) = types {
            field["enum"] = json!(types);
        }
        json!({"spec": {"versions": [{"name": version, "served": true, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {"type": field}}},
        }}}]}})
    }

    fn cluster(external_artifact_served: bool) -> ClusterFacts {
        ClusterFacts {
            external_artifact_served,
            oci_repository: Some(OciVersion::V1),
            ..ClusterFacts::default()
        }
    }

    /// One row: mode, ExternalArtifact served, the CRD, the expected answer
    /// (None: not a lister here; Some(true): ExternalArtifact; Some(false):
    /// no target, said).
    #[test]
    fn listers_want_external_artifacts_where_they_can_have_them() {
        use ExportMode::*;
        let rsip = &LISTERS[0];
        let with: &[&str] = &["Static", "OCIArtifactTag", "ExternalArtifact"];
        let without: &[&str] = &["Static", "OCIArtifactTag"];
        #[rustfmt::skip]
        let rows: Vec<(ExportMode, bool, Value, Option<bool>)> = vec![
            (Auto, true, crd("v1", Some(with)), Some(true)),
            (ExternalArtifact, true, crd("v1", Some(with)), Some(true)),
            (Shadow, true, crd("v1", Some(with)), Some(false)),
            (Auto, false, crd("v1", Some(with)), Some(false)),
            // A release before the ExternalArtifact provider.
            (Auto, true, crd("v1", Some(without)), None),
            // No enum, other version, no CRD at all.
            (Auto, true, crd("v1", None), None),
            (Auto, true, crd("v2", Some(with)), None),
            (Auto, true, json!({}), None),
        ];
        for (i, (mode, served, crd, want)) in rows.into_iter().enumerate() {
            let got = rsip.choose(mode, &cluster(served), &crd);
            match (&got, want) {
                (None, None) => {}
                (Some(Ok(choice)), Some(true)) => {
                    assert_eq!(choice.target, Target::ExternalArtifact, "row {i}");
                    assert!(
                        choice.reason.contains("flux-operator"),
                        "row {i}: {choice:?}"
                    );
                }
                (Some(Err(NoTarget(message))), Some(false)) => {
                    assert!(
                        message.contains("ResourceSetInputProvider"),
                        "row {i}: {message}"
                    );
                }
                _ => panic!("row {i}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(
            rsip.crd_name(),
            "resourcesetinputproviders.fluxcd.controlplane.io"
        );
    }
}
