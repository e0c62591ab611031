//! What the mirror and export controllers share: the context, the error
//! type, and the memo that keeps a stale cache from causing a second
//! identical write.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, RwLock};

use futures::FutureExt as _;
use kube::api::PatchParams;
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use serde::Serialize;

use crate::api::runtime::{panics, EventRecorder, ReconcileResult};
use crate::api::{Artifact, FIELD_MANAGER};
use crate::cluster::facts::Facts;
use crate::consumers::references::References;
use crate::index::OwnerIndex;
use crate::locks;

use crate::telemetry::Metrics;

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

/// How a reconcile ended, in the words of Flux's reconcile metrics: an
/// openflux reconcile either succeeds (and waits for the next change) or
/// fails (and is retried).
pub fn reconcile_result<T, E>(result: &Result<T, E>) -> ReconcileResult {
    match result {
        Ok(_) => ReconcileResult::Success,
        Err(_) => ReconcileResult::Error,
    }
}

/// State every reconcile of the mirror and export controllers shares, built
/// once when openflux starts.
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
    /// Which exported objects consumers refer to (kept by the leader).
    pub references: Arc<RwLock<References>>,
    /// Whether an Artifact's writer may speak for its source.
    pub verifier: crate::export::verify::Verifier,
    /// Which Artifacts, sources and consumers this replica's controllers
    /// reconcile (`--watch-label-selector`; all without one).
    pub shard: crate::shard::Shard,
    /// How a failed reconcile is retried (`--min-retry-delay`,
    /// `--max-retry-delay`).
    pub retry: crate::api::runtime::RetryArgs,
    /// Turns at a first list, shared by every watch of the process.
    pub list_turns: crate::watch::ListTurns,
    /// Where watches hand the objects they cannot decode.
    pub rejects: crate::watch::decoded::Rejects,
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

/// The most entries the write memo keeps.
pub const MEMO_LIMIT: usize = 100_000;

/// Remembers the last write made for each object, so that a reconcile that
/// runs again before the watch delivered that write (a stale cache) does not
/// send the same write twice: one change of a source costs one API write.
#[derive(Default)]
pub struct WriteMemo {
    written: Mutex<HashMap<String, (Option<String>, u64)>>,
}

impl WriteMemo {
    /// Whether `hash` was written last for `key` while the cache showed the
    /// object at `resource_version`, which it still shows (so the cache has
    /// not caught up with that write yet).
    pub fn already_written(&self, key: &str, resource_version: Option<&str>, hash: u64) -> bool {
        locks::lock(&self.written)
            .get(key)
            .is_some_and(|(rv, h)| *h == hash && rv.as_deref() == resource_version)
    }

    /// Records a write. The memo is bounded: past [`MEMO_LIMIT`] entries it
    /// starts over (forgetting costs at most one repeated write per object).
    pub fn record(&self, key: String, resource_version_before: Option<String>, hash: u64) {
        let mut written = locks::lock(&self.written);
        if written.len() >= MEMO_LIMIT && !written.contains_key(&key) {
            written.clear();
        }
        written.insert(key, (resource_version_before, hash));
    }

    /// Whether `hash` is what was written last for `key`: then the cache
    /// has caught up with that write, which is forgotten.
    pub fn settle(&self, key: &str, hash: u64) -> bool {
        let mut written = locks::lock(&self.written);
        let settled = written.get(key).is_some_and(|(_, h)| *h == hash);
        if settled {
            written.remove(key);
        }
        settled
    }

    pub fn len(&self) -> usize {
        locks::lock(&self.written).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn forget(&self, key: &str) {
        locks::lock(&self.written).remove(key);
    }
}

/// A stable hash of the JSON form of `value`.
pub fn hash_of<T: Serialize>(value: &T) -> Result<u64, serde_json::Error> {
    let json = serde_json::to_string(value)?;
    let mut h = DefaultHasher::new();
    json.hash(&mut h);
    Ok(h.finish())
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

    #[test]
    fn memo_skips_only_while_the_cache_is_stale() {
        let memo = WriteMemo::default();
        assert!(!memo.already_written("k", Some("1"), 7));
        memo.record("k".into(), Some("1".into()), 7);
        assert!(
            memo.already_written("k", Some("1"), 7),
            "cache still at rv 1"
        );
        assert!(
            !memo.already_written("k", Some("2"), 7),
            "object changed since"
        );
        assert!(
            !memo.already_written("k", Some("1"), 8),
            "different content"
        );
        memo.forget("k");
        assert!(!memo.already_written("k", Some("1"), 7));
    }

    #[test]
    fn the_memo_stays_bounded() {
        let memo = WriteMemo::default();
        for i in 0..(MEMO_LIMIT + 10) {
            memo.record(format!("k{i}"), None, 1);
            assert!(memo.len() <= MEMO_LIMIT);
        }
        assert!(memo.already_written(&format!("k{}", MEMO_LIMIT + 9), None, 1));
    }

    #[test]
    fn a_write_seen_by_the_watch_is_settled_once() {
        let memo = WriteMemo::default();
        memo.record("k".into(), Some("1".into()), 7);
        assert!(!memo.settle("k", 8), "another content is not the write");
        assert!(!memo.settle("other", 7));
        assert!(memo.settle("k", 7));
        assert!(memo.is_empty(), "settled writes are forgotten");
        assert!(!memo.settle("k", 7));
    }
}
