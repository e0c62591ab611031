//! The one watcher loop every watched kind runs (Artifacts, each stock source
//! kind, the objects openflux exported), and the [`Hub`] that routes what it
//! sees: the router decides, the hub changes the owner index and hands the
//! wakes to whoever listens (the leader's controllers).

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::backoff::WatchBackoff;
use super::decoded::Rejects;
use super::router::{route, Change, Event};
use super::streaming;
use super::wakes::{WakeReceiver, WakeSender};
use crate::index::OwnerIndex;
use crate::locks;
use crate::telemetry::{Metrics, SyncGuard, WATCH_STALE_AFTER};

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

/// One watch: what to watch, and how.
pub struct Watch<K: Resource> {
    pub api: Api<K>,
    pub config: watcher::Config,
    /// Drops what openflux never reads before an object is stored.
    pub slim: fn(&mut K),
    /// Whether the store keeps an object; every object is routed either way
    /// (the Artifacts the mirror writes live in the owner index only).
    pub keep: fn(&K) -> bool,
    /// What is watched, for people reading the logs.
    pub what: String,
    /// What to check when the watch fails, for people reading the logs.
    pub hint: &'static str,
    /// Whose turn it is to list ([`ListTurns`]).
    pub turns: ListTurns,
    /// Where objects that cannot be decoded go.
    pub rejects: Rejects,
}

impl<K> Watch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    /// Runs until `shutdown`: keeps `writer`'s store (none: the changes
    /// alone, for a caller that keeps its own), marks `synced` once the
    /// first complete list is in, and hands each change to `sink`. A
    /// failing watch is retried with backoff; the first failure of a streak
    /// is a warning.
    pub async fn run(
        self,
        mut writer: Option<Writer<K>>,
        mut synced: SyncGuard,
        mut sink: impl FnMut(Change<'_, K>),
        shutdown: CancellationToken,
    ) {
        let Watch {
            api,
            config,
            slim,
            keep,
            what,
            hint,
            turns,
            rejects,
        } = self;
        let reader = writer.as_ref().map(Writer::as_reader);
        let kept = |object: &K, writer: &Option<Writer<K>>| writer.is_some() && keep(object);
        // The watcher lists on its first poll, so only after the turn.
        let mut turn = tokio::select! {
            turn = turns.take() => turn,
            _ = shutdown.cancelled() => return,
        };
        let mut events = retrying_with(api, config, rejects).modify(slim).boxed();
        // When the current streak of errors began, and whether it was
        // reported as broken.
        let mut failing: Option<(tokio::time::Instant, bool)> = None;
        loop {
            let event = tokio::select! {
                e = events.try_next() => e,
                _ = shutdown.cancelled() => return,
            };
            let event = match event {
                Ok(Some(event)) => event,
                Ok(None) => return,
                Err(error) => {
                    drop(turn.take());
                    synced.failed();
                    match &mut failing {
                        None => {
                            tracing::warn!(watch = %what, %error, hint, "watch failed; retrying");
                            failing = Some((tokio::time::Instant::now(), false));
                        }
                        Some((since, reported))
                            if !*reported && since.elapsed() > WATCH_STALE_AFTER =>
                        {
                            *reported = true;
                            let failing_for = since.elapsed().as_secs();
                            if synced.serving() {
                                tracing::error!(watch = %what, %error, hint, failing_for, "watch broken; this replica is not ready until it recovers");
                            } else {
                                tracing::error!(watch = %what, %error, hint, failing_for, "watch broken; the controllers' view is stale, the webhook keeps serving");
                            }
                        }
                        Some(_) => {
                            tracing::debug!(watch = %what, %error, "watch still failing");
                        }
                    }
                    continue;
                }
            };
            if works(&event) {
                if let Some((since, true)) = failing {
                    tracing::info!(watch = %what, failed_for = since.elapsed().as_secs(), "watch recovered");
                }
                failing = None;
                synced.ok();
            }
            match event {
                watcher::Event::Apply(object) if !kept(&object, &writer) => {
                    // Out of the store (it may have been kept before), still routed.
                    let gone = watcher::Event::Delete(object);
                    if let Some(writer) = &mut writer {
                        writer.apply_watcher_event(&gone);
                    }
                    if let watcher::Event::Delete(object) = &gone {
                        sink(Change::Applied(object));
                    }
                }
                watcher::Event::InitApply(object) if !kept(&object, &writer) => {
                    sink(Change::Listed(&object));
                }
                event => {
                    if let Some(writer) = &mut writer {
                        writer.apply_watcher_event(&event);
                    }
                    match &event {
                        watcher::Event::Apply(object) => sink(Change::Applied(object)),
                        watcher::Event::Delete(object) => sink(Change::Deleted(object)),
                        watcher::Event::InitDone => {
                            tracing::debug!(watch = %what, "watch synced");
                            drop(turn.take());
                            synced.synced();
                            let kept = reader.as_ref().map(|r| r.state()).unwrap_or_default();
                            sink(Change::Relisted(&kept));
                        }
                        watcher::Event::Init => sink(Change::Listing),
                        watcher::Event::InitApply(_) => {}
                    }
                }
            }
        }
    }
}

/// [`retrying_with`] whose objects that cannot be decoded are only logged.
pub fn retrying<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    retrying_with(api, config, Rejects::default())
}

/// [`streaming::watcher`]`(api, config, rejects)`, retried after an error
/// with [`WatchBackoff`], which starts again from its first step only once
/// the watch [`works`].
pub fn retrying_with<K>(
    api: Api<K>,
    config: watcher::Config,
    rejects: Rejects,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Clone + Eq + Hash,
{
    let backoff = WatchBackoff::default();
    let worked = backoff.clone();
    streaming::watcher(api, config, rejects)
        .backoff(backoff)
        .inspect(move |event| {
            if event.as_ref().is_ok_and(works) {
                worked.worked();
            }
        })
}

/// Whether a watch event proves that the watch works: anything the API
/// server sent. The watcher announces every attempt at a list with an
/// Init, also each retry of a list that keeps failing, so an Init proves
/// nothing.
pub fn works<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init)
}

/// Keeps every object.
pub fn keep_all<K>(_: &K) -> bool {
    true
}

/// Drops the managed fields, which openflux never reads.
pub fn without_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Where every watch's changes go: through the router, into the owner index
/// and out to the listeners of wakes.
#[derive(Clone)]
pub struct Hub {
    index: Arc<RwLock<OwnerIndex>>,
    metrics: Metrics,
    wakes: WakeSender,
}

impl Hub {
    pub fn new(index: Arc<RwLock<OwnerIndex>>, metrics: Metrics) -> Self {
        Self {
            index,
            metrics,
            wakes: WakeSender::default(),
        }
    }

    /// Routes one event and applies what the router decided.
    pub fn take(&self, event: Event<'_>) {
        let routed = route(&event, &locks::read(&self.index));
        if let Some(change) = routed.index {
            // The watch of Artifacts is the index's only writer, so nothing
            // changed it since the router read it.
            let mut index = locks::write(&self.index);
            index.change(change);
            self.metrics.indexed_artifacts.set(index.len() as i64);
        }
        if !routed.wake.is_empty() {
            self.wakes.send(routed.wake);
        }
    }

    /// Listens to the wakes from now on (one listener: the leader).
    pub fn subscribe(&self) -> WakeReceiver {
        self.wakes.subscribe()
    }
}

/// A fake API server for unit tests of watches.
#[cfg(test)]
pub(crate) mod fake_api {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use axum::http::{Request, Response, StatusCode};
    use kube::Client;
    use serde_json::json;
    use tokio::sync::mpsc::UnboundedReceiver;

    /// How the fake answers one list.
    pub enum List {
        /// An empty list.
        Empty,
        /// 403 Forbidden.
        Refused,
        /// An empty list, once the receiver turns true.
        After(tokio::sync::watch::Receiver<bool>),
    }

    /// Serves lists and watches of any resource: the last path segment of
    /// each list request (a paged list, or a watch that streams its list)
    /// goes to the returned channel; `serves(path, n)` says how the `n`th
    /// list of `path` (from 0) is answered. A watch of a path in `gone` is
    /// answered with 410 Gone (its client must list again); any other
    /// watch never ends.
    pub fn lists_server(
        serves: impl Fn(&str, usize) -> List + Send + Sync + 'static,
        gone: &'static [&'static str],
    ) -> (Client, UnboundedReceiver<String>) {
        let (seen, lists) = tokio::sync::mpsc::unbounded_channel();
        let counts = std::sync::Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let serves = std::sync::Arc::new(serves);
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let (seen, counts, serves) = (seen.clone(), counts.clone(), serves.clone());
            async move {
                let path = request.uri().path().rsplit('/').next().unwrap_or("");
                let query = request.uri().query().unwrap_or("");
                let streams = query.contains("sendInitialEvents=true");
                if query.contains("watch=true") && !streams {
                    if !gone.contains(&path) {
                        std::future::pending::<()>().await;
                    }
                    let event = json!({"type": "ERROR", "object": {"kind": "Status",
                        "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                        "message": "too old resource version", "code": 410}});
                    return Ok(answer_with(StatusCode::OK, event.to_string()));
                }
                let _ = seen.send(path.to_string());
                let n = {
                    let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
                    let n = counts.entry(path.to_string()).or_default();
                    *n += 1;
                    *n - 1
                };
                let answer = serves(path, n);
                if let List::After(mut release) = answer {
                    let _ = release.wait_for(|go| *go).await;
                } else if let List::Refused = answer {
                    let status = json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "Forbidden", "code": 403});
                    return Ok(answer_with(StatusCode::FORBIDDEN, status.to_string()));
                }
                let body = if streams {
                    json!({"type": "BOOKMARK", "object": {"kind": "Thing", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "1", "annotations":
                            {crate::runtime::streaming::INITIAL_EVENTS_END: "true"}}}})
                } else {
                    json!({"apiVersion": "v1", "kind": "List",
                        "metadata": {"resourceVersion": "1"}, "items": []})
                };
                Ok::<_, std::convert::Infallible>(answer_with(StatusCode::OK, body.to_string()))
            }
        });
        (Client::new(service, "default"), lists)
    }

    fn answer_with(status: StatusCode, body: String) -> Response<kube::client::Body> {
        let mut response = Response::new(kube::client::Body::from(body.into_bytes()));
        *response.status_mut() = status;
        response
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::{Artifact, ArtifactSpec};
    use crate::telemetry::Readiness;
    use fake_api::{lists_server, List};
    use kube::runtime::watcher::{InitialListStrategy, ListSemantic};
    use tokio::sync::mpsc::UnboundedReceiver;

    fn refused(path: &str, _: usize) -> List {
        if path == "refused" {
            List::Refused
        } else {
            List::Empty
        }
    }

    /// The next list request, or `None` when none comes while every task
    /// waits (the clock is paused, so the wait ends only when all are idle).
    async fn next_list(lists: &mut UnboundedReceiver<String>) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(10), lists.recv())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn watches_list_for_the_first_time_one_after_another() {
        let (go, release) = tokio::sync::watch::channel(false);
        let (client, mut lists) = lists_server(
            move |path, _| match path {
                "held" => List::After(release.clone()),
                _ => List::Empty,
            },
            &[],
        );
        let (turns, readiness) = (ListTurns::default(), Readiness::default());
        let shutdown = CancellationToken::new();
        start_watch(&client, "held", &turns, &readiness, &shutdown);
        assert_eq!(next_list(&mut lists).await.as_deref(), Some("held"));
        start_watch(&client, "other", &turns, &readiness, &shutdown);
        assert_eq!(
            next_list(&mut lists).await,
            None,
            "listed during another's first list"
        );
        go.send_replace(true);
        assert_eq!(next_list(&mut lists).await.as_deref(), Some("other"));
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_cannot_list_gives_its_turn_up() {
        let (client, mut lists) = lists_server(refused, &[]);
        let (turns, readiness) = (ListTurns::default(), Readiness::default());
        let shutdown = CancellationToken::new();
        start_watch(&client, "refused", &turns, &readiness, &shutdown);
        assert_eq!(next_list(&mut lists).await.as_deref(), Some("refused"));
        start_watch(&client, "other", &turns, &readiness, &shutdown);
        // The refused watch retries with backoff; the other lists between.
        let mut seen = Vec::new();
        while seen.len() < 5 && !seen.iter().any(|p| p == "other") {
            match next_list(&mut lists).await {
                Some(path) => seen.push(path),
                None => break,
            }
        }
        assert!(
            seen.iter().any(|p| p == "other"),
            "the other watch never listed: {seen:?}"
        );
        shutdown.cancel();
    }

    /// Runs a watch of `plural` as one of the leader's watches.
    fn start_watch(
        client: &Client,
        plural: &str,
        turns: &ListTurns,
        readiness: &crate::telemetry::Readiness,
        shutdown: &CancellationToken,
    ) {
        let resource = ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Thing".into(),
            plural: plural.into(),
        };
        let watch = Watch {
            api: Api::<DynamicObject>::all_with(client.clone(), &resource),
            config: streamed(),
            slim: without_managed_fields,
            keep: keep_all,
            what: plural.to_string(),
            hint: "",
            turns: turns.clone(),
            rejects: Rejects::default(),
        };
        tokio::spawn(watch.run(
            Some(Writer::new(resource)),
            readiness.controller_watch(plural),
            |_| {},
            shutdown.clone(),
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_whose_list_keeps_failing_backs_off_and_is_reported_broken() {
        let (client, mut lists) = lists_server(refused, &[]);
        let (turns, readiness) = (ListTurns::default(), Readiness::default());
        let shutdown = CancellationToken::new();
        start_watch(&client, "refused", &turns, &readiness, &shutdown);
        start_watch(&client, "listed", &turns, &readiness, &shutdown);
        // The paused clock moves on whenever every task waits.
        tokio::time::sleep(WATCH_STALE_AFTER + Duration::from_secs(5)).await;
        let mut attempts = 0;
        while let Ok(path) = lists.try_recv() {
            attempts += usize::from(path == "refused");
        }
        // Backing off to BACKOFF_MAX: at most about 35 lists in 65 s; at
        // the first step it would be hundreds.
        assert!(
            (5..=40).contains(&attempts),
            "{attempts} lists in {WATCH_STALE_AFTER:?}"
        );
        let broken = readiness.degraded();
        assert_eq!(broken.len(), 1, "{broken:?}");
        assert!(broken[0].contains("refused"), "{broken:?}");
        shutdown.cancel();
    }

    #[test]
    fn large_watches_stream_their_lists_or_read_them_consistently_in_pages() {
        let scope = Scope {
            namespace: None,
            labels: "shard=a".into(),
        };
        for config in [scope.config(), scope.whole(), streamed()] {
            assert_eq!(
                config.initial_list_strategy,
                InitialListStrategy::StreamingList
            );
            // Where the API server streams no lists: resourceVersion 0
            // would be served whole from the watch cache.
            assert_eq!(config.list_semantic, ListSemantic::MostRecent);
            assert_eq!(config.page_size, Some(LIST_PAGE));
        }
        assert_eq!(scope.config().label_selector.as_deref(), Some("shard=a"));
        assert_eq!(scope.whole().label_selector, None);
    }

    #[test]
    fn the_hub_changes_the_index_and_hands_out_wakes() {
        let index = Arc::new(RwLock::new(OwnerIndex::new()));
        let mut registry = prometheus_client::registry::Registry::default();
        let hub = Hub::new(index.clone(), Metrics::register(&mut registry));
        let mut artifact = Artifact::new("a", ArtifactSpec::default());
        artifact.metadata.namespace = Some("apps".into());
        let mut other = Artifact::new("b", ArtifactSpec::default());
        other.metadata.namespace = Some("apps".into());
        // Nobody listens: the index still changes.
        hub.take(Event::Artifact(Change::Applied(&artifact)));
        assert_eq!(locks::read(&index).len(), 1);
        let mut wakes = hub.subscribe();
        hub.take(Event::Artifact(Change::Deleted(&artifact)));
        hub.take(Event::Artifact(Change::Relisted(&[Arc::new(
            artifact.clone(),
        )])));
        assert!(locks::read(&index).is_synced());
        assert_eq!(
            wakes.try_recv().len(),
            1,
            "the delete and the relist both wake the export of the Artifact, once"
        );
        assert!(wakes.try_recv().is_empty());
        // Listed one by one (an Artifact the store does not keep): set
        // aside, unseen and waking nobody, until the list ends.
        hub.take(Event::Artifact(Change::Listing));
        hub.take(Event::Artifact(Change::Listed(&artifact)));
        hub.take(Event::Artifact(Change::Listed(&other)));
        assert_eq!(locks::read(&index).len(), 1);
        assert!(locks::read(&index).artifact("apps", "b").is_none());
        assert!(wakes.try_recv().is_empty());
        hub.take(Event::Artifact(Change::Relisted(&[])));
        assert_eq!(locks::read(&index).len(), 2);
        assert_eq!(wakes.try_recv().len(), 2);
    }
}
