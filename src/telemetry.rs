//! openflux's own metrics beside Flux's, and the health endpoints. Logs,
//! flags and Flux's reconcile metrics are the openflux-api runtime kit's.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::runtime::Metrics as FluxMetrics;
use crate::api::runtime::{WatchTicker, Watches};
use crate::locks;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// The controllers' metrics.
#[derive(Clone)]
pub struct Metrics {
    /// Artifact writes made by the mirror, by source kind.
    pub mirrored: Family<KindLabels, Counter>,
    /// Sources the mirror found an Artifact of someone else under its
    /// Artifact's name, by source kind (each conflict counted once).
    pub mirror_conflicts: Family<KindLabels, Counter>,
    /// Exports the API server refused (Artifact `Ready=False`, reason
    /// `ExportFailed`).
    pub export_failures: Counter,
    /// Exported-object writes made by the export controller.
    pub exported: Counter,
    /// Flux's reconcile metrics (`controller_runtime_reconcile_*`,
    /// `gotk_reconcile_duration_seconds`), recorded by each reconcile's guard.
    pub reconciles: FluxMetrics,
    /// Artifacts in the owner index.
    pub indexed_artifacts: Gauge,
    /// 1 while this replica holds the leader Lease.
    pub leader: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            mirrored: Family::default(),
            mirror_conflicts: Family::default(),
            export_failures: Counter::default(),
            exported: Counter::default(),
            reconciles: FluxMetrics::register(registry),
            indexed_artifacts: Gauge::default(),
            leader: Gauge::default(),
        };
        m.describe(registry);
        m
    }

    /// Registers each metric under its name, with its help, one a line.
    #[rustfmt::skip]
    fn describe(&self, registry: &mut Registry) {
        registry.register("openflux_mirrored_writes", "Artifact writes made by the mirror controller", self.mirrored.clone());
        registry.register("openflux_exported_writes", "Exported object writes made by the export controller", self.exported.clone());
        registry.register("openflux_mirror_conflicts", "Sources whose mirrored Artifact name is held by an Artifact openflux does not own", self.mirror_conflicts.clone());
        registry.register("openflux_export_failures", "Exports of an Artifact the API server refused", self.export_failures.clone());
        registry.register("openflux_indexed_artifacts", "Artifacts in the owner index", self.indexed_artifacts.clone());
        registry.register("openflux_leader", "1 while this replica holds the leader Lease", self.leader.clone());
    }
}

/// How long a watch may keep failing before it counts as broken (and, for
/// a serving watch, the replica stops being ready).
pub const WATCH_STALE_AFTER: Duration = Duration::from_secs(60);
/// A failing watch that has not reported an error for this long (far
/// longer than the watches' longest backoff) reconnected quietly.
pub const WATCH_QUIET_AFTER: Duration = Duration::from_secs(45);

/// Readiness covers what serving admission needs, and nothing else: the
/// watch of Artifacts behind the owner index and the survey of export
/// targets. It is true once both have synced, and while neither has been
/// failing for longer than [`WATCH_STALE_AFTER`]. The leader's watches
/// (sources, consumers, exports, Open Flux Artifacts) keep their replica's
/// webhook in the Service when they break: they are reported by the
/// `openflux_broken_watches{scope="controllers"}` metric, an error line
/// from the watch, and the body of `/readyz`.
pub struct Readiness {
    /// Serving watches started and not yet synced.
    pending: AtomicUsize,
    /// Set once the first serving watch registered, so an empty process is
    /// not ready.
    started: AtomicBool,
    serving: Watches,
    controllers: Watches,
    broken: Family<ScopeLabels, Gauge>,
}

/// Which watches a figure counts: `serving` or `controllers`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    pub scope: &'static str,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness::new(WATCH_STALE_AFTER, WATCH_QUIET_AFTER)
    }
}

impl Readiness {
    pub fn new(stale_after: Duration, quiet_after: Duration) -> Self {
        Readiness {
            pending: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            serving: Watches::new(stale_after, quiet_after),
            controllers: Watches::new(stale_after, quiet_after),
            broken: Family::default(),
        }
    }

    /// Registers `openflux_broken_watches`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "openflux_broken_watches",
            "Watches failing for more than 60s; scope serving holds readiness back, scope controllers does not",
            self.broken.clone(),
        );
    }

    /// Registers one watch that serving admission needs: it must sync
    /// before the process is ready, and breaking makes it unready. The
    /// returned guard marks it synced, and its failures and recoveries.
    pub fn serving_watch(self: &Arc<Self>, name: &str) -> SyncGuard {
        self.pending.fetch_add(1, Ordering::SeqCst);
        self.started.store(true, Ordering::SeqCst);
        SyncGuard {
            readiness: Some(self.clone()),
            ticker: self.serving.register(name),
            serving: true,
        }
    }

    /// Registers one of the leader's watches: reported when it breaks, not
    /// needed for readiness.
    pub fn controller_watch(&self, name: &str) -> SyncGuard {
        SyncGuard {
            readiness: None,
            ticker: self.controllers.register(name),
            serving: false,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.why_not_ready().is_none()
    }

    /// What keeps the replica from being ready, if anything.
    pub fn why_not_ready(&self) -> Option<String> {
        if !self.started.load(Ordering::SeqCst) || self.pending.load(Ordering::SeqCst) != 0 {
            return Some("watches not synced yet".into());
        }
        self.serving
            .broken()
            .map(|(name, for_)| format!("watch of {name} failing for {}s", for_.as_secs()))
    }

    /// The leader's watches failing for too long (they do not hold
    /// readiness back), one line each.
    pub fn degraded(&self) -> Vec<String> {
        self.controllers
            .all_broken()
            .into_iter()
            .map(|(name, for_)| {
                format!(
                    "watch of {name} failing for {}s (the controllers' view is stale; admission is not affected)",
                    for_.as_secs()
                )
            })
            .collect()
    }

    /// Sets `openflux_broken_watches` from the watches' state.
    pub fn refresh_metrics(&self) {
        for (scope, watches) in [
            ("serving", &self.serving),
            ("controllers", &self.controllers),
        ] {
            self.broken
                .get_or_create(&ScopeLabels { scope })
                .set(watches.all_broken().len() as i64);
        }
    }
}

/// One watch's handle on [`Readiness`]: a serving watch counts as pending
/// until [`SyncGuard::synced`]; a guard dropped unsynced (its watch
/// stopped) no longer holds readiness back.
pub struct SyncGuard {
    readiness: Option<Arc<Readiness>>,
    ticker: WatchTicker,
    serving: bool,
}

impl SyncGuard {
    pub fn synced(&mut self) {
        if let Some(r) = self.readiness.take() {
            r.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The watch delivered an event.
    pub fn ok(&self) {
        self.ticker.ok();
    }

    /// The watch's stream failed; it retries on its own.
    pub fn failed(&self) {
        self.ticker.failed();
    }

    /// Whether the replica's readiness depends on this watch.
    pub fn serving(&self) -> bool {
        self.serving
    }
}

impl Drop for SyncGuard {
    fn drop(&mut self) {
        self.synced();
    }
}

#[derive(Clone)]
struct HttpState {
    registry: Arc<Mutex<Registry>>,
    readiness: Arc<Readiness>,
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    s.readiness.refresh_metrics();
    let mut body = String::new();
    let encoded = prometheus_client::encoding::text::encode(&mut body, &locks::lock(&s.registry));
    match encoded {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding metrics failed\n".to_string(),
        ),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<HttpState>) -> (StatusCode, String) {
    let degraded = s.readiness.degraded();
    let detail: String = degraded.iter().map(|line| format!("{line}\n")).collect();
    match s.readiness.why_not_ready() {
        None => (StatusCode::OK, format!("ok\n{detail}")),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n{detail}")),
    }
}

/// The listeners of `/metrics` and of `/healthz`, `/readyz`, bound before
/// anything else starts: a port that is taken stops the process at once
/// with an error naming its flag, instead of leaving a replica up that
/// nobody can probe.
pub struct Endpoints {
    metrics: tokio::net::TcpListener,
    health: tokio::net::TcpListener,
}

impl Endpoints {
    pub async fn bind(metrics_addr: SocketAddr, health_addr: SocketAddr) -> anyhow::Result<Self> {
        let metrics = tokio::net::TcpListener::bind(metrics_addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on --metrics-addr {metrics_addr}: {e}"))?;
        let health = tokio::net::TcpListener::bind(health_addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on --health-addr {health_addr}: {e}"))?;
        tracing::info!(%metrics_addr, %health_addr, "serving metrics and health endpoints");
        Ok(Endpoints { metrics, health })
    }

    /// Serves `/metrics` and `/healthz`, `/readyz` (plain HTTP, as Flux
    /// controllers do) until `shutdown`.
    pub async fn serve(
        self,
        registry: Arc<Mutex<Registry>>,
        readiness: Arc<Readiness>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        let state = HttpState {
            registry,
            readiness,
        };
        let metrics_app = Router::new()
            .route("/metrics", get(metrics))
            .with_state(state.clone());
        let health_app = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(state);
        let a = axum::serve(self.metrics, metrics_app)
            .with_graceful_shutdown(shutdown.clone().cancelled_owned());
        let b =
            axum::serve(self.health, health_app).with_graceful_shutdown(shutdown.cancelled_owned());
        tokio::try_join!(async { a.await }, async { b.await })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_every_watch_synced() {
        let r = Arc::new(Readiness::default());
        assert!(!r.is_ready(), "nothing started yet");
        let mut a = r.serving_watch("Artifacts");
        let mut b = r.serving_watch("survey");
        a.synced();
        assert!(!r.is_ready());
        b.synced();
        b.synced();
        assert!(r.is_ready());
        // A watch that stops before it synced holds nothing back.
        let c = r.serving_watch("Artifacts");
        assert!(!r.is_ready());
        drop(c);
        assert!(r.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_failing_too_long_makes_the_replica_unready() {
        let r = Arc::new(Readiness::default());
        let mut w = r.serving_watch("Artifacts");
        w.synced();
        w.failed();
        assert!(r.is_ready());
        tokio::time::advance(WATCH_QUIET_AFTER - Duration::from_secs(1)).await;
        w.failed();
        tokio::time::advance(WATCH_STALE_AFTER - WATCH_QUIET_AFTER + Duration::from_secs(2)).await;
        w.failed();
        let why = r.why_not_ready().expect("not ready");
        assert!(why.contains("Artifacts failing for 61s"), "{why}");
        w.ok();
        assert!(r.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_controller_watch_is_reported_but_keeps_the_replica_ready() {
        let r = Arc::new(Readiness::default());
        let mut registry = Registry::default();
        r.register(&mut registry);
        let mut artifacts = r.serving_watch("Artifacts");
        artifacts.synced();
        // A consumer watch that never syncs (its CRD is gone) holds nothing back.
        let consumers = r.controller_watch("HelmRelease consumers");
        assert!(!consumers.serving());
        assert!(r.is_ready());
        consumers.failed();
        tokio::time::advance(WATCH_QUIET_AFTER - Duration::from_secs(1)).await;
        consumers.failed();
        tokio::time::advance(WATCH_STALE_AFTER - WATCH_QUIET_AFTER + Duration::from_secs(2)).await;
        consumers.failed();
        assert!(r.is_ready(), "{:?}", r.why_not_ready());
        let degraded = r.degraded();
        assert_eq!(degraded.len(), 1);
        assert!(
            degraded[0].contains("HelmRelease consumers failing for 61s"),
            "{degraded:?}"
        );
        r.refresh_metrics();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"openflux_broken_watches{scope="controllers"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"openflux_broken_watches{scope="serving"} 0"#),
            "{text}"
        );
        // Back: nothing to report.
        consumers.ok();
        assert!(r.degraded().is_empty());
        // The same failure on the serving watch makes the replica unready.
        artifacts.failed();
        tokio::time::advance(WATCH_QUIET_AFTER - Duration::from_secs(1)).await;
        artifacts.failed();
        tokio::time::advance(WATCH_STALE_AFTER - WATCH_QUIET_AFTER + Duration::from_secs(2)).await;
        artifacts.failed();
        assert!(!r.is_ready());
        r.refresh_metrics();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"openflux_broken_watches{scope="serving"} 1"#),
            "{text}"
        );
    }
}
