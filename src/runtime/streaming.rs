//! The watcher under every large watch: kube's, except that the first list
//! arrives as watch events (the API server's streaming list,
//! `sendInitialEvents`) instead of in pages. A page holds up to
//! [`LIST_PAGE`](super::watch::LIST_PAGE) decoded objects until the last
//! is handed on; a stream holds one at a time, so a restart with every
//! Artifact present holds no more than a first start.
//!
//! The list is a consistent read: resourceVersion unset, so the API server
//! answers from its cache once the cache has caught up with etcd, and a
//! relist never goes back behind what the watch already saw. kube's own
//! streaming list asks for resourceVersion 0, whatever the cache holds.
//!
//! An API server without streaming lists (its `WatchList` feature off)
//! refuses the watch with 422 Invalid; the watch then lists in pages, with
//! the same configuration, from there on.

use std::fmt::Debug;
use std::time::Duration;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use kube::api::{WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event, InitialListStrategy};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// The annotation on the bookmark that ends a streaming list.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Watches `api` as kube's `watcher(api, config)` does. With
/// `config.initial_list_strategy` set to streaming lists, each list is a
/// consistent streaming list (see the module's doc); otherwise this is
/// kube's watcher.
pub fn watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    if config.initial_list_strategy != InitialListStrategy::StreamingList {
        return kube::runtime::watcher(api, config).boxed();
    }
    stream::unfold(
        (api, config, State::Empty),
        |(api, config, state)| async move {
            let (event, state) = step(&api, &config, state).await?;
            Some((event, (api, config, state)))
        },
    )
    .boxed()
}

/// Where a watch is.
enum State<K> {
    /// The next step starts a list.
    Empty,
    /// A streaming list is under way.
    Listing(Events<K>),
    /// Listed, or watched up to the version; the next step watches on.
    Listed(String),
    /// Watching from the list's end.
    Watching(String, Events<K>),
    /// The API server has no streaming lists: kube's paged watcher.
    Paged(BoxStream<'static, watcher::Result<Event<K>>>),
}

type Events<K> = BoxStream<'static, kube::Result<WatchEvent<K>>>;

/// One step: the next event and the state after it, or `None` when a
/// paged watcher ends (kube's never does).
async fn step<K>(
    api: &Api<K>,
    config: &watcher::Config,
    mut state: State<K>,
) -> Option<(watcher::Result<Event<K>>, State<K>)>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    loop {
        state = match state {
            State::Empty => match api.watch(&params(config, true), "").await {
                Ok(events) => return Some((Ok(Event::Init), State::Listing(events.boxed()))),
                Err(kube::Error::Api(status)) if status.is_invalid() => {
                    tracing::info!(
                        refusal = %status.message,
                        "the API server serves no streaming lists; listing in pages"
                    );
                    let mut paged = config.clone();
                    paged.initial_list_strategy = InitialListStrategy::ListWatch;
                    State::Paged(kube::runtime::watcher(api.clone(), paged).boxed())
                }
                Err(error) => {
                    return Some((Err(watcher::Error::WatchStartFailed(error)), State::Empty))
                }
            },
            State::Listing(mut events) => match next(&mut events, config).await {
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                    return Some((Ok(Event::InitApply(object)), State::Listing(events)));
                }
                Some(Ok(WatchEvent::Bookmark(mark)))
                    if mark.metadata.annotations.contains_key(INITIAL_EVENTS_END) =>
                {
                    let version = mark.metadata.resource_version;
                    return Some((Ok(Event::InitDone), State::Watching(version, events)));
                }
                // Deletions are not part of a list; other bookmarks say nothing yet.
                Some(Ok(WatchEvent::Bookmark(_) | WatchEvent::Deleted(_))) => {
                    State::Listing(events)
                }
                // A list that failed part way is listed again whole.
                Some(Ok(WatchEvent::Error(status))) => {
                    return Some((Err(watcher::Error::WatchError(status)), State::Empty));
                }
                Some(Err(error)) => {
                    return Some((Err(watcher::Error::WatchFailed(error)), State::Empty));
                }
                None => State::Empty,
            },
            State::Listed(version) => match api.watch(&params(config, false), &version).await {
                Ok(events) => State::Watching(version, events.boxed()),
                Err(error) => {
                    let error = watcher::Error::WatchStartFailed(error);
                    return Some((Err(error), State::Listed(version)));
                }
            },
            State::Watching(version, mut events) => match next(&mut events, config).await {
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                    return Some(seen(object, Event::Apply, events));
                }
                Some(Ok(WatchEvent::Deleted(object))) => {
                    return Some(seen(object, Event::Delete, events));
                }
                Some(Ok(WatchEvent::Bookmark(mark))) => {
                    State::Watching(mark.metadata.resource_version, events)
                }
                // 410 Gone: the version is too old to watch from; list again.
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                    return Some((Err(watcher::Error::WatchError(status)), State::Empty));
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    let error = watcher::Error::WatchError(status);
                    return Some((Err(error), State::Watching(version, events)));
                }
                Some(Err(error)) => {
                    let error = watcher::Error::WatchFailed(error);
                    return Some((Err(error), State::Watching(version, events)));
                }
                None => State::Listed(version),
            },
            State::Paged(mut events) => {
                return events
                    .next()
                    .await
                    .map(|event| (event, State::Paged(events)));
            }
        }
    }
}

/// A watched change, and the watch going on from its version.
fn seen<K: Resource>(
    object: K,
    event: fn(K) -> Event<K>,
    events: Events<K>,
) -> (watcher::Result<Event<K>>, State<K>) {
    match object.meta().resource_version.clone() {
        Some(version) if !version.is_empty() => {
            (Ok(event(object)), State::Watching(version, events))
        }
        _ => (Err(watcher::Error::NoResourceVersion), State::Empty),
    }
}

/// The parameters of a watch, and with `list` of a streaming list.
fn params(config: &watcher::Config, list: bool) -> WatchParams {
    WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: config.timeout,
        // A streaming list ends with a bookmark.
        bookmarks: config.bookmarks || list,
        send_initial_events: list,
    }
}

/// The next event, or `None` when the stream ends or sends nothing for
/// longer than the server's own timeout (a connection that died without a
/// close): either way the watch starts again. A timeout of 0 waits as long
/// as the stream lasts, as kube's watcher does.
async fn next<K>(
    events: &mut Events<K>,
    config: &watcher::Config,
) -> Option<kube::Result<WatchEvent<K>>> {
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
        let api = Api::<ConfigMap>::namespaced(client, "apps");
        let config = watcher::Config::default().page_size(500).streaming_lists();
        let events = watcher(api, config).take(n).collect::<Vec<_>>().await;
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

    #[tokio::test]
    async fn a_server_without_streaming_lists_is_listed_in_pages() {
        let list = json!({"apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": {"resourceVersion": "3"}, "items": [config_map("a", "2")]});
        let (client, asked) = scripted(vec![
            status(422, "Invalid"),
            (StatusCode::OK, list.to_string()),
            watch(&[event("MODIFIED", config_map("a", "4"))]),
        ]);
        let seen = first(client, 4).await;
        assert_eq!(seen, ["list", "listed a", "listed", "applied a"]);
        let asked = asked.lock().unwrap_or_else(|e| e.into_inner());
        let list = params_of(&asked[1]);
        assert!(list.contains(&"limit=500"), "{list:?}");
        assert!(!list.contains(&"watch=true"), "{list:?}");
        assert!(params_of(&asked[2]).contains(&"resourceVersion=3"));
    }

    #[tokio::test]
    async fn a_list_cut_short_or_refused_is_listed_again_whole() {
        let (client, _) = scripted(vec![
            status(403, "Forbidden"),
            watch(&[event("ADDED", config_map("a", "2"))]),
            watch(&[
                event("ADDED", config_map("a", "2")),
                event("ADDED", config_map("b", "3")),
                end_of_list("3"),
            ]),
        ]);
        let seen = first(client, 7).await;
        assert!(seen[0].starts_with("error: "), "{seen:?}");
        assert_eq!(
            seen[1..],
            ["list", "listed a", "list", "listed a", "listed b", "listed"]
        );
    }

    #[tokio::test]
    async fn a_watch_too_old_to_go_on_lists_again_from_the_latest_state() {
        let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Expired", "message": "too old resource version", "code": 410});
        let (client, asked) = scripted(vec![
            watch(&[end_of_list("5")]),
            watch(&[event("ERROR", gone)]),
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
