//! The watcher under every large watch: kube's, except that the first list
//! arrives as watch events (the API server's streaming list,
//! `sendInitialEvents`) instead of in pages. A page holds up to
//! [`LIST_PAGE`](super::LIST_PAGE) decoded objects until the last
//! is handed on; a stream holds one at a time, so a restart with every
//! Artifact present holds no more than a first start.
//!
//! The list is a consistent read: resourceVersion unset, so the API server
//! answers from its cache once the cache has caught up with etcd, and a
//! relist never goes back behind what the watch already saw. kube's own
//! streaming list asks for resourceVersion 0, whatever the cache holds.
//!
//! Where a streaming list fails, the next attempt lists in pages, as
//! client-go does: a paged list that works is better than a stream that
//! keeps failing (an API server whose storage cannot say how fresh its
//! cache is answers the stream with an error event). An API server without
//! streaming lists at all (its `WatchList` feature off) refuses the watch
//! with 422 Invalid; that watch lists in pages from then on.
//!
//! Each object of a list or an event is decoded on its own
//! ([`super::decoded`]): one that does not fit openflux's types is handed
//! to [`Rejects`] and skipped, and the rest of the list goes on.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::ObjectList;
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use super::decoded::{self, Decoded, Rejects};

/// The annotation on the bookmark that ends a streaming list.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Watches `api` as kube's `watcher(api, config)` does. With
/// `config.initial_list_strategy` set to streaming lists, each list is a
/// consistent streaming list where the API server serves one (see the
/// module's doc), and objects that cannot be decoded go to `rejects`;
/// otherwise this is kube's watcher.
pub fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
    rejects: Rejects,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    if config.initial_list_strategy != InitialListStrategy::StreamingList {
        return kube::runtime::watcher(api, config).boxed();
    }
    let request = kube::core::Request::new(api.resource_url());
    let watch = Watch {
        client: api.into_client(),
        request,
        config,
        streams: true,
        rejects,
        _kind: std::marker::PhantomData,
    };
    stream::unfold(
        (watch, State::Empty { stream: true }),
        |(mut watch, state)| async move {
            let (event, state) = watch.step(state).await;
            Some((event, (watch, state)))
        },
    )
    .boxed()
}

/// One watch, and whether its API server serves streaming lists.
struct Watch<K> {
    client: Client,
    /// Requests for the watched kind in the watched scope.
    request: kube::core::Request,
    config: watcher::Config,
    streams: bool,
    rejects: Rejects,
    _kind: std::marker::PhantomData<fn() -> K>,
}

/// Where a watch is.
enum State<K> {
    /// The next step starts a list: streamed, or in pages.
    Empty { stream: bool },
    /// A streaming list is under way.
    Streaming(Events<K>),
    /// A paged list is under way: the rest of the page, the next page's
    /// token, the list's version once known.
    Paging {
        objects: VecDeque<K>,
        next: Option<String>,
        version: Option<String>,
    },
    /// Listed, or watched up to the version; the next step watches on.
    Listed(String),
    /// Watching from the version.
    Watching(String, Events<K>),
}

type Events<K> = BoxStream<'static, kube::Result<WatchEvent<Decoded<K>>>>;

impl<K> Watch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// A watch from `version` (with `params.send_initial_events`, a
    /// streaming list), each object decoded on its own.
    async fn watch(&self, params: &WatchParams, version: &str) -> kube::Result<Events<K>> {
        let mut request = if K::metadata_api() {
            self.request.watch_metadata(params, version)
        } else {
            self.request.watch(params, version)
        }
        .map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("watch");
        // As kube does: a watch's answer uncompressed (one gzip member an
        // event is more than its decoder reads).
        request
            .headers_mut()
            .entry(axum::http::header::ACCEPT_ENCODING)
            .or_insert(axum::http::HeaderValue::from_static("identity"));
        let body = self.client.request_stream(request).await?;
        // The lines of the answer, each an event; a connection that breaks
        // ends the watch, which goes on from its version.
        let lines = futures::AsyncBufReadExt::lines(body).take_while(|line| {
            if let Err(error) = line {
                tracing::debug!(%error, "watch connection ended");
            }
            std::future::ready(line.is_ok())
        });
        Ok(lines
            .filter_map(|line| std::future::ready(decoded::event(&line.unwrap_or_default())))
            .boxed())
    }

    /// One page of a list, each object decoded on its own.
    async fn list(&self, params: &ListParams) -> kube::Result<ObjectList<Decoded<K>>> {
        let mut request = if K::metadata_api() {
            self.request.list_metadata(params)
        } else {
            self.request.list(params)
        }
        .map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert("list");
        self.client.request(request).await
    }

    /// `object` itself, or `None` once an undecodable one is set aside.
    fn decoded(&self, object: Decoded<K>) -> Option<K> {
        match object {
            Decoded::Object(object) => Some(object),
            Decoded::Undecodable(undecodable) => {
                self.rejects.reject(undecodable);
                None
            }
        }
    }

    /// The next list: streamed, unless this API server serves no streams.
    fn relist(&self) -> State<K> {
        State::Empty {
            stream: self.streams,
        }
    }

    /// One step: the next event and the state after it.
    async fn step(&mut self, mut state: State<K>) -> (watcher::Result<Event<K>>, State<K>) {
        loop {
            state = match state {
                State::Empty { stream: true } => match self.watch(&self.params(true), "").await {
                    Ok(events) => return (Ok(Event::Init), State::Streaming(events)),
                    Err(kube::Error::Api(status)) if status.is_invalid() => {
                        tracing::info!(refusal = %status.message,
                                "the API server serves no streaming lists; listing in pages");
                        self.streams = false;
                        State::Empty { stream: false }
                    }
                    Err(error) => {
                        let error = watcher::Error::WatchStartFailed(error);
                        return (Err(error), State::Empty { stream: false });
                    }
                },
                State::Empty { stream: false } => {
                    let paging = State::Paging {
                        objects: VecDeque::new(),
                        next: None,
                        version: None,
                    };
                    return (Ok(Event::Init), paging);
                }
                State::Streaming(mut events) => match next(&mut events, &self.config).await {
                    Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                        match self.decoded(object) {
                            Some(object) => {
                                return (Ok(Event::InitApply(object)), State::Streaming(events))
                            }
                            None => State::Streaming(events),
                        }
                    }
                    Some(Ok(WatchEvent::Bookmark(mark)))
                        if mark.metadata.annotations.contains_key(INITIAL_EVENTS_END) =>
                    {
                        let version = mark.metadata.resource_version;
                        return (Ok(Event::InitDone), State::Watching(version, events));
                    }
                    // Deletions are no part of a list; other bookmarks say nothing yet.
                    Some(Ok(WatchEvent::Bookmark(_) | WatchEvent::Deleted(_))) => {
                        State::Streaming(events)
                    }
                    // A list that failed part way is listed again whole, in pages.
                    Some(Ok(WatchEvent::Error(status))) => {
                        let error = watcher::Error::WatchError(status);
                        return (Err(error), State::Empty { stream: false });
                    }
                    Some(Err(error)) => {
                        let error = watcher::Error::WatchFailed(error);
                        return (Err(error), State::Empty { stream: false });
                    }
                    None => State::Empty { stream: false },
                },
                State::Paging {
                    mut objects,
                    next,
                    version,
                } => {
                    if let Some(object) = objects.pop_front() {
                        let paging = State::Paging {
                            objects,
                            next,
                            version,
                        };
                        return (Ok(Event::InitApply(object)), paging);
                    }
                    if let (None, Some(version)) = (&next, version) {
                        return (Ok(Event::InitDone), State::Listed(version));
                    }
                    let mut params = self.list_params();
                    params.continue_token = next;
                    match self.list(&params).await {
                        Ok(list) => {
                            let version = list.metadata.resource_version.filter(|v| !v.is_empty());
                            let next = list.metadata.continue_.filter(|t| !t.is_empty());
                            if version.is_none() && next.is_none() {
                                return (Err(watcher::Error::NoResourceVersion), self.relist());
                            }
                            let objects = list
                                .items
                                .into_iter()
                                .filter_map(|object| self.decoded(object))
                                .collect();
                            State::Paging {
                                objects,
                                next,
                                version,
                            }
                        }
                        Err(error) => {
                            let error = watcher::Error::InitialListFailed(error);
                            return (Err(error), self.relist());
                        }
                    }
                }
                State::Listed(version) => match self.watch(&self.params(false), &version).await {
                    Ok(events) => State::Watching(version, events),
                    Err(error) => {
                        let error = watcher::Error::WatchStartFailed(error);
                        return (Err(error), State::Listed(version));
                    }
                },
                State::Watching(version, mut events) => match next(&mut events, &self.config).await
                {
                    Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                        match self.decoded(object) {
                            Some(object) => return self.seen(object, Event::Apply, events),
                            None => State::Watching(version, events),
                        }
                    }
                    // A deletion of an object that cannot be decoded is not
                    // seen either: a store that held an earlier version of
                    // it keeps that one until the next list.
                    Some(Ok(WatchEvent::Deleted(object))) => match self.decoded(object) {
                        Some(object) => return self.seen(object, Event::Delete, events),
                        None => State::Watching(version, events),
                    },
                    Some(Ok(WatchEvent::Bookmark(mark))) => {
                        State::Watching(mark.metadata.resource_version, events)
                    }
                    // 410 Gone: the version is too old to watch from; list again.
                    Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                        return (Err(watcher::Error::WatchError(status)), self.relist());
                    }
                    Some(Ok(WatchEvent::Error(status))) => {
                        let error = watcher::Error::WatchError(status);
                        return (Err(error), State::Watching(version, events));
                    }
                    Some(Err(error)) => {
                        let error = watcher::Error::WatchFailed(error);
                        return (Err(error), State::Watching(version, events));
                    }
                    None => State::Listed(version),
                },
            }
        }
    }

    /// A watched change, and the watch going on from its version.
    fn seen(
        &self,
        object: K,
        event: fn(K) -> Event<K>,
        events: Events<K>,
    ) -> (watcher::Result<Event<K>>, State<K>) {
        match object.meta().resource_version.clone() {
            Some(version) if !version.is_empty() => {
                (Ok(event(object)), State::Watching(version, events))
            }
            _ => (Err(watcher::Error::NoResourceVersion), self.relist()),
        }
    }

    /// The parameters of a watch, and with `list` of a streaming list.
    fn params(&self, list: bool) -> WatchParams {
        WatchParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            timeout: self.config.timeout,
            // A streaming list ends with a bookmark.
            bookmarks: self.config.bookmarks || list,
            send_initial_events: list,
        }
    }

    /// The parameters of a paged list's first page.
    fn list_params(&self) -> ListParams {
        let (resource_version, version_match) = match self.config.list_semantic {
            ListSemantic::Any => (Some("0".to_string()), Some(VersionMatch::NotOlderThan)),
            ListSemantic::MostRecent => (None, None),
        };
        ListParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            limit: self.config.page_size,
            resource_version,
            version_match,
            ..ListParams::default()
        }
    }
}

/// The next event, or `None` when the stream ends or sends nothing for
/// longer than the server's own timeout (a connection that died without a
/// close): either way the watch starts again. A timeout of 0 waits as long
/// as the stream lasts, as kube's watcher does.
async fn next<K>(
    events: &mut Events<K>,
    config: &watcher::Config,
) -> Option<kube::Result<WatchEvent<Decoded<K>>>> {
    let server = config.timeout.unwrap_or(DEFAULT_TIMEOUT);
    if server == 0 {
        return events.next().await;
    }
    let idle = Duration::from_secs(u64::from(server)) + IDLE_MARGIN;
    tokio::time::timeout(idle, events.next())
        .await
        .ok()
        .flatten()
}

/// The watch timeout kube asks of the server when the config has none.
const DEFAULT_TIMEOUT: u32 = 290;
/// How long past the server's timeout a silent watch is given up.
const IDLE_MARGIN: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use axum::http::{Request, Response, StatusCode};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{Client, ResourceExt};
    use serde_json::{json, Value};

    use super::*;

    /// A fake API server: answers requests in turn from `answers`, then
    /// never; the returned list holds the query of each request.
    fn scripted(answers: Vec<(StatusCode, String)>) -> (Client, Arc<Mutex<Vec<String>>>) {
        let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let queries = asked.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let (answers, queries) = (answers.clone(), queries.clone());
            async move {
                let query = request.uri().query().unwrap_or("").to_string();
                queries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(query);
                let answer = answers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop_front();
                let Some((status, body)) = answer else {
                    return Ok(std::future::pending().await);
                };
                let mut response = Response::new(kube::client::Body::from(body.into_bytes()));
                *response.status_mut() = status;
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        (Client::new(service, "default"), asked)
    }

    fn config_map(name: &str, version: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "apps", "resourceVersion": version}})
    }

    fn event(kind: &str, object: Value) -> Value {
        json!({"type": kind, "object": object})
    }

    fn end_of_list(version: &str) -> Value {
        event(
            "BOOKMARK",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "resourceVersion": version, "annotations": {INITIAL_EVENTS_END: "true"}}}),
        )
    }

    /// A watch's answer: the events, one per line.
    fn watch(events: &[Value]) -> (StatusCode, String) {
        let lines = events.iter().map(|e| format!("{e}\n")).collect();
        (StatusCode::OK, lines)
    }

    fn status(code: u16, reason: &str) -> (StatusCode, String) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "message": "refused", "code": code});
        let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
        (code, status.to_string())
    }

    /// The first `n` events of a streaming watch, each in a few words.
    async fn first(client: Client, n: usize) -> Vec<String> {
        first_rejecting(client, n, Rejects::default()).await
    }

    /// [`first`], objects that cannot be decoded handed to `rejects`.
    async fn first_rejecting(client: Client, n: usize, rejects: Rejects) -> Vec<String> {
        let api = Api::<ConfigMap>::namespaced(client, "apps");
        let config = watcher::Config::default().page_size(500).streaming_lists();
        let events = watcher(api, config, rejects)
            .take(n)
            .collect::<Vec<_>>()
            .await;
        events
            .iter()
            .map(|event| match event {
                Ok(Event::Init) => "list".to_string(),
                Ok(Event::InitApply(o)) => format!("listed {}", o.name_any()),
                Ok(Event::InitDone) => "listed".to_string(),
                Ok(Event::Apply(o)) => format!("applied {}", o.name_any()),
                Ok(Event::Delete(o)) => format!("deleted {}", o.name_any()),
                Err(error) => format!("error: {error}"),
            })
            .collect()
    }

    fn params_of(query: &str) -> Vec<&str> {
        query.split('&').collect()
    }

    #[tokio::test]
    async fn a_list_streams_from_the_latest_state_and_the_watch_goes_on_from_its_end() {
        let (client, asked) = scripted(vec![
            watch(&[
                event("ADDED", config_map("a", "5")),
                event("BOOKMARK", config_map("", "6")),
                event("ADDED", config_map("b", "6")),
                end_of_list("7"),
            ]),
            watch(&[
                event("MODIFIED", config_map("a", "8")),
                event("DELETED", config_map("b", "9")),
            ]),
        ]);
        let seen = first(client, 6).await;
        assert_eq!(
            seen,
            [
                "list",
                "listed a",
                "listed b",
                "listed",
                "applied a",
                "deleted b"
            ]
        );
        let asked = asked.lock().unwrap_or_else(|e| e.into_inner());
        let list = params_of(&asked[0]);
        for param in [
            "watch=true",
            "sendInitialEvents=true",
            "allowWatchBookmarks=true",
            "resourceVersionMatch=NotOlderThan",
            // Unset: the latest state, never an older one from a cache.
            "resourceVersion=",
        ] {
            assert!(list.contains(&param), "{param} not in {list:?}");
        }
        let watch = params_of(&asked[1]);
        assert!(watch.contains(&"resourceVersion=7"), "{watch:?}");
        assert!(!watch.iter().any(|p| p.starts_with("sendInitialEvents")));
    }

    fn list_of(version: &str, items: &[Value]) -> (StatusCode, String) {
        let list = json!({"apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": {"resourceVersion": version}, "items": items});
        (StatusCode::OK, list.to_string())
    }

    fn gone() -> Value {
        event(
            "ERROR",
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Expired", "message": "too old resource version", "code": 410}),
        )
    }

    #[tokio::test]
    async fn a_server_without_streaming_lists_is_listed_in_pages_from_then_on() {
        let (client, asked) = scripted(vec![
            status(422, "Invalid"),
            list_of("3", &[config_map("a", "2")]),
            watch(&[event("MODIFIED", config_map("a", "4")), gone()]),
            list_of("6", &[config_map("b", "5")]),
        ]);
        let seen = first(client, 7).await;
        assert_eq!(seen[..4], ["list", "listed a", "listed", "applied a"]);
        assert!(seen[4].starts_with("error: "), "{seen:?}");
        assert_eq!(seen[5..], ["list", "listed b"]);
        let asked = asked.lock().unwrap_or_else(|e| e.into_inner());
        for relist in [1, 3] {
            let list = params_of(&asked[relist]);
            assert!(list.contains(&"limit=500"), "{list:?}");
            assert!(!list.contains(&"watch=true"), "{list:?}");
        }
        assert!(params_of(&asked[2]).contains(&"resourceVersion=3"));
    }

    #[tokio::test]
    async fn a_streaming_list_that_fails_is_listed_again_in_pages_and_the_next_streams() {
        let internal = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "InternalError", "message": "storage cannot stream", "code": 500});
        let (client, asked) = scripted(vec![
            watch(&[
                event("ADDED", config_map("a", "2")),
                event("ERROR", internal),
            ]),
            list_of("3", &[config_map("a", "2"), config_map("b", "3")]),
            watch(&[gone()]),
            // Cut short: the stream ends before the list does.
            watch(&[event("ADDED", config_map("c", "8"))]),
            list_of("9", &[config_map("c", "8")]),
        ]);
        let seen = first(client, 12).await;
        assert_eq!(seen[..2], ["list", "listed a"]);
        assert!(seen[2].starts_with("error: "), "{seen:?}");
        assert_eq!(seen[3..7], ["list", "listed a", "listed b", "listed"]);
        assert!(seen[7].starts_with("error: "), "{seen:?}");
        assert_eq!(seen[8..], ["list", "listed c", "list", "listed c"]);
        let asked = asked.lock().unwrap_or_else(|e| e.into_inner());
        let kinds: Vec<bool> = asked
            .iter()
            .map(|query| params_of(query).contains(&"sendInitialEvents=true"))
            .collect();
        assert_eq!(kinds, [true, false, false, true, false], "{asked:?}");
    }

    #[tokio::test]
    async fn a_refused_streaming_list_is_retried_in_pages() {
        let (client, _) = scripted(vec![
            status(403, "Forbidden"),
            list_of("3", &[config_map("a", "2")]),
        ]);
        let seen = first(client, 4).await;
        assert!(seen[0].starts_with("error: "), "{seen:?}");
        assert_eq!(seen[1..], ["list", "listed a", "listed"]);
    }

    /// A ConfigMap whose `data` no decoder takes.
    fn odd_config_map(name: &str, version: &str) -> Value {
        let mut object = config_map(name, version);
        object["data"] = json!(["not", "a", "map"]);
        object
    }

    #[tokio::test]
    async fn an_object_that_cannot_be_decoded_is_set_aside_and_the_rest_goes_on() {
        let (client, _) = scripted(vec![
            watch(&[
                event("ADDED", odd_config_map("odd-streamed", "2")),
                event("ADDED", config_map("a", "3")),
                end_of_list("3"),
            ]),
            watch(&[
                event("MODIFIED", odd_config_map("a", "4")),
                event("ADDED", config_map("b", "5")),
                gone(),
            ]),
            status(403, "Forbidden"),
            list_of(
                "7",
                &[
                    config_map("a", "6"),
                    odd_config_map("odd-paged", "6"),
                    config_map("b", "7"),
                ],
            ),
        ]);
        let (rejects, mut rejected) = Rejects::queue();
        let seen = first_rejecting(client, 10, rejects).await;
        let seen: Vec<&str> = seen
            .iter()
            .map(|e| if e.starts_with("error") { "error" } else { e })
            .collect();
        assert_eq!(
            seen,
            [
                "list",
                "listed a",
                "listed",
                "applied b",
                "error",
                "error",
                "list",
                "listed a",
                "listed b",
                "listed"
            ]
        );
        let mut set_aside = Vec::new();
        while let Ok(object) = rejected.try_recv() {
            set_aside.push(format!(
                "{} {}",
                object.key(),
                object.resource_version.unwrap_or_default()
            ));
        }
        assert_eq!(
            set_aside,
            ["apps/odd-streamed 2", "apps/a 4", "apps/odd-paged 6"]
        );
    }

    #[tokio::test]
    async fn a_watch_too_old_to_go_on_lists_again_from_the_latest_state() {
        let (client, asked) = scripted(vec![
            watch(&[end_of_list("5")]),
            watch(&[gone()]),
            watch(&[event("ADDED", config_map("a", "9")), end_of_list("9")]),
        ]);
        let seen = first(client, 6).await;
        assert_eq!(seen[..2], ["list", "listed"]);
        assert!(seen[2].starts_with("error: "), "{seen:?}");
        assert_eq!(seen[3..], ["list", "listed a", "listed"]);
        let asked = asked.lock().unwrap_or_else(|e| e.into_inner());
        let relist = params_of(&asked[2]);
        assert!(relist.contains(&"sendInitialEvents=true"), "{relist:?}");
        assert!(relist.contains(&"resourceVersion="), "{relist:?}");
    }
}
