//! The floor of openflux's path: a two-hop relay. openflux's path is two
//! hops (the source's write reaches its watch; its apply reaches the
//! consumer's watch); the relay takes the same two hops with nothing in
//! between. It watches the same sources with the same client library and
//! watcher (consistent streaming lists, as openflux's), and applies
//! each listed or changed `status.artifact` as an Artifact's spec, with
//! openflux's labels, server-side, at the same concurrency, as the
//! plain-client floor's identity: no queue, no plan, no comparison, no
//! watch of the Artifacts it writes.
//!
//! It writes into the plain namespace, which openflux does not watch
//! (`plain-<i>` for the source `repo-<i>`). Its first list writes every
//! Artifact there: the floor of openflux's initial sync that reads the
//! sources as openflux does. Each change relayed after it is an update, as
//! openflux's are. It counts the writes it sends, so the API server's count
//! of Artifact writes can still be read as openflux's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use openflux_api::{MANAGED_BY, MANAGED_BY_LABEL, SOURCE_KIND_LABEL, SOURCE_NAME_LABEL};

use crate::cluster::{self, ARTIFACT};
use crate::observe::{string_at, Observer};
use crate::process;

const FIELD_MANAGER: &str = "openflux-bench-relay";

/// The relay's Artifact for a source `repo-<i>`: `plain-<i>`.
pub fn target_name(source: &str) -> String {
    format!("plain-{}", source.trim_start_matches("repo-"))
}

/// A running relay, stopped on drop.
pub struct Relay {
    task: JoinHandle<()>,
    writes: Arc<AtomicU64>,
}

impl Relay {
    /// Relays every source in `sources`, as listed and as changed after, to
    /// Artifacts in `plain`; returns once the first list is in (bounded by
    /// `timeout`), its writes still under way.
    pub async fn start(
        sources: Api<DynamicObject>,
        plain: Api<DynamicObject>,
        concurrent: usize,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let config = openflux::watch::streamed();
        let (listed, is_listed) = oneshot::channel();
        let mut listed = Some(listed);
        let writes = Arc::new(AtomicU64::new(0));
        let sent = writes.clone();
        let task = tokio::spawn(async move {
            let (plain, sent) = (&plain, &sent);
            openflux::watch::streaming::watcher(sources, config, Default::default())
                .default_backoff()
                .filter_map(|event| {
                    let source = match event {
                        Ok(watcher::Event::InitApply(source) | watcher::Event::Apply(source)) => {
                            Some(source)
                        }
                        Ok(watcher::Event::InitDone) => {
                            if let Some(listed) = listed.take() {
                                let _ = listed.send(());
                            }
                            None
                        }
                        _ => None,
                    };
                    std::future::ready(source)
                })
                .for_each_concurrent(concurrent, |source| async move {
                    if let Err(e) = relay(plain, &source, sent).await {
                        eprintln!("relay: {}: {e}", source.name_any());
                    }
                })
                .await;
        });
        let relay = Relay { task, writes };
        match tokio::time::timeout(timeout, is_listed).await {
            Ok(Ok(())) => Ok(relay),
            _ => bail!("the relay's watch did not list the sources within {timeout:?}"),
        }
    }

    /// Artifact writes sent so far.
    pub fn writes(&self) -> f64 {
        self.writes.load(Ordering::SeqCst) as f64
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    plain: &Api<DynamicObject>,
    source: &DynamicObject,
    sent: &AtomicU64,
) -> kube::Result<()> {
    let Some(artifact) = source.data.pointer("/status/artifact") else {
        return Ok(());
    };
    let name = target_name(&source.name_any());
    let spec: Value = ["url", "revision", "digest", "size", "lastUpdateTime"]
        .iter()
        .filter_map(|k| Some((k.to_string(), artifact.get(*k)?.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let body = json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": name, "labels": {
            MANAGED_BY_LABEL: MANAGED_BY,
            SOURCE_KIND_LABEL: "gitrepository",
            SOURCE_NAME_LABEL: source.name_any(),
        }},
        "spec": spec,
    });
    sent.fetch_add(1, Ordering::SeqCst);
    plain
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .map(|_| ())
}

/// Starts the relay of `repos` writing through `writes` (an empty
/// namespace) and waits (bounded by `timeout`) until `relayed`, watching
/// that namespace, has seen `n` Artifacts: the relay, and its start to the
/// last of them.
pub async fn sync(
    repos: &Api<DynamicObject>,
    writes: &Api<DynamicObject>,
    relayed: &Observer,
    n: usize,
    p: &super::Params,
    timeout: Duration,
) -> anyhow::Result<(Relay, Duration)> {
    let started = Instant::now();
    let relay = Relay::start(repos.clone(), writes.clone(), p.concurrent, timeout).await?;
    relayed.until_count(n, false, timeout, || Ok(())).await?;
    let last = relayed
        .last_first_seen()
        .context("the relay's Artifacts were not seen")?;
    Ok((relay, last.duration_since(started)))
}

/// The relay's first list as a floor of the initial sync, taken as the
/// other floors are (watched, on an API server holding the N sources, its
/// Artifacts deleted after): start to the last Artifact seen.
pub async fn sync_floor(
    repos: &Api<DynamicObject>,
    client: &kube::Client,
    writes: &Api<DynamicObject>,
    plain_ns: &str,
    n: usize,
    p: &super::Params,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let section = format!("mirror N={n}");
    let relayed = observer(client, plain_ns).await?;
    let before = process::apiserver_metrics(client).await?;
    let (relay, took) = sync(repos, writes, &relayed, n, p, timeout).await?;
    drop(relay);
    let after = process::apiserver_metrics(client).await?;
    let cpu = process::apiserver_cpu_seconds(&after) - process::apiserver_cpu_seconds(&before);
    super::setup::print_requests(&section, "relay's sync", &before, &after);
    eprintln!(
        "{section}: the two-hop relay's sync of the same sources: {:.2}s, {cpu:.1} API server CPU-seconds",
        took.as_secs_f64()
    );
    drop(relayed);
    let cleared = super::setup::delete_all(&api(client, plain_ns), "", timeout).await?;
    eprintln!(
        "{section}: the relay's Artifacts deleted in {:.1}s",
        cleared.as_secs_f64()
    );
    Ok(took)
}

/// A watch of the relay's Artifacts in `plain_ns` (their revisions),
/// synced.
pub async fn observer(client: &kube::Client, plain_ns: &str) -> anyhow::Result<Observer> {
    let relayed = Observer::start("relayed Artifact", api(client, plain_ns), |o| {
        string_at(o, "/spec/revision")
    });
    relayed.synced(Duration::from_secs(60)).await?;
    Ok(relayed)
}

/// The plain namespace's Artifacts, as the relay writes them.
pub fn api(client: &kube::Client, plain_ns: &str) -> Api<DynamicObject> {
    cluster::api(client, plain_ns, &cluster::artifacts())
}
