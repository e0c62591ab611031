//! Notices Flux consumers that run without the `ExternalArtifact` feature
//! gate. Without it, kustomize-controller and helm-controller refuse every
//! ExternalArtifact reference (and so everything openflux exports) with a
//! message in the consumer's `Ready` condition; openflux reads those
//! conditions from the leader's consumer watches (which keep that condition
//! of a consumer refused for the gate, see [`refused_condition`]) now and
//! then, and reports the problem once, loudly, with the fix.

use std::sync::Arc;
use std::time::Duration;

use kube::core::DynamicObject;
use kube::ResourceExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::vocabulary::consumers::{Consumer, Reader, CONSUMERS};

/// The consumer kinds whose controller reads an ExternalArtifact only with
/// its feature gate on, each with that controller (from the consumer table).
fn gated() -> Vec<(&'static Consumer, &'static str)> {
    CONSUMERS
        .iter()
        .filter_map(|c| match c.reader {
            Reader::Gated(controller) => Some((c, controller)),
            _ => None,
        })
        .collect()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabels {
    consumer: String,
}

/// Metric: 1 while some consumer of a kind was refused for the missing gate.
#[derive(Clone, Default)]
pub struct GateMetrics {
    disabled: Family<ConsumerLabels, Gauge>,
}

impl GateMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "openflux_consumer_external_artifact_gate_disabled",
            "1 while a Flux consumer refuses ExternalArtifact references because its ExternalArtifact feature gate is off",
            m.disabled.clone(),
        );
        m
    }
}

/// Whether a consumer's `Ready` message says the gate is off.
pub fn refused_for_gate(obj: &DynamicObject) -> bool {
    refused_condition(obj).is_some()
}

/// The consumer's `Ready` condition when it says the consumer was refused
/// for the gate: `Ready=False` with Flux's message.
pub fn refused_condition(obj: &DynamicObject) -> Option<&serde_json::Value> {
    obj.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] == "Ready" && c["status"] == "False")
        .find(|c| {
            c["message"]
                .as_str()
                .is_some_and(|m| m.contains("ExternalArtifact feature gate is disabled"))
        })
}

/// The first of `objects` refused for the gate, as `namespace/name`.
pub fn first_refused<'a>(objects: impl IntoIterator<Item = &'a DynamicObject>) -> Option<String> {
    objects
        .into_iter()
        .find(|o| refused_for_gate(o))
        .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
}

/// The warning for a consumer kind, naming one refused object.
pub fn warning(kind: &str, controller: &str, example: &str) -> String {
    format!(
        "{kind} {example} cannot read the ExternalArtifact openflux exported: {controller} runs without the ExternalArtifact feature gate. \
         Start it with --feature-gates=ExternalArtifact=true (for example `flux install --components-extra=source-watcher` enables it)"
    )
}

/// Checks the consumers every `period` until `shutdown`. `objects` gives
/// the consumers of a kind as the leader's watch holds them (`None` while
/// that kind is not watched): no API call.
pub async fn run<F>(objects: F, metrics: GateMetrics, period: Duration, shutdown: CancellationToken)
where
    F: Fn(&'static Consumer) -> Option<Vec<Arc<DynamicObject>>>,
{
    let gated = gated();
    let mut reported = vec![false; gated.len()];
    loop {
        for (i, (c, controller)) in gated.iter().enumerate() {
            let Some(watched) = objects(c) else {
                continue;
            };
            let refused = first_refused(watched.iter().map(AsRef::as_ref));
            let gauge = metrics.disabled.get_or_create(&ConsumerLabels {
                consumer: c.kind.to_string(),
            });
            match refused {
                Some(example) => {
                    gauge.set(1);
                    if !reported[i] {
                        tracing::warn!(kind = c.kind, "{}", warning(c.kind, controller, &example));
                        reported[i] = true;
                    }
                }
                None => {
                    gauge.set(0);
                    reported[i] = false;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_gated_consumers_come_from_the_consumer_table() {
        let kinds: Vec<(&str, &str)> = gated().iter().map(|(c, ctl)| (c.kind, *ctl)).collect();
        assert_eq!(
            kinds,
            [
                ("Kustomization", "kustomize-controller"),
                ("HelmRelease", "helm-controller")
            ]
        );
    }

    #[test]
    fn recognises_the_consumers_gate_message() {
        let refused: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "a", "namespace": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "AccessDenied",
              "message": "can't access 'ExternalArtifact/n/httpsource-web', ExternalArtifact feature gate is disabled"}]}
        }))
        .unwrap();
        assert!(refused_for_gate(&refused));
        let fine: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "a", "namespace": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "message": "Applied revision: x"}]}
        }))
        .unwrap();
        assert!(!refused_for_gate(&fine));
        assert!(warning("Kustomization", "kustomize-controller", "n/a")
            .contains("--feature-gates=ExternalArtifact=true"));
    }
}
