//! One watch of one kind: [`Watch::run`] lists and watches, keeps a store,
//! marks the readiness of the watch, reports a watch that stays broken, and
//! hands each change to its caller.

use std::fmt::Debug;
use std::hash::Hash;

use futures::{StreamExt, TryStreamExt};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::change::Change;
use super::decoded::Rejects;
use super::retry::{retrying_with, works};
use super::ListTurns;
use crate::telemetry::{SyncGuard, WATCH_STALE_AFTER};

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::telemetry::Readiness;
    use crate::watch::fake_api;
    use crate::watch::{keep_all, streamed, without_managed_fields, Scope, LIST_PAGE};
    use fake_api::{lists_server, List};
    use kube::core::{ApiResource, DynamicObject};
    use kube::runtime::watcher::{InitialListStrategy, ListSemantic};
    use kube::Client;
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
}
