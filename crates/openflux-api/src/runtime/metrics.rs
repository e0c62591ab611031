//! Metrics under the names and labels Flux's controllers export, so Flux's
//! Grafana dashboards and alerts find the objects.
//!
//! controller-runtime's reconcile metrics (label `controller`: the lower-cased
//! kind, e.g. `httpsource`):
//!
//! - `controller_runtime_reconcile_total{controller,result}`, `result` one
//!   of `success`, `error`, `requeue`, `requeue_after`;
//! - `controller_runtime_reconcile_errors_total{controller}`;
//! - `controller_runtime_reconcile_time_seconds{controller}` (controller-runtime's
//!   buckets, 5ms to 60s), `controller_runtime_max_concurrent_reconciles` and
//!   `controller_runtime_active_workers` (label `controller`).
//!
//! `fluxcd/pkg/runtime/metrics` at the version the pinned Flux controllers
//! use defines three `gotk_*` metrics, with labels `kind`, `name` and
//! `namespace` of the object (Prometheus renames `namespace` to
//! `exported_namespace` when it scrapes, as Flux's dashboards expect):
//!
//! - `gotk_reconcile_duration_seconds`, a histogram with 10 buckets from
//!   10ms to 30m: recorded by every reconcile (the stock controllers record
//!   only this one);
//! - `gotk_suspend_status` (1 while `spec.suspend` is true) and
//!   `gotk_reconcile_condition{type,status}` (1 for the condition's current
//!   status, 0 for the others): still defined, no longer recorded by the
//!   stock controllers, offered here for controllers that want them.
//!
//! The series of a deleted object are removed. `gotk_resource_info` (Flux's
//! cluster dashboard) comes from no controller: kube-state-metrics makes it
//! with a custom resource state configuration (`docs/http-source.md` has
//! HttpSource's).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets_range, Histogram};
use prometheus_client::registry::Registry;

use super::id::ControllerId;

mod labels;
use labels::{ConditionLabels, ConditionType, ControllerLabel, ResultLabels};
pub use labels::{ObjectLabels, ReconcileResult, CONDITION_TYPES, RECONCILE_TIME_BUCKETS};

/// Names (counters without their `_total`) and help texts, as Flux's.
const NAMES: [(&str, &str); 8] = [
    (
        "controller_runtime_reconcile",
        "Total number of reconciliations per controller",
    ),
    (
        "controller_runtime_reconcile_errors",
        "Total number of reconciliation errors per controller",
    ),
    (
        "controller_runtime_reconcile_time_seconds",
        "Length of time per reconciliation per controller",
    ),
    (
        "controller_runtime_max_concurrent_reconciles",
        "Maximum number of concurrent reconciles per controller",
    ),
    (
        "controller_runtime_active_workers",
        "Number of currently used workers per controller",
    ),
    (
        "gotk_reconcile_duration_seconds",
        "The duration in seconds of a GitOps Toolkit resource reconciliation.",
    ),
    (
        "gotk_suspend_status",
        "The current suspend status of a GitOps Toolkit resource.",
    ),
    (
        "gotk_reconcile_condition",
        "The current condition status of a GitOps Toolkit resource reconciliation.",
    ),
];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn reconcile_time() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

/// Buckets of `gotk_reconcile_duration_seconds`:
/// `prometheus.ExponentialBucketsRange(10e-3, 1800, 10)`.
fn gotk_duration() -> Histogram {
    Histogram::new(exponential_buckets_range(10e-3, 1800.0, 10))
}

struct Inner {
    reconcile_total: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ControllerLabel, Counter>,
    reconcile_time: HistogramFamily<ControllerLabel>,
    max_concurrent: Family<ControllerLabel, Gauge>,
    active_workers: Family<ControllerLabel, Gauge>,
    duration: HistogramFamily<ObjectLabels>,
    suspend: Family<ObjectLabels, Gauge>,
    condition: Family<ConditionLabels, Gauge>,
}

/// The metrics of all controllers of a process.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl Metrics {
    /// Registers the metrics in `registry` (without prefix: the names are
    /// Flux's).
    pub fn register(registry: &mut Registry) -> Self {
        let inner = Inner {
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(reconcile_time),
            max_concurrent: Family::default(),
            active_workers: Family::default(),
            duration: Family::new_with_constructor(gotk_duration),
            suspend: Family::default(),
            condition: Family::default(),
        };
        let [total, errors, time, max, active, duration, suspend, condition] = NAMES;
        registry.register(total.0, total.1, inner.reconcile_total.clone());
        registry.register(errors.0, errors.1, inner.reconcile_errors.clone());
        registry.register(time.0, time.1, inner.reconcile_time.clone());
        registry.register(max.0, max.1, inner.max_concurrent.clone());
        registry.register(active.0, active.1, inner.active_workers.clone());
        registry.register(duration.0, duration.1, inner.duration.clone());
        registry.register(suspend.0, suspend.1, inner.suspend.clone());
        registry.register(condition.0, condition.1, inner.condition.clone());
        Metrics(Arc::new(inner))
    }

    /// The metrics of one controller, with its series at zero (as
    /// controller-runtime starts them) and its concurrency recorded.
    pub fn controller(&self, id: &ControllerId, max_concurrent: u16) -> ControllerMetrics {
        let label = ControllerLabel {
            controller: id.name.clone(),
        };
        for result in [
            ReconcileResult::Error,
            ReconcileResult::RequeueAfter,
            ReconcileResult::Requeue,
            ReconcileResult::Success,
        ] {
            let _ = self.0.reconcile_total.get_or_create(&ResultLabels {
                controller: id.name.clone(),
                result: result.label(),
            });
        }
        let _ = self.0.reconcile_errors.get_or_create(&label);
        self.0.active_workers.get_or_create(&label).set(0);
        self.0
            .max_concurrent
            .get_or_create(&label)
            .set(max_concurrent.into());
        ControllerMetrics {
            metrics: self.clone(),
            label,
        }
    }
}

/// The metrics of one controller.
#[derive(Clone)]
pub struct ControllerMetrics {
    metrics: Metrics,
    label: ControllerLabel,
}

impl ControllerMetrics {
    /// Starts recording one reconcile of `object`: see [`ReconcileGuard`].
    pub fn reconcile(&self, object: ObjectLabels) -> ReconcileGuard {
        self.start(Some(object))
    }

    /// Starts recording one reconcile in the controller's metrics only,
    /// without `gotk_*` series for the object: for controllers of many
    /// objects that copy others with series of their own (each series
    /// costs memory and scrape size).
    pub fn reconcile_unlabelled(&self) -> ReconcileGuard {
        self.start(None)
    }

    fn start(&self, object: Option<ObjectLabels>) -> ReconcileGuard {
        self.metrics
            .0
            .active_workers
            .get_or_create(&self.label)
            .inc();
        ReconcileGuard {
            metrics: self.clone(),
            object,
            started: Instant::now(),
            result: ReconcileResult::Error,
            deleted: false,
        }
    }

    /// Records whether `object` is suspended (`gotk_suspend_status`).
    pub fn record_suspend(&self, object: &ObjectLabels, suspended: bool) {
        let value = i64::from(suspended);
        self.metrics.0.suspend.get_or_create(object).set(value);
    }

    /// Records a condition's status, `True`, `False` or `Unknown`
    /// (`gotk_reconcile_condition`): 1 for it, 0 for the two others. The
    /// types Flux records are [`CONDITION_TYPES`]; only those are removed
    /// with a deleted object.
    pub fn record_condition(&self, object: &ObjectLabels, type_: &str, status: &str) {
        for candidate in ["True", "False", "Unknown"] {
            let labels = condition_labels(object, type_, candidate);
            let value = i64::from(candidate == status);
            self.metrics.0.condition.get_or_create(&labels).set(value);
        }
    }

    /// Removes every `gotk_*` series of `object` (it was deleted).
    pub fn delete_object(&self, object: &ObjectLabels) {
        let m = &self.metrics.0;
        m.duration.remove(object);
        m.suspend.remove(object);
        for type_ in CONDITION_TYPES {
            for status in ["True", "False", "Unknown"] {
                m.condition.remove(&condition_labels(object, type_, status));
            }
        }
    }
}

fn condition_labels(object: &ObjectLabels, type_: &str, status: &str) -> ConditionLabels {
    let status = match status {
        "True" => "True",
        "False" => "False",
        _ => "Unknown",
    };
    ConditionLabels {
        kind: object.kind.clone(),
        name: object.name.clone(),
        namespace: object.namespace.clone(),
        condition: ConditionType {
            r#type: type_.to_string(),
            status,
        },
    }
}

/// The text exposition of a registry.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The router of the metrics endpoint, `GET /metrics`.
pub fn router(registry: Registry) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(Arc::new(registry))
}

async fn serve_metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        encode(&registry),
    )
}

/// Records one reconcile when dropped, exactly once: its result (an error
/// unless set otherwise, so an early return or a panic counts as one), its
/// duration in `controller_runtime_reconcile_time_seconds` and
/// `gotk_reconcile_duration_seconds` (or, for a deleted object, the removal
/// of its `gotk_*` series), and the worker it occupied.
#[must_use = "a reconcile is recorded when its guard is dropped"]
pub struct ReconcileGuard {
    metrics: ControllerMetrics,
    object: Option<ObjectLabels>,
    started: Instant,
    result: ReconcileResult,
    deleted: bool,
}

impl ReconcileGuard {
    /// Sets how the reconcile ended.
    pub fn set_result(&mut self, result: ReconcileResult) {
        self.result = result;
    }

    /// Marks the object deleted: its `gotk_*` series are removed.
    pub fn object_deleted(&mut self) {
        self.deleted = true;
    }

    /// The object whose `gotk_*` series this reconcile records, if any.
    pub fn object(&self) -> Option<&ObjectLabels> {
        self.object.as_ref()
    }
}

impl Drop for ReconcileGuard {
    fn drop(&mut self) {
        let m = &self.metrics.metrics.0;
        let label = &self.metrics.label;
        let seconds = self.started.elapsed().as_secs_f64();
        m.reconcile_total
            .get_or_create(&ResultLabels {
                controller: label.controller.clone(),
                result: self.result.label(),
            })
            .inc();
        if self.result == ReconcileResult::Error {
            m.reconcile_errors.get_or_create(label).inc();
        }
        m.reconcile_time.get_or_create(label).observe(seconds);
        match &self.object {
            Some(object) if self.deleted => self.metrics.delete_object(object),
            Some(object) => m.duration.get_or_create(object).observe(seconds),
            None => {}
        }
        m.active_workers.get_or_create(label).dec();
    }
}

#[cfg(test)]
mod tests;
