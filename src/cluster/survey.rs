//! The survey: on every replica, reads what the export targets depend on
//! (the served source APIs and kinds, the consumers' CRDs, the Flux
//! controllers' Deployments), decides them with [`Facts::decide`] and keeps
//! the result where the webhook and the export controller read it.
//!
//! It reads again when a CRD or a Flux Deployment changes, when the webhook
//! asks ([`Fresh`]: a kind it was about to refuse as not served may belong
//! to a CRD created a moment ago), and at least every [`SURVEY_PERIOD`]. A
//! failed reading keeps the previous facts. A change is
//! logged (one line per consumer kind, with the reason), counted in the
//! `openflux_export_target` metric and announced to the controllers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PartialObjectMeta};
use kube::discovery::{Discovery, Scope as DiscoveryScope};
use kube::runtime::watcher;
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{watch as channel, Notify};
use tokio_util::sync::CancellationToken;

use crate::api::{StockSource, FLUX_SOURCE_GROUP};
use crate::cluster::evidence::has_field;
use crate::cluster::facts::{Facts, Reading};
use crate::cluster::listers::LISTERS;
use crate::cluster::target::{
    ClusterFacts, ExportMode, OciVersion, EXTERNAL_ARTIFACT, OCI_REPOSITORY,
};
use crate::locks;
use crate::telemetry::SyncGuard;
use crate::vocabulary::consumers::{Reader, CONSUMERS};
use crate::watch::retry::retrying;

/// Where an ExternalArtifact carries its producer's inputs (source-controller
/// v1.10 and later).
pub const EXPORTED_INPUTS: [&str; 2] = ["status", "exportedInputs"];

/// The longest time between two readings.
pub const SURVEY_PERIOD: Duration = Duration::from_secs(30);
/// How long a burst of changes is let settle before reading.
const SETTLE: Duration = Duration::from_millis(300);
/// The shortest time between the starts of two readings the webhook asked
/// for: however many requests ask, the survey reads at most this often.
pub const ASK_GAP: Duration = Duration::from_millis(500);

/// Readings the webhook may ask for per [`ASK_WINDOW`], whatever the
/// number of requests that ask: a new CRD is read on its watch event
/// anyway, an asked reading only covers the watch's lag, so references to
/// kinds no API serves cannot make each replica read discovery twice a
/// second for ever.
pub const ASKED_READINGS: usize = 10;
pub const ASK_WINDOW: Duration = Duration::from_secs(60);

/// The starts of the readings asked for in the last [`ASK_WINDOW`].
#[derive(Debug, Default)]
struct AskBudget {
    starts: std::collections::VecDeque<Instant>,
}

impl AskBudget {
    /// Takes a reading from the budget at `now`: when it may start, or
    /// `None` when the budget is spent.
    fn take(&mut self, now: Instant) -> Option<Instant> {
        while self
            .starts
            .front()
            .is_some_and(|s| now.duration_since(*s) >= ASK_WINDOW)
        {
            self.starts.pop_front();
        }
        if self.starts.len() >= ASKED_READINGS {
            return None;
        }
        self.starts.push_back(now);
        Some(now)
    }
}

/// The survey's side of [`Fresh`].
pub struct Asked {
    ask: Arc<Notify>,
    read: channel::Sender<Option<Instant>>,
}

/// Lets a reader of the facts ask the survey to read the cluster now, and
/// wait for a reading that began after a given instant.
#[derive(Clone)]
pub struct Fresh {
    ask: Arc<Notify>,
    read: channel::Receiver<Option<Instant>>,
}

/// A [`Fresh`] and the survey's side of it.
pub fn asking() -> (Asked, Fresh) {
    let ask = Arc::new(Notify::new());
    let (read, seen) = channel::channel(None);
    (
        Asked {
            ask: ask.clone(),
            read,
        },
        Fresh { ask, read: seen },
    )
}

impl Asked {
    /// A reading that began at `began` has ended (its facts are settled).
    pub fn read(&self, began: Instant) {
        self.read.send_replace(Some(began));
    }

    /// Resolves when a reader asks for a reading.
    pub async fn asked(&self) {
        self.ask.notified().await
    }
}

impl Fresh {
    /// Asks for a reading and waits, at most until `deadline`, for one that
    /// began at or after `since` to end. Whether one did.
    pub async fn reading_since(&self, since: Instant, deadline: Instant) -> bool {
        self.ask.notify_one();
        let mut read = self.read.clone();
        let waited = tokio::time::timeout_at(
            deadline,
            read.wait_for(|began| began.is_some_and(|b| b >= since)),
        )
        .await;
        matches!(waited, Ok(Ok(_)))
    }
}

/// Labels of the `openflux_export_target` metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    consumer: String,
    kind: String,
    api_version: String,
}

/// `openflux_export_target{consumer,kind,api_version}`: 1 for the target each
/// consumer kind gets now.
#[derive(Clone, Default)]
pub struct TargetMetrics {
    target: Family<TargetLabels, Gauge>,
}

impl TargetMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "openflux_export_target",
            "1 for the object kind custom sources are exported as for each consumer kind",
            m.target.clone(),
        );
        m
    }

    fn show(&self, facts: &Facts) {
        self.target.clear();
        for (consumer, choice) in &facts.choices {
            if let Ok(choice) = choice {
                let labels = TargetLabels {
                    consumer: consumer.to_string(),
                    kind: choice.target.kind().to_string(),
                    api_version: choice.target.api_version().to_string(),
                };
                self.target.get_or_create(&labels).set(1);
            }
        }
    }
}

/// The survey's settings and where it puts what it decides.
pub struct Survey {
    pub client: Client,
    pub mode: ExportMode,
    pub flux_namespace: String,
    pub facts: Arc<RwLock<Facts>>,
    /// Bumped on every change of the facts.
    pub changed: channel::Sender<u64>,
    pub metrics: TargetMetrics,
    /// Readings asked for by the webhook, and the news of each reading.
    pub asked: Asked,
}

impl Survey {
    /// Runs until `shutdown`; `ready` is marked once a first reading decided
    /// the targets.
    pub async fn run(self, mut ready: SyncGuard, shutdown: CancellationToken) {
        let poke = Arc::new(Notify::new());
        let triggers = tokio::spawn(watch_triggers(
            self.client.clone(),
            self.flux_namespace.clone(),
            poke.clone(),
            shutdown.clone(),
        ));
        let mut budget = AskBudget::default();
        loop {
            let began = Instant::now();
            match read(&self.client, &self.flux_namespace).await {
                Ok(reading) => {
                    self.settle(Facts::decide(self.mode, &reading));
                    ready.synced();
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot read the cluster's source APIs; keeping the export targets as they were")
                }
            }
            self.asked.read(began);
            let next = began + SURVEY_PERIOD;
            // An ask past the budget is left for the next poke or period.
            let stop = loop {
                tokio::select! {
                    _ = poke.notified() => tokio::time::sleep(SETTLE).await,
                    _ = self.asked.asked() => match budget.take(Instant::now()) {
                        Some(at) => tokio::time::sleep_until(at.max(began + ASK_GAP)).await,
                        None => continue,
                    },
                    _ = tokio::time::sleep_until(next) => {}
                    _ = shutdown.cancelled() => break true,
                }
                break false;
            };
            if stop {
                break;
            }
        }
        triggers.abort();
    }

    fn settle(&self, facts: Facts) {
        let before = locks::read(&self.facts).clone();
        if before == facts {
            return;
        }
        for line in facts.changes_since(&before) {
            tracing::info!(target_choice = %line, "export target");
        }
        self.metrics.show(&facts);
        *locks::write(&self.facts) = facts;
        self.changed.send_modify(|n| *n += 1);
    }
}

/// Pokes the survey when a CRD or a Flux controller's Deployment changes.
async fn watch_triggers(
    client: Client,
    flux_namespace: String,
    poke: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let crds = retrying(
        Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client.clone()),
        watcher::Config::default(),
    )
    .filter_map(|e| std::future::ready(e.ok().map(|_| ())));
    let deployments = retrying(
        Api::<PartialObjectMeta<Deployment>>::namespaced(client, &flux_namespace),
        watcher::Config::default().labels(&component_selector()),
    )
    .filter_map(|e| std::future::ready(e.ok().map(|_| ())));
    let mut all = std::pin::pin!(futures::stream::select(crds, deployments));
    loop {
        tokio::select! {
            next = all.next() => match next {
                Some(()) => poke.notify_one(),
                None => break,
            },
            _ = shutdown.cancelled() => break,
        }
    }
}

/// `app.kubernetes.io/component in (...)`: the gated consumers' controllers.
fn component_selector() -> String {
    let components: Vec<&str> = CONSUMERS
        .iter()
        .filter_map(|c| match c.reader {
            Reader::Gated(component) => Some(component),
            _ => None,
        })
        .collect();
    format!("app.kubernetes.io/component in ({})", components.join(","))
}

/// One reading of the cluster.
async fn read(client: &Client, flux_namespace: &str) -> Result<Reading, kube::Error> {
    let discovery = match Discovery::new(client.clone())
        .exclude(&[""])
        .run_aggregated()
        .await
    {
        Ok(d) => d,
        Err(_) => Discovery::new(client.clone()).exclude(&[""]).run().await?,
    };
    let mut cluster = ClusterFacts::default();
    let mut kinds: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for group in discovery.groups() {
        for version in group.versions() {
            for (resource, caps) in group.versioned_resources(version) {
                if resource.group == FLUX_SOURCE_GROUP {
                    match (resource.kind.as_str(), version) {
                        (EXTERNAL_ARTIFACT, "v1") => cluster.external_artifact_served = true,
                        (OCI_REPOSITORY, "v1") => cluster.oci_repository = Some(OciVersion::V1),
                        (OCI_REPOSITORY, "v1beta2") if cluster.oci_repository.is_none() => {
                            cluster.oci_repository = Some(OciVersion::V1beta2)
                        }
                        _ => {}
                    }
                }
                if caps.scope == DiscoveryScope::Namespaced {
                    kinds
                        .entry(resource.kind.clone())
                        .or_default()
                        .insert(resource.group.clone());
                }
            }
        }
    }
    let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut crds = BTreeMap::new();
    for consumer in CONSUMERS.iter() {
        let name = format!("{}.{}", consumer.resource, consumer.group);
        if let Some(crd) = crd_api.get_opt(&name).await? {
            crds.insert(consumer.kind, serde_json::to_value(crd).unwrap_or_default());
        }
    }
    let mut lister_crds = BTreeMap::new();
    for lister in LISTERS.iter() {
        if let Some(crd) = crd_api.get_opt(&lister.crd_name()).await? {
            lister_crds.insert(lister.kind, serde_json::to_value(crd).unwrap_or_default());
        }
    }
    if cluster.external_artifact_served {
        let name = format!(
            "{}.{FLUX_SOURCE_GROUP}",
            StockSource::EXTERNAL_ARTIFACT.plural
        );
        if let Some(crd) = crd_api.get_opt(&name).await? {
            let crd = serde_json::to_value(crd).unwrap_or_default();
            cluster.exported_inputs = has_field(&crd, "v1", &EXPORTED_INPUTS);
        }
    }
    let deployment_api = Api::<Deployment>::namespaced(client.clone(), flux_namespace);
    let list = deployment_api
        .list(&ListParams::default().labels(&component_selector()))
        .await;
    let (deployments_visible, deployments) = match list {
        Ok(list) => {
            let mut by_component: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
            for d in list.items {
                let component = d
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app.kubernetes.io/component"))
                    .cloned()
                    .unwrap_or_default();
                if let Ok(value) = serde_json::to_value(d) {
                    by_component.entry(component).or_default().push(value);
                }
            }
            (true, by_component)
        }
        Err(error) => {
            tracing::debug!(%error, namespace = flux_namespace, "cannot list the Flux controllers' Deployments; their feature gates count as unknown");
            (false, BTreeMap::new())
        }
    };
    Ok(Reading {
        cluster,
        crds,
        lister_crds,
        deployments,
        deployments_visible,
        kinds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However many requests ask, a window holds at most
    /// [`ASKED_READINGS`] asked readings; the budget refills as the
    /// window moves.
    #[tokio::test(start_paused = true)]
    async fn asked_readings_are_bounded_per_window() {
        let mut budget = AskBudget::default();
        let start = Instant::now();
        let mut taken = 0;
        for i in 0..1000u32 {
            let now = start + ASK_GAP * i / 10;
            if budget.take(now).is_some() {
                taken += 1;
            }
        }
        assert_eq!(taken, ASKED_READINGS, "asks within {:?}", ASK_GAP * 100);
        assert!(budget
            .take(start + ASK_WINDOW - Duration::from_millis(1))
            .is_none());
        assert!(budget.take(start + ASK_WINDOW).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_waits_for_a_reading_that_began_after_it_asked() {
        let (asked, fresh) = asking();
        let start = Instant::now();
        asked.read(start);
        tokio::time::advance(Duration::from_millis(10)).await;
        let since = Instant::now();
        // The reading before `since` does not count: nothing more comes, so
        // the wait ends at its deadline.
        assert!(
            !fresh
                .reading_since(since, since + Duration::from_secs(1))
                .await
        );
        assert_eq!(Instant::now(), since + Duration::from_secs(1));
        // A survey that reads when asked.
        let survey = tokio::spawn(async move {
            loop {
                asked.asked().await;
                let began = Instant::now();
                tokio::time::sleep(Duration::from_millis(200)).await;
                asked.read(began);
            }
        });
        let since = Instant::now();
        assert!(
            fresh
                .reading_since(since, since + Duration::from_secs(1))
                .await
        );
        assert_eq!(Instant::now(), since + Duration::from_millis(200));
        // A deadline shorter than the reading: not waited past.
        let since = Instant::now();
        assert!(
            !fresh
                .reading_since(since, since + Duration::from_millis(50))
                .await
        );
        survey.abort();
    }

    #[test]
    fn the_selector_names_the_gated_controllers() {
        assert_eq!(
            component_selector(),
            "app.kubernetes.io/component in (kustomize-controller,helm-controller)"
        );
    }
}
