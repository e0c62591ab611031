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
use openflux_api::runtime::Metrics as FluxMetrics;
use openflux_api::runtime::{WatchTicker, Watches};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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
        registry.register("openflux_indexed_artifacts", "Artifacts in the owner index", self.indexed_artifacts.clone());
        registry.register("openflux_leader", "1 while this replica holds the leader Lease", self.leader.clone());
    }
}

/// How long a watch may keep failing before the replica stops being ready.
pub const WATCH_STALE_AFTER: Duration = Duration::from_secs(60);
/// A failing watch that has not reported an error for this long (far
/// longer than the watches' longest backoff) reconnected quietly.
pub const WATCH_QUIET_AFTER: Duration = Duration::from_secs(45);

/// Readiness: true once every watch this replica depends on has synced, and
/// while none has been failing for longer than [`WATCH_STALE_AFTER`].
pub struct Readiness {
    /// Watches started and not yet synced.
    pending: AtomicUsize,
    /// Set once the first watch registered, so an empty process is not ready.
    started: AtomicBool,
    watches: Watches,
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
            watches: Watches::new(stale_after, quiet_after),
        }
    }

    /// Registers one watch that must sync before the process is ready; the
    /// returned guard marks it synced, and its failures and recoveries.
    pub fn watch_started(self: &Arc<Self>) -> SyncGuard {
        self.pending.fetch_add(1, Ordering::SeqCst);
        self.started.store(true, Ordering::SeqCst);
        SyncGuard {
            readiness: Some(self.clone()),
            ticker: self.watches.register("watch"),
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
        self.watches
            .broken()
            .map(|(_, for_)| format!("a watch has been failing for {}s", for_.as_secs()))
    }
}

/// Marks one watch as synced when [`SyncGuard::synced`] is called; a guard
/// dropped unsynced (its watch stopped, e.g. the leader's controllers on a
/// lost Lease) no longer holds readiness back.
pub struct SyncGuard {
    readiness: Option<Arc<Readiness>>,
    ticker: WatchTicker,
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
    match s.readiness.why_not_ready() {
        None => (StatusCode::OK, "ok\n".into()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// Serves `/metrics` on `metrics_addr` and `/healthz`, `/readyz` on
/// `health_addr` (plain HTTP, as Flux controllers do) until `shutdown`.
pub async fn serve(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
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
    let metrics_listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on --metrics-addr {metrics_addr}: {e}"))?;
    let health_listener = tokio::net::TcpListener::bind(health_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on --health-addr {health_addr}: {e}"))?;
    tracing::info!(%metrics_addr, %health_addr, "serving metrics and health endpoints");
    let a = axum::serve(metrics_listener, metrics_app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let b =
        axum::serve(health_listener, health_app).with_graceful_shutdown(shutdown.cancelled_owned());
    tokio::try_join!(async { a.await }, async { b.await })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_every_watch_synced() {
        let r = Arc::new(Readiness::default());
        assert!(!r.is_ready(), "nothing started yet");
        let mut a = r.watch_started();
        let mut b = r.watch_started();
        a.synced();
        assert!(!r.is_ready());
        b.synced();
        b.synced();
        assert!(r.is_ready());
        // A watch that stops before it synced holds nothing back.
        let c = r.watch_started();
        assert!(!r.is_ready());
        drop(c);
        assert!(r.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_failing_too_long_makes_the_replica_unready() {
        let r = Arc::new(Readiness::default());
        let mut w = r.watch_started();
        w.synced();
        w.failed();
        assert!(r.is_ready());
        tokio::time::advance(WATCH_QUIET_AFTER - Duration::from_secs(1)).await;
        w.failed();
        tokio::time::advance(WATCH_STALE_AFTER - WATCH_QUIET_AFTER + Duration::from_secs(2)).await;
        w.failed();
        let why = r.why_not_ready().expect("not ready");
        assert!(why.contains("failing for 61s"), "{why}");
        w.ok();
        assert!(r.is_ready());
    }
}
