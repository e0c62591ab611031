//! `openflux_artifacts`: how many Artifacts there are by their `Ready`
//! status and reason, counted from the Artifact watch's store when
//! Prometheus scrapes, so the figure can never drift from the cluster.
//! Untrusted, refused and failed exports show here by reason (the alert
//! rules in `manifests/monitoring/` read it).

use std::collections::BTreeMap;
use std::fmt;

use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::api::Artifact;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ReadyLabels {
    ready: String,
    reason: String,
}

/// The `(ready, reason)` of one Artifact: its `Ready` condition's status and
/// reason, `("Unknown", "")` before openflux looked at it. Mirrored
/// Artifacts carry no status (their source's `Ready` says the rest) and are
/// not kept in the store.
fn ready_of(artifact: &Artifact) -> (String, String) {
    match artifact.ready_condition() {
        Some(c) => (c.status.clone(), c.reason.clone()),
        None => ("Unknown".into(), String::new()),
    }
}

/// Counts `artifacts` by `(ready, reason)`.
pub fn count<'a>(
    artifacts: impl IntoIterator<Item = &'a Artifact>,
) -> BTreeMap<(String, String), i64> {
    let mut counts = BTreeMap::new();
    for artifact in artifacts {
        *counts.entry(ready_of(artifact)).or_insert(0) += 1;
    }
    counts
}

/// The collector registered beside openflux's other metrics.
#[derive(Debug)]
pub struct Census {
    artifacts: Store<Artifact>,
}

impl Census {
    pub fn new(artifacts: Store<Artifact>) -> Self {
        Census { artifacts }
    }
}

impl Collector for Census {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let state = self.artifacts.state();
        let family = Family::<ReadyLabels, Gauge>::default();
        for ((ready, reason), n) in count(state.iter().map(|a| a.as_ref())) {
            family.get_or_create(&ReadyLabels { ready, reason }).set(n);
        }
        let metric = encoder.encode_descriptor(
            "openflux_artifacts",
            "Artifacts of custom sources by the status and reason of their Ready condition",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{conditions, ArtifactSpec, ArtifactStatus};

    fn artifact(ready: Option<(bool, &str)>) -> Artifact {
        let mut a = Artifact::new("a", ArtifactSpec::default());
        if let Some((ok, reason)) = ready {
            a.status = Some(ArtifactStatus {
                conditions: vec![conditions::ready(
                    ok,
                    reason,
                    "m",
                    None,
                    None,
                    &conditions::now(),
                )],
                ..Default::default()
            });
        }
        a
    }

    #[test]
    fn artifacts_are_counted_by_ready_status_and_reason() {
        let all = [
            artifact(Some((true, "Succeeded"))),
            artifact(Some((false, "Untrusted"))),
            artifact(Some((false, "Untrusted"))),
            artifact(Some((false, "ExportFailed"))),
            artifact(None),
        ];
        let counts = count(all.iter());
        let got: Vec<(&str, &str, i64)> = counts
            .iter()
            .map(|((r, why), n)| (r.as_str(), why.as_str(), *n))
            .collect();
        assert_eq!(
            got,
            [
                ("False", "ExportFailed", 1),
                ("False", "Untrusted", 2),
                ("True", "Succeeded", 1),
                ("Unknown", "", 1)
            ]
        );
    }
}
