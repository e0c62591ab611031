//! The watch engine every watched kind runs on, below every feature: a
//! watch of one kind in one [`Scope`], listed streamed or in pages
//! ([`streaming`]), each object decoded on its own ([`decoded`]), retried
//! with backoff ([`backoff`], [`retry`]), taking its turn at a first list
//! ([`ListTurns`]) and handing each [`change::Change`] it sees to its caller
//! ([`run::Watch`]). What a change means is decided above: the runtime's
//! router and hub, and the features' own watches.

use std::sync::Arc;

use kube::core::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub mod backoff;
pub mod change;
pub mod decoded;
pub mod depth;
#[cfg(test)]
pub(crate) mod fake_api;
pub mod retry;
pub mod run;
pub mod streaming;

/// What openflux watches: all namespaces or one, and the objects matching
/// `--watch-label-selector` (empty: all).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    pub namespace: Option<String>,
    pub labels: String,
}

/// How every large watch lists: a streaming list where the API server
/// serves one ([`super::streaming`]), consistent reads in pages of
/// [`LIST_PAGE`] objects where it does not. A list at resourceVersion 0
/// would be answered from the API server's watch cache in one response
/// whatever the page limit, so a restart with many objects present would
/// hold a whole kind in memory at once, twice (the body and its objects);
/// paged, it holds a page; streamed, one object. Consistent reads also
/// keep a relist from going back in time.
pub fn streamed() -> watcher::Config {
    watcher::Config::default()
        .page_size(LIST_PAGE)
        .streaming_lists()
}

/// Objects per page of an initial list (client-go's reflector uses 500).
pub const LIST_PAGE: u32 = 500;

impl Scope {
    /// The watcher configuration of the sources and Artifacts in this scope.
    pub fn config(&self) -> watcher::Config {
        let config = streamed();
        if self.labels.is_empty() {
            config
        } else {
            config.labels(&self.labels)
        }
    }

    /// The watcher configuration of what every shard sees whole (the
    /// Artifacts of the owner index, the consumers): this scope's namespace,
    /// without `--watch-label-selector`.
    pub fn whole(&self) -> watcher::Config {
        streamed()
    }

    /// An API for `K` in this scope.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    /// An API for the objects of `resource` in this scope.
    pub fn dynamic_api(&self, client: &Client, resource: &ApiResource) -> Api<DynamicObject> {
        self.api_with(client, resource)
    }

    /// An API for the `K` of kind `dyntype` in this scope.
    pub fn api_with<K>(&self, client: &Client, dyntype: &K::DynamicType) -> Api<K>
    where
        K: Resource<Scope = kube::core::DynamicResourceScope>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, dyntype),
            None => Api::all_with(client.clone(), dyntype),
        }
    }
}

/// Turns at a first list, shared by all watches of a process: each watch
/// lists for the first time when no other is, so a start holds the pages
/// of one list at a time however many kinds it watches (a restart with
/// every Artifact present would otherwise parse a page of Artifacts and a
/// page of each source kind at once). A watch gives its turn up at the end
/// of its list or at its first error, so a kind that cannot be listed
/// holds no one up.
#[derive(Clone, Debug)]
pub struct ListTurns(Arc<Semaphore>);

impl Default for ListTurns {
    fn default() -> Self {
        ListTurns(Arc::new(Semaphore::new(1)))
    }
}

impl ListTurns {
    /// Waits for the turn; it passes on when the permit is dropped.
    pub async fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().acquire_owned().await.ok()
    }
}

/// Keeps every object.
pub fn keep_all<K>(_: &K) -> bool {
    true
}

/// Drops the managed fields, which openflux never reads.
pub fn without_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}
