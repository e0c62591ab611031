//! The floor of openflux's propagation: a two-hop relay. openflux's path is
//! two hops (the source's write reaches its watch; its apply reaches the
//! consumer's watch); the relay takes the same two hops with nothing in
//! between. It watches the same sources with the same client library and
//! watcher settings, and applies each changed `status.artifact` as an
//! Artifact's spec, server-side, at the same concurrency: no queue, no
//! plan, no comparison.
//!
//! It writes into the plain namespace, which openflux does not watch, to
//! the Artifacts the initial sync baseline made there (`plain-<i>` for the
//! source `repo-<i>`), so each relayed change is an update, as openflux's
//! are. It counts the writes it sends, so the API server's count of
//! Artifact writes can still be read as openflux's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::time::Duration;

use anyhow::bail;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::cluster::{self, ARTIFACT};

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
    /// Relays every change of the sources in `sources` after their initial
    /// list (which it skips: the Artifacts exist) to Artifacts in `plain`;
    /// returns once that list is in (bounded by `timeout`).
    pub async fn start(
        sources: Api<DynamicObject>,
        plain: Api<DynamicObject>,
        concurrent: usize,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let config = watcher::Config::default().any_semantic();
        let (listed, is_listed) = oneshot::channel();
        let mut listed = Some(listed);
        let writes = Arc::new(AtomicU64::new(0));
        let sent = writes.clone();
        let task = tokio::spawn(async move {
            let (plain, sent) = (&plain, &sent);
            watcher(sources, config)
                .default_backoff()
                .filter_map(|event| {
                    let source = match event {
                        Ok(watcher::Event::Apply(source)) => Some(source),
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
        "metadata": {"name": name},
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

/// The plain namespace's Artifacts, as the relay writes them.
pub fn api(client: &kube::Client, plain_ns: &str) -> Api<DynamicObject> {
    cluster::api(client, plain_ns, &cluster::artifacts())
}
