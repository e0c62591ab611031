//! What leader election talks to: the Lease (on the API server, or
//! simulated) and the clock (tokio's, or simulated).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;

/// A failed Lease call.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Someone else wrote the Lease first (409).
    #[error("the lease was written by another candidate first")]
    Conflict,
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A failure of a simulated store.
    #[error("{0}")]
    Other(String),
}

/// One Lease, read and written whole.
pub trait LeaseStore: Send + Sync {
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;
    /// Creates the Lease; [`StoreError::Conflict`] when it exists.
    fn create(&self, lease: Lease) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Replaces the Lease at the resourceVersion it carries;
    /// [`StoreError::Conflict`] when the Lease changed since.
    fn replace(&self, lease: Lease) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The local clocks: a monotonic one that decides, and the wall clock that
/// only fills the Lease's timestamps for people to read.
pub trait Clock: Send + Sync {
    /// Monotonic time since an origin of the clock's choice.
    fn now(&self) -> Duration;
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send;
    fn wall(&self) -> Timestamp;
}

/// tokio's monotonic clock and the system's wall clock.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(duration)
    }

    fn wall(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// The Lease `name` on the API server.
pub struct KubeLeases {
    api: Api<Lease>,
    name: String,
}

impl KubeLeases {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        KubeLeases {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }
}

fn conflict(e: kube::Error) -> StoreError {
    match e {
        kube::Error::Api(status) if status.code == 409 => StoreError::Conflict,
        e => StoreError::Api(e),
    }
}

impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, StoreError> {
        Ok(self.api.get_opt(&self.name).await?)
    }

    async fn create(&self, lease: Lease) -> Result<(), StoreError> {
        self.api
            .create(&PostParams::default(), &lease)
            .await
            .map(drop)
            .map_err(conflict)
    }

    async fn replace(&self, lease: Lease) -> Result<(), StoreError> {
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(drop)
            .map_err(conflict)
    }
}
