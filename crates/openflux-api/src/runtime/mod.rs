//! Flux's operational conventions for a controller written in Rust
//! (feature `runtime`), taken from `fluxcd/pkg/runtime` as the pinned Flux
//! controllers use it, so that operators find what they know from Flux:
//!
//! - [`flags`]: `--metrics-addr`, `--health-addr`, `--events-addr`,
//!   `--concurrent`, `--log-level`, `--log-encoding`,
//!   `--enable-leader-election` (and its timings), `--watch-all-namespaces`
//!   and `--watch-label-selector`, as a clap struct to flatten;
//! - [`selector`]: label selectors, parsed and matched in memory;
//! - [`logging`]: JSON (or console) log lines with zap's and
//!   controller-runtime's keys;
//! - [`metrics`]: controller-runtime's reconcile metrics and the `gotk_*`
//!   metrics, recorded once per reconcile by a guard;
//! - [`events`]: Kubernetes Events, and the same events posted to
//!   notification-controller in Flux's event format;
//! - [`leader`]: leader election on a coordination.k8s.io Lease that holds
//!   under stalled API calls and clock skew;
//! - [`health`]: `/healthz` and `/readyz`, the state of the watches
//!   readiness depends on, and serving any of these routers;
//! - [`id`]: the controller's identity in logs and metrics;
//! - [`retry`]: `--min-retry-delay`, `--max-retry-delay` and the per-object
//!   backoff of failed reconciles;
//! - [`panics`]: the message of a reconcile's caught panic.

pub mod events;
pub mod flags;
pub mod health;
pub mod id;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod panics;
pub mod retry;
pub mod selector;

pub use events::{EventRecorder, FluxEvent};
pub use flags::{LeaderElectionArgs, ListenAddr, LogArgs, RuntimeArgs, WatchArgs};
pub use health::{Health, WatchTicker, Watches};
pub use id::ControllerId;
pub use metrics::{ControllerMetrics, Metrics, ObjectLabels, ReconcileGuard, ReconcileResult};
pub use retry::{Retries, RetryArgs};
pub use selector::LabelSelector;
