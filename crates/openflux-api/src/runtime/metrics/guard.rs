//! The guard that records one reconcile in the controller's metrics.

use std::time::Instant;

use super::{ControllerMetrics, ObjectLabels, ReconcileResult, ResultLabels};

/// Records one reconcile when dropped, exactly once: its result (an error
/// unless set otherwise, so an early return or a panic counts as one), its
/// duration in `controller_runtime_reconcile_time_seconds` and
/// `gotk_reconcile_duration_seconds` (or, for a deleted object, the removal
/// of its `gotk_*` series), and the worker it occupied.
#[must_use = "a reconcile is recorded when its guard is dropped"]
pub struct ReconcileGuard {
    pub(super) metrics: ControllerMetrics,
    pub(super) object: Option<ObjectLabels>,
    pub(super) started: Instant,
    pub(super) result: ReconcileResult,
    pub(super) deleted: bool,
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
