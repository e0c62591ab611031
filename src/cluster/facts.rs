//! What openflux knows of the cluster as it is, and the export target each
//! consumer kind gets from it.
//!
//! [`Facts::decide`] turns what was read (the served source APIs, each
//! consumer's CRD, the Flux controllers' Deployments) into one
//! [`Choice`](crate::cluster::target::Choice) per consumer kind whose CRD is served.
//! Where consumers would get different targets and one target serves them
//! all, they share it, so each source is exported once. The webhook and the
//! export controller read the same `Facts`. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::cluster::evidence::{accepted_kinds, controller_gate, deployment_gate, DeploymentGate};
use crate::cluster::listers::LISTERS;
use crate::cluster::target::{
    choose, Choice, ClusterFacts, ConsumerFacts, ExportMode, Gate, NoTarget, Target, OCI_REPOSITORY,
};
use crate::vocabulary::consumers::{Consumer, Reader, CONSUMERS};

/// What was read of the cluster in one pass.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    pub cluster: ClusterFacts,
    /// Each consumer's CRD by consumer kind; absent: not served.
    pub crds: BTreeMap<&'static str, Value>,
    /// Each lister's CRD by its kind ([`LISTERS`]); absent: not served.
    pub lister_crds: BTreeMap<&'static str, Value>,
    /// Deployments of Flux controllers by their component label.
    pub deployments: BTreeMap<String, Vec<Value>>,
    /// Whether Deployments could be read at all (RBAC, namespace).
    pub deployments_visible: bool,
    /// Namespaced kinds the cluster serves, and the API groups of each.
    pub kinds: BTreeMap<String, BTreeSet<String>>,
}

/// The decisions, for the webhook and the export controller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// Whether a first reading was made; until then nothing is decided.
    pub synced: bool,
    pub cluster: ClusterFacts,
    /// One entry per consumer kind whose CRD is served, and per lister
    /// ([`LISTERS`]) whose CRD offers to read ExternalArtifacts.
    pub choices: BTreeMap<&'static str, Result<Choice, NoTarget>>,
    /// Namespaced kinds the cluster serves, and the API groups of each.
    pub kinds: BTreeMap<String, BTreeSet<String>>,
}

impl Facts {
    /// Decides every consumer's target from one reading.
    pub fn decide(mode: ExportMode, reading: &Reading) -> Self {
        let mut choices = BTreeMap::new();
        let mut facts_of = BTreeMap::new();
        for consumer in CONSUMERS.iter() {
            let Some(crd) = reading.crds.get(consumer.kind) else {
                continue;
            };
            let facts = consumer_facts(consumer, crd, reading);
            choices.insert(consumer.kind, choose(mode, &reading.cluster, &facts));
            facts_of.insert(consumer.kind, facts);
        }
        share_shadows(mode, &reading.cluster, &facts_of, &mut choices);
        for lister in LISTERS.iter() {
            let choice = reading
                .lister_crds
                .get(lister.kind)
                .and_then(|crd| lister.choose(mode, &reading.cluster, crd));
            if let Some(choice) = choice {
                choices.insert(lister.kind, choice);
            }
        }
        Self {
            synced: true,
            cluster: reading.cluster.clone(),
            choices,
            kinds: reading.kinds.clone(),
        }
    }

    /// Facts that give every consumer kind `target`, with the given
    /// `(kind, group)` pairs served: for tests and benchmarks that need no
    /// cluster.
    pub fn everywhere(target: Target, kinds: &[(&str, &str)]) -> Self {
        let mut facts = Self {
            synced: true,
            ..Self::default()
        };
        for consumer in CONSUMERS.iter() {
            let choice = Choice {
                target,
                reason: format!("{target} for every consumer"),
            };
            facts.choices.insert(consumer.kind, Ok(choice));
        }
        for (kind, group) in kinds {
            facts
                .kinds
                .entry(kind.to_string())
                .or_default()
                .insert(group.to_string());
        }
        facts
    }

    /// The target of a consumer kind.
    pub fn target(&self, consumer: &Consumer) -> Result<&Choice, NoTarget> {
        match self.choices.get(consumer.kind) {
            Some(Ok(choice)) => Ok(choice),
            Some(Err(no)) => Err(no.clone()),
            None => Err(NoTarget(format!(
                "the {} CRD ({}.{}) is not served by this cluster",
                consumer.kind, consumer.resource, consumer.group
            ))),
        }
    }

    /// Every target some consumer kind uses: what each Artifact is exported as.
    pub fn targets_in_use(&self) -> BTreeSet<Target> {
        self.choices
            .values()
            .filter_map(|c| c.as_ref().ok())
            .map(|c| c.target)
            .collect()
    }

    /// The targets consumers with references (the webhook rewrites) use:
    /// what an Artifact's `status.exportedRef` names first.
    pub fn reference_targets(&self) -> BTreeSet<Target> {
        CONSUMERS
            .iter()
            .filter_map(|c| self.choices.get(c.kind)?.as_ref().ok())
            .map(|c| c.target)
            .collect()
    }

    /// [`Self::targets_in_use`], those of consumers with references first:
    /// the order an Artifact is exported in, its `status.exportedRef` the
    /// first.
    pub fn export_order(&self) -> Vec<Target> {
        let referenced = self.reference_targets();
        let mut order: Vec<Target> = referenced.iter().copied().collect();
        order.extend(self.targets_in_use().difference(&referenced));
        order
    }

    /// The API groups serving a namespaced kind.
    pub fn groups_of(&self, kind: &str) -> Option<&BTreeSet<String>> {
        self.kinds.get(kind)
    }

    /// One line per consumer kind whose choice differs from `before`, for
    /// the log.
    pub fn changes_since(&self, before: &Facts) -> Vec<String> {
        let mut lines = Vec::new();
        for (kind, choice) in &self.choices {
            if before.choices.get(kind) == Some(choice) {
                continue;
            }
            lines.push(match choice {
                Ok(c) => format!("{kind}: export to {} ({})", c.target, c.reason),
                Err(no) => format!("{kind}: no export target: {no}"),
            });
        }
        lines
    }
}

/// What openflux knows of one consumer kind.
fn consumer_facts(consumer: &Consumer, crd: &Value, reading: &Reading) -> ConsumerFacts {
    let gate = match consumer.reader {
        Reader::Gated(component) => {
            let gates: Vec<DeploymentGate> = reading
                .deployments
                .get(component)
                .into_iter()
                .flatten()
                .filter_map(deployment_gate)
                .collect();
            match reading.deployments_visible {
                true => controller_gate(&gates, false),
                false => Gate::Unknown,
            }
        }
        Reader::Ungated | Reader::NoExternalArtifact(_) => Gate::NotGated,
    };
    ConsumerFacts {
        kind: consumer.kind,
        accepted_kinds: accepted_kinds(crd, consumer.version, consumer.refs.path),
        gate,
        external_artifact_unreadable: match consumer.reader {
            Reader::NoExternalArtifact(why) => Some(why),
            _ => None,
        },
    }
}

/// Where some consumer needs a shadow, a consumer that reads ExternalArtifact
/// without a gate (source-watcher) and takes an OCIRepository too gets the
/// shadow as well: one object per source serves both. A gated consumer whose
/// gate is on keeps its ExternalArtifact.
fn share_shadows(
    mode: ExportMode,
    cluster: &ClusterFacts,
    facts: &BTreeMap<&'static str, ConsumerFacts>,
    choices: &mut BTreeMap<&'static str, Result<Choice, NoTarget>>,
) {
    if mode != ExportMode::Auto {
        return;
    }
    let shadow = choices
        .values()
        .filter_map(|c| c.as_ref().ok())
        .map(|c| c.target)
        .find(|t| t.is_shadow());
    let Some(shadow) = shadow else { return };
    for (kind, choice) in choices.iter_mut() {
        let Ok(current) = choice else { continue };
        if current.target.is_shadow() {
            continue;
        }
        let ungated = CONSUMERS
            .iter()
            .any(|c| c.kind == *kind && c.reader == Reader::Ungated);
        let takes_oci = ungated
            && facts.get(kind).is_some_and(|f| {
                f.accepted_kinds
                    .as_ref()
                    .is_none_or(|k| k.iter().any(|k| k == OCI_REPOSITORY))
            });
        if takes_oci && cluster.oci_repository.is_some() {
            *choice = Ok(Choice {
                target: shadow,
                reason: format!(
                    "shadow OCIRepository, which other consumers need too ({kind} would take an ExternalArtifact: {})",
                    current.reason
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::target::OciVersion;
    use serde_json::json;

    fn crd(version: &str, path: &[&str], kinds: &[&str]) -> Value {
        let mut leaf =
            json!({"type": "object", "properties": {"kind": {"type": "string", "enum": kinds}}});
        for field in path.iter().rev() {
            leaf = json!({"type": "object", "properties": {*field: leaf}});
        }
        json!({"spec": {"versions": [{"name": version, "schema": {"openAPIV3Schema": leaf}}]}})
    }

    fn deployment(args: &[&str], rolled_out: bool) -> Value {
        let n = if rolled_out { 1 } else { 0 };
        json!({
            "metadata": {"generation": 1},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "manager", "args": args}]}}},
            "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": n, "availableReplicas": n},
        })
    }

    fn flux29(gate_on: bool, with_generator: bool) -> Reading {
        let mut r = Reading {
            cluster: ClusterFacts {
                external_artifact_served: true,
                oci_repository: Some(OciVersion::V1),
                exported_inputs: false,
            },
            deployments_visible: true,
            ..Reading::default()
        };
        let ks = [
            "OCIRepository",
            "GitRepository",
            "Bucket",
            "ExternalArtifact",
        ];
        r.crds
            .insert("Kustomization", crd("v1", &["spec", "sourceRef"], &ks));
        let hr = ["OCIRepository", "HelmChart", "ExternalArtifact"];
        r.crds
            .insert("HelmRelease", crd("v2", &["spec", "chartRef"], &hr));
        if with_generator {
            let ag = [
                "Bucket",
                "GitRepository",
                "OCIRepository",
                "ExternalArtifact",
            ];
            r.crds.insert(
                "ArtifactGenerator",
                crd("v1beta1", &["spec", "sources"], &ag),
            );
        }
        let args: &[&str] = if gate_on {
            &["--feature-gates=ExternalArtifact=true"]
        } else {
            &[]
        };
        for c in ["kustomize-controller", "helm-controller"] {
            r.deployments
                .insert(c.to_string(), vec![deployment(args, true)]);
        }
        r
    }

    fn target_of(facts: &Facts, kind: &str) -> Option<Target> {
        facts.choices.get(kind)?.as_ref().ok().map(|c| c.target)
    }

    #[test]
    fn default_flux_gets_shadows_and_the_gate_gets_external_artifacts() {
        let off = Facts::decide(ExportMode::Auto, &flux29(false, false));
        assert_eq!(
            target_of(&off, "Kustomization"),
            Some(Target::Shadow(OciVersion::V1))
        );
        assert_eq!(
            target_of(&off, "HelmRelease"),
            Some(Target::Shadow(OciVersion::V1))
        );
        let on = Facts::decide(ExportMode::Auto, &flux29(true, false));
        assert_eq!(
            on.targets_in_use(),
            BTreeSet::from([Target::ExternalArtifact])
        );
        assert_eq!(on.changes_since(&off).len(), 2);
        assert!(on.changes_since(&on).is_empty());
    }

    #[test]
    fn an_ungated_consumer_shares_the_shadow_others_need() {
        let facts = Facts::decide(ExportMode::Auto, &flux29(false, true));
        assert_eq!(
            facts.targets_in_use(),
            BTreeSet::from([Target::Shadow(OciVersion::V1)])
        );
        let reason = &facts.choices["ArtifactGenerator"].as_ref().unwrap().reason;
        assert!(reason.contains("other consumers"), "{reason}");
        // With the gate on, everyone takes ExternalArtifact.
        let on = Facts::decide(ExportMode::Auto, &flux29(true, true));
        assert_eq!(
            on.targets_in_use(),
            BTreeSet::from([Target::ExternalArtifact])
        );
    }

    #[test]
    fn invisible_or_rolling_deployments_count_as_gate_off() {
        let mut hidden = flux29(true, false);
        hidden.deployments_visible = false;
        let facts = Facts::decide(ExportMode::Auto, &hidden);
        assert!(facts.targets_in_use().iter().all(|t| t.is_shadow()));
        let mut rolling = flux29(true, false);
        rolling.deployments.insert(
            "kustomize-controller".into(),
            vec![deployment(
                &["--feature-gates=ExternalArtifact=true"],
                false,
            )],
        );
        let facts = Facts::decide(ExportMode::Auto, &rolling);
        assert_eq!(
            target_of(&facts, "Kustomization"),
            Some(Target::Shadow(OciVersion::V1))
        );
    }

    fn rsip_crd(types: &[&str]) -> Value {
        json!({"spec": {"versions": [{"name": "v1", "served": true, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {"type": {"type": "string", "enum": types}}}},
        }}}]}})
    }

    /// One row: gate on, flux-operator's CRD (with or without the
    /// ExternalArtifact provider), the targets in use.
    #[test]
    fn flux_operator_gets_external_artifacts_whatever_the_gate() {
        use Target::*;
        let v1 = Shadow(OciVersion::V1);
        let with: &[&str] = &["Static", "ExternalArtifact"];
        let without: &[&str] = &["Static", "GitHubBranch"];
        type Row<'a> = (bool, Option<&'a [&'a str]>, BTreeSet<Target>);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            (false, None, BTreeSet::from([v1])),
            (false, Some(with), BTreeSet::from([v1, ExternalArtifact])),
            (true, Some(with), BTreeSet::from([ExternalArtifact])),
            (false, Some(without), BTreeSet::from([v1])),
        ];
        for (i, (gate_on, rsip, want)) in rows.into_iter().enumerate() {
            let mut reading = flux29(gate_on, false);
            if let Some(types) = rsip {
                reading
                    .lister_crds
                    .insert("ResourceSetInputProvider", rsip_crd(types));
            }
            let facts = Facts::decide(ExportMode::Auto, &reading);
            assert_eq!(facts.targets_in_use(), want, "row {i}");
            let referenced = if gate_on { ExternalArtifact } else { v1 };
            assert_eq!(
                facts.reference_targets(),
                BTreeSet::from([referenced]),
                "row {i}"
            );
            assert_eq!(facts.export_order().first(), Some(&referenced), "row {i}");
            assert_eq!(facts.export_order().len(), want.len(), "row {i}");
            // The consumers with references keep their own targets.
            let ks = CONSUMERS
                .iter()
                .find(|c| c.kind == "Kustomization")
                .unwrap();
            let want_ks = if gate_on { ExternalArtifact } else { v1 };
            assert_eq!(facts.target(ks).unwrap().target, want_ks, "row {i}");
        }
        // Forced shadows: flux-operator's need is said, not met.
        let mut reading = flux29(false, false);
        reading
            .lister_crds
            .insert("ResourceSetInputProvider", rsip_crd(with));
        let facts = Facts::decide(ExportMode::Shadow, &reading);
        assert_eq!(facts.targets_in_use(), BTreeSet::from([v1]));
        let said = facts.choices["ResourceSetInputProvider"]
            .as_ref()
            .unwrap_err();
        assert!(said.0.contains("--export=shadow"), "{said}");
    }

    #[test]
    fn consumers_without_a_crd_are_not_decided() {
        let facts = Facts::decide(ExportMode::Auto, &flux29(false, false));
        assert!(!facts.choices.contains_key("Stack"));
        let stack = CONSUMERS.iter().find(|c| c.kind == "Stack").unwrap();
        let err = facts.target(stack).unwrap_err();
        assert!(err.0.contains("stacks.pulumi.com"), "{err}");
        assert!(!Facts::default().synced);
    }

    #[test]
    fn a_stack_gets_a_shadow_even_where_external_artifact_works() {
        let mut reading = flux29(true, false);
        reading
            .crds
            .insert("Stack", json!({"spec": {"versions": [{"name": "v1"}]}}));
        let facts = Facts::decide(ExportMode::Auto, &reading);
        assert_eq!(
            target_of(&facts, "Stack"),
            Some(Target::Shadow(OciVersion::V1))
        );
        // The gated consumers keep the ExternalArtifact their gate allows.
        assert_eq!(
            facts.targets_in_use(),
            BTreeSet::from([Target::ExternalArtifact, Target::Shadow(OciVersion::V1)])
        );
    }
}
