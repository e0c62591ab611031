//! The one shape of every openflux controller, whatever engine runs it: a
//! [`Reconciler`] that brings one object to what it asks for and says what
//! a failure means, driven by an engine that keeps the backoff, catches a
//! reconcile's panic as a failure and asks again after a requeue; the
//! leader wakes each controller through its wake handle only.
//!
//! The engines, each over the same trait:
//! - [`looks::serve`]: one object at a time, from a channel (the
//!   consumers' re-pointing, the Open Flux adopter);
//! - the mirror's runner (`crate::mirror`): many at once, from a backlog
//!   that holds each source once (a stock source kind's mirror);
//! - kube's `Controller` (`crate::export`): many at once, from the
//!   router's triggers (the export controller).

pub mod looks;

use std::future::Future;
use std::time::Duration;

use crate::context::Error;

/// What a reconcile asks for when it succeeds: to be reconciled again after
/// this long, or (`None`) only when something changes.
pub type Requeue = Option<Duration>;

/// One controller: how it reconciles an object and what a failure does.
/// The engine that runs it keeps the failures in a row of each object and
/// reconciles a failed object again after their backoff.
pub trait Reconciler: Send + Sync + 'static {
    /// What the engine hands a reconcile: an object, or the key to read
    /// one by.
    type Object: Send + Sync + 'static;

    /// Brings `object` to what it asks for. A panic in it is a failure
    /// ([`Error::Panicked`]) like any other.
    fn reconcile(
        &self,
        object: &Self::Object,
    ) -> impl Future<Output = Result<Requeue, Error>> + Send;

    /// The error policy: says why `object` failed, in the log or where the
    /// user looks. The engine reconciles it again after `retry_in`.
    fn failed(&self, object: &Self::Object, error: &Error, retry_in: Duration);
}

/// How the leader wakes a running controller without reaching into what
/// it keeps. A controller's own handle may take more (the mirror's, the
/// echo of its own write; the export's, the owners of exported objects).
pub trait WakeHandle {
    /// Reconciles the object `namespace/name` again.
    fn one(&self, namespace: &str, name: &str);

    /// Reconciles every object the controller keeps again.
    fn every(&self);
}
