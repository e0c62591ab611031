//! What the cluster says about its consumers, read from objects openflux can
//! see: the kinds a consumer's CRD accepts in a reference, and the
//! `ExternalArtifact` feature gate of the Flux controllers' Deployments.
//!
//! Pure: functions from JSON objects (as the API server returns them) to the
//! facts [`crate::cluster::target::choose`] takes.

use serde_json::Value;

use crate::cluster::target::{gate_from_args, Gate};

/// The version named `version` of the CRD.
fn crd_version<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))
}

/// The schema of `path` (from the object root) in the CRD's schema for
/// `version`; array fields are walked through their `items`.
fn schema_at<'a>(crd: &'a Value, version: &str, path: &[&str]) -> Option<&'a Value> {
    let version = crd_version(crd, version)?;
    let mut schema = version.pointer("/schema/openAPIV3Schema")?;
    for field in path {
        schema = schema.get("properties")?.get(*field)?;
        while schema.get("type").and_then(Value::as_str) == Some("array") {
            schema = schema.get("items")?;
        }
    }
    Some(schema)
}

/// Whether the served `version` of the CRD has the field at `path`: the
/// API server keeps what is written there instead of pruning it.
pub fn has_field(crd: &Value, version: &str, path: &[&str]) -> bool {
    let served = crd_version(crd, version)
        .and_then(|v| v.get("served"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    served && schema_at(crd, version, path).is_some()
}

/// The values the `enum` of the field at `path` allows, in the CRD's schema
/// for `version`; `None` when the field is missing or lists no enum.
pub fn enum_values(crd: &Value, version: &str, path: &[&str]) -> Option<Vec<String>> {
    let values = schema_at(crd, version, path)?.get("enum")?.as_array()?;
    Some(
        values
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
    )
}

/// The kinds a reference field accepts, from the `enum` of its `kind`
/// property in the CRD's schema for `version`. `path` is the field's path
/// from the object root; array fields are walked through their `items`.
/// `None` when the CRD, version or field is missing or the schema lists no
/// enum (then any kind is accepted).
pub fn accepted_kinds(crd: &Value, version: &str, path: &[&str]) -> Option<Vec<String>> {
    let mut kind = path.to_vec();
    kind.push("kind");
    enum_values(crd, version, &kind)
}

/// One Deployment of a Flux controller, as far as the gate is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeploymentGate {
    /// Whether the Deployment's spec turns the gate on.
    pub spec_on: bool,
    /// Whether the rollout of that spec is complete (every replica runs it).
    pub rolled_out: bool,
}

/// Reads a Deployment: the gate in the arguments of its `manager` container
/// (or its only container), and whether its rollout is complete. `None` when
/// the object has no container.
pub fn deployment_gate(deployment: &Value) -> Option<DeploymentGate> {
    let containers = deployment
        .pointer("/spec/template/spec/containers")?
        .as_array()?;
    let container = containers
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some("manager"))
        .or_else(|| (containers.len() == 1).then(|| &containers[0]))?;
    let mut args: Vec<&str> = Vec::new();
    for field in ["command", "args"] {
        if let Some(list) = container.get(field).and_then(Value::as_array) {
            args.extend(list.iter().filter_map(Value::as_str));
        }
    }
    let int = |pointer: &str| deployment.pointer(pointer).and_then(Value::as_i64);
    let generation = int("/metadata/generation").unwrap_or(0);
    let observed = int("/status/observedGeneration").unwrap_or(-1);
    let replicas = int("/spec/replicas").unwrap_or(1);
    let status_replicas = int("/status/replicas").unwrap_or(0);
    let updated = int("/status/updatedReplicas").unwrap_or(0);
    let available = int("/status/availableReplicas").unwrap_or(0);
    // As `kubectl rollout status` judges it: the controller saw the spec, every
    // replica is updated and available, and no old replica is left.
    let rolled_out = observed >= generation
        && updated >= replicas
        && status_replicas <= updated
        && available >= updated;
    Some(DeploymentGate {
        spec_on: gate_from_args(&args),
        rolled_out,
    })
}

/// The gate of one controller from all its Deployments (several when Flux is
/// sharded): on only when every Deployment turns it on and has rolled out;
/// off as soon as any Deployment's spec turns it off (before its pods
/// restart, so consumers move to a target that works either way); unknown
/// without Deployments. A refusal seen from the controller (a consumer whose
/// status says the gate is disabled) counts as off.
pub fn controller_gate(deployments: &[DeploymentGate], refusal_seen: bool) -> Gate {
    if refusal_seen {
        return Gate::Off;
    }
    if deployments.is_empty() {
        return Gate::Unknown;
    }
    if deployments.iter().all(|d| d.spec_on && d.rolled_out) {
        Gate::On
    } else {
        Gate::Off
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(version: &str, spec_props: Value) -> Value {
        json!({"spec": {"versions": [{"name": version, "schema": {"openAPIV3Schema": {
            "properties": {"spec": {"type": "object", "properties": spec_props}}
        }}}]}})
    }

    #[test]
    fn kinds_come_from_the_schema_enum() {
        let ks = crd(
            "v1",
            json!({"sourceRef": {"type": "object", "properties": {"kind": {"type": "string",
                "enum": ["OCIRepository", "GitRepository", "Bucket", "ExternalArtifact"]}}}}),
        );
        assert_eq!(
            accepted_kinds(&ks, "v1", &["spec", "sourceRef"]).unwrap(),
            [
                "OCIRepository",
                "GitRepository",
                "Bucket",
                "ExternalArtifact"
            ]
        );
        assert_eq!(accepted_kinds(&ks, "v1beta2", &["spec", "sourceRef"]), None);
        assert_eq!(accepted_kinds(&ks, "v1", &["spec", "chartRef"]), None);
    }

    #[test]
    fn list_fields_are_walked_through_items() {
        let ag = crd(
            "v1beta1",
            json!({"sources": {"type": "array", "items": {"type": "object", "properties": {
                "kind": {"type": "string", "enum": ["Bucket", "GitRepository", "OCIRepository"]}}}}}),
        );
        assert_eq!(
            accepted_kinds(&ag, "v1beta1", &["spec", "sources"]).unwrap(),
            ["Bucket", "GitRepository", "OCIRepository"]
        );
    }

    #[test]
    fn a_schema_without_enum_accepts_any_kind() {
        let stack = crd(
            "v1",
            json!({"fluxSource": {"type": "object", "properties": {"sourceRef": {"type": "object",
                "properties": {"kind": {"type": "string"}}}}}}),
        );
        assert_eq!(
            accepted_kinds(&stack, "v1", &["spec", "fluxSource", "sourceRef"]),
            None
        );
        assert_eq!(accepted_kinds(&json!({}), "v1", &["spec"]), None);
        assert_eq!(accepted_kinds(&json!("not a crd"), "v1", &["spec"]), None);
    }

    /// The ExternalArtifact CRD of source-controller v1.9 (no
    /// `exportedInputs`) and of v1.10 (with it), as far as the status goes.
    fn external_artifact(inputs: bool, served: bool) -> Value {
        let mut status = json!({"artifact": {"type": "object"}, "conditions": {"type": "array",
            "items": {"type": "object"}}});
        if inputs {
            status["exportedInputs"] = json!({"type": "object", "additionalProperties":
                {"x-kubernetes-preserve-unknown-fields": true}});
        }
        json!({"spec": {"versions": [{"name": "v1", "served": served, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": {"status": {"type": "object", "properties": status}}
        }}}]}})
    }

    /// One row: CRD, version, path, whether the field is there.
    #[test]
    fn fields_are_found_in_served_versions_only() {
        let inputs: &[&str] = &["status", "exportedInputs"];
        let rows: Vec<(Value, &str, &[&str], bool)> = vec![
            (external_artifact(true, true), "v1", inputs, true),
            (external_artifact(false, true), "v1", inputs, false),
            (external_artifact(true, false), "v1", inputs, false),
            (external_artifact(true, true), "v2", inputs, false),
            (
                external_artifact(true, true),
                "v1",
                &["status", "artifact"],
                true,
            ),
            (external_artifact(true, true), "v1", &["status"], true),
            (external_artifact(true, true), "v1", &["spec"], false),
            // Through the items of a list.
            (
                external_artifact(false, true),
                "v1",
                &["status", "conditions"],
                true,
            ),
            (json!({}), "v1", inputs, false),
            (json!("not a crd"), "v1", inputs, false),
        ];
        for (i, (crd, version, path, want)) in rows.into_iter().enumerate() {
            assert_eq!(has_field(&crd, version, path), want, "row {i}: {path:?}");
        }
    }

    #[test]
    fn enum_values_of_a_plain_field() {
        let rsip = crd(
            "v1",
            json!({"type": {"type": "string", "enum": ["Static", "GitHubBranch", "ExternalArtifact"]}}),
        );
        assert_eq!(
            enum_values(&rsip, "v1", &["spec", "type"]).unwrap(),
            ["Static", "GitHubBranch", "ExternalArtifact"]
        );
        let free = crd("v1", json!({"type": {"type": "string"}}));
        assert_eq!(enum_values(&free, "v1", &["spec", "type"]), None);
        assert_eq!(enum_values(&rsip, "v1", &["spec", "url"]), None);
    }

    fn deployment(args: Value, generation: i64, status: Value) -> Value {
        json!({
            "metadata": {"generation": generation},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "manager", "args": args}
            ]}}},
            "status": status,
        })
    }

    #[test]
    fn deployments_tell_the_gate_and_the_rollout() {
        let done = json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1});
        let rolling = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1});
        let unseen = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1});
        let on = json!([
            "--watch-all-namespaces=true",
            "--feature-gates=ExternalArtifact=true"
        ]);
        let off = json!(["--watch-all-namespaces=true"]);
        let rows = [
            (deployment(on.clone(), 2, done.clone()), true, true),
            (deployment(on.clone(), 2, rolling), true, false),
            (deployment(on, 2, unseen), true, false),
            (deployment(off, 2, done), false, true),
        ];
        for (d, spec_on, rolled_out) in rows {
            assert_eq!(
                deployment_gate(&d),
                Some(DeploymentGate {
                    spec_on,
                    rolled_out
                }),
                "{d}"
            );
        }
        assert_eq!(deployment_gate(&json!({"spec": {}})), None);
    }

    #[test]
    fn the_gate_is_on_only_when_every_deployment_says_so() {
        let on = DeploymentGate {
            spec_on: true,
            rolled_out: true,
        };
        let rolling_on = DeploymentGate {
            spec_on: true,
            rolled_out: false,
        };
        let off = DeploymentGate {
            spec_on: false,
            rolled_out: true,
        };
        assert_eq!(controller_gate(&[], false), Gate::Unknown);
        assert_eq!(controller_gate(&[on], false), Gate::On);
        assert_eq!(controller_gate(&[on, on], false), Gate::On);
        assert_eq!(controller_gate(&[on, off], false), Gate::Off);
        assert_eq!(controller_gate(&[rolling_on], false), Gate::Off);
        assert_eq!(controller_gate(&[on], true), Gate::Off);
    }
}
