//! The values and label sets of the metrics, as controller-runtime and
//! Flux name them.

use prometheus_client::encoding::EncodeLabelSet;

/// controller-runtime's buckets of `controller_runtime_reconcile_time_seconds`.
pub const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// The condition types Flux records in `gotk_reconcile_condition`.
pub const CONDITION_TYPES: [&str; 3] = ["Ready", "Reconciling", "Stalled"];

/// How a reconcile ended, in controller-runtime's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    /// Done; nothing scheduled.
    Success,
    /// Failed (counted in the errors too).
    Error,
    /// Requeued at once, rate limited.
    Requeue,
    /// Requeued after a delay (a Flux reconciler's usual success: the next
    /// run on the interval).
    RequeueAfter,
}

impl ReconcileResult {
    /// The `result` label.
    pub fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::Requeue => "requeue",
            ReconcileResult::RequeueAfter => "requeue_after",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ControllerLabel {
    pub(super) controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) controller: String,
    pub(super) result: &'static str,
}

/// The object labels of the `gotk_*` metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub kind: String,
    pub name: String,
    pub namespace: String,
}

impl ObjectLabels {
    /// The labels of `obj`.
    pub fn of<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Self {
        use kube::ResourceExt;
        ObjectLabels {
            kind: K::kind(&()).into_owned(),
            name: obj.name_any(),
            namespace: obj.namespace().unwrap_or_default(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ConditionLabels {
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) namespace: String,
    #[prometheus(flatten)]
    pub(super) condition: ConditionType,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ConditionType {
    pub(super) r#type: String,
    pub(super) status: &'static str,
}
