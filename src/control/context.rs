//! The context every controller of the leader shares, built once when
//! openflux starts: the client, the stores and readings of the process and
//! the write memo. A controller's own state stays with the controller; what
//! one tells another is a value of a floor below both.

use std::sync::{Arc, RwLock};

use kube::api::PatchParams;
use kube::runtime::reflector::Store;
use kube::{Api, Client};

use super::memo::WriteMemo;
use crate::api::runtime::{EventRecorder, RetryArgs};
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
