//! What every reconcile of the HttpSource controller shares: the context
//! built at start, the memory kept between reconciles, and the error that
//! ends a reconcile early.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::Client;
use openflux_api::producer::storage::{Retention, Storage};
use openflux_api::producer::{PublishError, Publisher};
use openflux_api::runtime::{ControllerId, ControllerMetrics, EventRecorder, Retries, RetryArgs};

use crate::api::HttpSource;
use crate::fetch::Remembered;
use crate::http::Http;
use crate::metrics::SourceMetrics;
use crate::schedule::Attempt;
use crate::serve::Catalog;
use crate::workers::Workers;

/// Field manager of every write this controller makes, and the reporting
/// controller of its events.
pub const FIELD_MANAGER: &str = "openflux-http-source";

/// Errors that end a reconcile early (the API server or storage failed).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("HttpSource has no namespace or uid")]
    Incomplete,
    /// A defect in this controller: the reconcile panicked.
    #[error("the reconcile panicked: {0}")]
    Panicked(String),
}

/// Everything a reconcile needs.
pub struct Context {
    pub client: Client,
    /// The fetches' HTTP clients, behind the network policy.
    pub http: Http,
    pub storage: Storage,
    /// Where `storage` keeps its files.
    pub storage_root: PathBuf,
    /// The artifacts the artifact server may serve.
    pub catalog: Arc<Catalog>,
    /// Writes the Artifacts.
    pub publisher: Publisher,
    /// Kubernetes Events, and notifications with `--events-addr`.
    pub events: EventRecorder,
    /// Flux's metrics of this controller.
    pub metrics: ControllerMetrics,
    /// The fetch metrics of HttpSource.
    pub source_metrics: SourceMetrics,
    pub id: ControllerId,
    /// Largest artifact accepted, in decompressed bytes.
    pub max_size: u64,
    pub retention: Retention,
    /// The failures in a row of each source failing now: its retry delay.
    pub retries: Retries<ObjectRef<HttpSource>>,
    /// The workers a reconcile runs on, shared fairly across namespaces.
    pub workers: Arc<Workers>,
    /// Per source: the last fetch attempt and the validators of the response
    /// the published artifact was built from.
    memory: Mutex<HashMap<ObjectRef<HttpSource>, Memory>>,
}

/// What the controller remembers of a source between reconciles.
#[derive(Debug, Clone)]
pub struct Memory {
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub attempt: Attempt,
    pub remembered: Option<Remembered>,
}

/// The parts of a [`Context`] made at start.
pub struct Parts {
    pub client: Client,
    pub http: Http,
    pub storage: Storage,
    pub storage_root: PathBuf,
    pub catalog: Arc<Catalog>,
    pub events: EventRecorder,
    pub metrics: ControllerMetrics,
    pub source_metrics: SourceMetrics,
    pub max_size: u64,
    pub retention: Retention,
    pub retry: RetryArgs,
    pub workers: Arc<Workers>,
}

impl Context {
    pub fn new(parts: Parts) -> Self {
        Context {
            publisher: Publisher::new(parts.client.clone(), FIELD_MANAGER),
            client: parts.client,
            http: parts.http,
            storage: parts.storage,
            storage_root: parts.storage_root,
            catalog: parts.catalog,
            events: parts.events,
            metrics: parts.metrics,
            source_metrics: parts.source_metrics,
            id: ControllerId::of::<HttpSource>(),
            max_size: parts.max_size,
            retention: parts.retention,
            retries: Retries::new(parts.retry),
            workers: parts.workers,
            memory: Mutex::default(),
        }
    }

    pub fn memory_of(&self, key: &ObjectRef<HttpSource>, uid: Option<&String>) -> Option<Memory> {
        let memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.get(key).filter(|m| m.uid.as_ref() == uid).cloned()
    }

    pub fn remember(&self, key: ObjectRef<HttpSource>, value: Memory) {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.insert(key, value);
    }

    pub fn forget_missing(&self, store: &Store<HttpSource>) {
        let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.retain(|key, _| store.get(key).is_some());
    }
}
