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
//!
//! Each ends a reconcile with [`ended`], so a requeue and a failure's
//! backoff mean the same in all three.
//!
//! Beside them, what every controller shares: the reconcile [`Error`] and
//! [`caught`] (a panic as a failure), the [`Context`] built once when
//! openflux starts, the [`WriteMemo`], and [`Referrals`], what the
//! consumers' controller tells the export controller. Nothing here imports
//! a controller: each keeps its own state, and what one tells another is
//! a value of a floor below both.

pub mod looks;
mod memo;

use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::FutureExt as _;
use kube::api::PatchParams;
use kube::runtime::reflector::Store;
use kube::{Api, Client};

pub use memo::{hash_of, WriteMemo, MEMO_LIMIT};

use crate::api::runtime::{panics, EventRecorder, ReconcileResult, Retries, RetryArgs};
use crate::api::{Artifact, FIELD_MANAGER};
use crate::cluster::facts::Facts;
use crate::index::OwnerIndex;
use crate::shard::Shard;
use crate::telemetry::Metrics;
use crate::watch::decoded::Rejects;
use crate::watch::ListTurns;

/// State every reconcile of the leader's controllers shares, built once
/// when openflux starts.
pub struct Context {
    pub client: Client,
    /// All Artifacts in the watched namespaces, as the Artifact watch keeps them.
    pub artifacts: Store<Artifact>,
    pub index: Arc<RwLock<OwnerIndex>>,
    pub metrics: Metrics,
    pub memo: WriteMemo,
    /// Kubernetes Events, and with `--events-addr` the same posted to
    /// notification-controller.
    pub events: EventRecorder,
    /// The export targets, as the survey decided them.
    pub facts: Arc<RwLock<Facts>>,
    /// Which Artifacts, sources and consumers this replica's controllers
    /// reconcile (`--watch-label-selector`; all without one).
    pub shard: Shard,
    /// How a failed reconcile is retried (`--min-retry-delay`,
    /// `--max-retry-delay`).
    pub retry: RetryArgs,
    /// Turns at a first list, shared by every watch of the process.
    pub list_turns: ListTurns,
    /// Where watches hand the objects they cannot decode.
    pub rejects: Rejects,
}

impl Context {
    pub fn artifact_api(&self, namespace: &str) -> Api<Artifact> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

/// Server-side apply as openflux, taking over fields other managers set.
pub fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Errors of a reconcile; all are retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("encoding an object: {0}")]
    Json(#[from] serde_json::Error),
    #[error("object has no {0}")]
    MissingField(&'static str),
    /// Not failed, but not done yet: the look waits for another
    /// controller's work (an export to be written) and is tried again
    /// after its backoff.
    #[error("{0}")]
    Waiting(String),
    /// A defect in openflux: the reconcile panicked.
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
}

/// Runs `reconcile`; a panic in it becomes a failed reconcile
/// ([`Error::Panicked`]), retried after a backoff like any other failure,
/// instead of ending the task that runs every reconcile of its controller.
pub async fn caught<T>(reconcile: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
    AssertUnwindSafe(reconcile)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(Error::Panicked(panics::message(&*panic))))
}

/// Ends a reconcile of `object`, whose failures in a row `retries` counts
/// under `key`, and says when to reconcile it again: after a success, its
/// failures are forgotten and the requeue it asked for is taken; after a
/// failure, one more is counted, the reconciler's error policy
/// ([`Reconciler::failed`]) is told, and the object waits its backoff.
/// Every engine ends its reconciles here.
pub fn ended<R, K>(
    reconciler: &R,
    retries: &Retries<K>,
    key: &K,
    object: &R::Object,
    result: Result<Requeue, &Error>,
) -> Requeue
where
    R: Reconciler,
    K: Clone + Eq + Hash,
{
    match result {
        Ok(requeue) => {
            retries.succeeded(key);
            requeue
        }
        Err(error) => {
            let delay = retries.failed(key.clone());
            reconciler.failed(object, error, delay);
            Some(delay)
        }
    }
}

/// How a reconcile ended, in the words of Flux's reconcile metrics: an
/// openflux reconcile either succeeds (and waits for the next change) or
/// fails (and is retried).
pub fn reconcile_result<T, E>(result: &Result<T, E>) -> ReconcileResult {
    match result {
        Ok(_) => ReconcileResult::Success,
        Err(_) => ReconcileResult::Error,
    }
}

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

/// What the consumers' controller tells the export controller: whether
/// Flux may still read the exported object `kind` `namespace`/`name` (a
/// consumer names it, or has not reconciled its move away from it yet).
/// The consumers' watches keep the answer; the wiring hands it to the
/// export controller, which asks before it deletes an export no longer
/// wanted.
pub trait Referrals: Send + Sync {
    fn refers_to(&self, namespace: &str, kind: &str, name: &str) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reconcile_that_panics_is_a_failed_one_with_the_panics_message() {
        let fixed = caught(async {
            if true {
                panic!("a defect");
            }
            Ok(())
        })
        .await;
        assert!(matches!(fixed, Err(Error::Panicked(m)) if m == "a defect"));
        let formatted = caught(async {
            if true {
                panic!("a defect in {}", "apps/web");
            }
            Ok(())
        })
        .await;
        assert!(matches!(formatted, Err(Error::Panicked(m)) if m == "a defect in apps/web"));
        assert!(matches!(caught(async { Ok(7) }).await, Ok(7)));
    }

    /// A controller that only records what its error policy was told.
    #[derive(Default)]
    struct Told(std::sync::Mutex<Vec<(String, Duration)>>);

    impl Reconciler for Told {
        type Object = String;

        async fn reconcile(&self, _: &String) -> Result<Requeue, Error> {
            Ok(None)
        }

        fn failed(&self, object: &String, error: &Error, retry_in: Duration) {
            let told = format!("{object}: {error}");
            self.0.lock().unwrap().push((told, retry_in));
        }
    }

    #[test]
    fn a_reconcile_ends_with_its_requeue_or_its_backoff() {
        let retries = Retries::new(crate::api::runtime::RetryArgs {
            min_retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(3),
        });
        let told = Told::default();
        let object = "apps/web".to_string();
        let key = 7;
        let failing = Error::MissingField("spec");
        let end = |result| ended(&told, &retries, &key, &object, result);
        let later = Some(Duration::from_secs(30));
        assert_eq!(end(Ok(later)), later, "a success takes its requeue");
        assert_eq!(end(Err(&failing)), Some(Duration::from_secs(1)));
        assert_eq!(end(Err(&failing)), Some(Duration::from_secs(2)));
        assert_eq!(end(Err(&failing)), Some(Duration::from_secs(3)), "capped");
        assert_eq!(retries.len(), 1);
        assert_eq!(end(Ok(None)), None);
        assert!(retries.is_empty(), "a success forgets the failures");
        assert_eq!(end(Err(&failing)), Some(Duration::from_secs(1)));
        let told = told.0.lock().unwrap();
        assert_eq!(told.len(), 4, "the error policy hears of each failure");
        assert_eq!(told[0].0, "apps/web: object has no spec");
    }
}
