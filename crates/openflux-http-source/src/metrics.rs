//! Prometheus metrics, and the metrics and health endpoints.
//!
//! `openflux_http_source_fetches_total{result}` counts fetches by result:
//! `downloaded` (a full body was read), `not_modified` (a 304 kept the
//! artifact) and `failed`. An unchanged remote shows as `not_modified`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Fetch results.
pub const DOWNLOADED: &str = "downloaded";
pub const NOT_MODIFIED: &str = "not_modified";
pub const FAILED: &str = "failed";

/// Reconcile results.
pub const SUCCESS: &str = "success";
pub const FAILURE: &str = "failure";

pub struct Metrics {
    registry: Registry,
    pub fetches: Family<ResultLabels, Counter>,
    pub reconciles: Family<ResultLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub artifacts_stored: Counter,
    pub downloaded_bytes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("openflux_http_source");
        let fetches = Family::<ResultLabels, Counter>::default();
        registry.register(
            "fetches",
            "Fetches of HttpSource URLs by result (downloaded, not_modified, failed)",
            fetches.clone(),
        );
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles of HttpSources by result",
            reconciles.clone(),
        );
        let reconcile_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "reconcile_duration_seconds",
            "Duration of HttpSource reconciles",
            reconcile_duration.clone(),
        );
        let artifacts_stored = Counter::default();
        registry.register(
            "artifacts_stored",
            "New artifact revisions stored",
            artifacts_stored.clone(),
        );
        let downloaded_bytes = Counter::default();
        registry.register(
            "downloaded_bytes",
            "Bytes of response bodies downloaded",
            downloaded_bytes.clone(),
        );
        Metrics {
            registry,
            fetches,
            reconciles,
            reconcile_duration,
            artifacts_stored,
            downloaded_bytes,
        }
    }
}

impl Metrics {
    pub fn fetch(&self, result: &'static str) {
        self.fetches.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn reconciled(&self, result: &'static str, seconds: f64) {
        self.reconciles
            .get_or_create(&ResultLabels { result })
            .inc();
        self.reconcile_duration.observe(seconds);
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The router of the metrics endpoint.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/metrics", get(metrics))
            .with_state(self.clone())
    }
}

async fn metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

/// Readiness: true once the HttpSource watch has synced.
#[derive(Clone)]
pub struct Health {
    ready: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            ready: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

impl Health {
    pub fn set_ready(&self) {
        self.ready.send_replace(true);
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Resolves once ready.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives as long as self: this cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// `/healthz` (alive) and `/readyz` (watch synced).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(self.clone())
    }
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    if health.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watch not synced")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_fetch_counters_by_result() {
        let m = Metrics::default();
        m.fetch(DOWNLOADED);
        m.fetch(NOT_MODIFIED);
        m.fetch(NOT_MODIFIED);
        let text = m.encode();
        assert!(
            text.contains("openflux_http_source_fetches_total{result=\"not_modified\"} 2"),
            "{text}"
        );
        assert!(text.contains("openflux_http_source_fetches_total{result=\"downloaded\"} 1"));
    }
}
