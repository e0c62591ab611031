//! Notices Flux consumers that run without the `ExternalArtifact` feature
//! gate. Without it, kustomize-controller and helm-controller refuse every
//! ExternalArtifact reference (and so everything openflux exports) with a
//! message in the consumer's `Ready` condition; openflux reads those
//! conditions now and then, and reports the problem once, loudly, with the fix.

use std::time::Duration;

use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::consumers::table::{Consumer, Reader, CONSUMERS};

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
    obj.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] == "Ready" && c["status"] == "False")
        .filter_map(|c| c["message"].as_str())
        .any(|m| m.contains("ExternalArtifact feature gate is disabled"))
}

/// The warning for a consumer kind, naming one refused object.
pub fn warning(kind: &str, controller: &str, example: &str) -> String {
    format!(
        "{kind} {example} cannot read the ExternalArtifact openflux exported: {controller} runs without the ExternalArtifact feature gate. \
         Start it with --feature-gates=ExternalArtifact=true (for example `flux install --components-extra=source-watcher` enables it)"
    )
}

/// Checks the consumers every `period` until `shutdown`.
/// `namespace: None` checks all namespaces.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    metrics: GateMetrics,
    period: Duration,
    shutdown: CancellationToken,
) {
    let gated = gated();
    let mut reported = vec![false; gated.len()];
    loop {
        for (i, (c, controller)) in gated.iter().enumerate() {
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(c.group, c.version, c.kind),
                c.resource,
            );
            let api: Api<DynamicObject> = match &namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            let refused = match first_refused(&api).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(kind = c.kind, error = %e, "checking consumers for the ExternalArtifact gate failed");
                    continue;
                }
            };
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

async fn first_refused(api: &Api<DynamicObject>) -> Result<Option<String>, kube::Error> {
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await?;
        if let Some(o) = page.items.iter().find(|o| refused_for_gate(o)) {
            return Ok(Some(format!(
                "{}/{}",
                o.namespace().unwrap_or_default(),
                o.name_any()
            )));
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => return Ok(None),
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
