//! The HttpSource controller: fetch on the interval, build and store the
//! artifact, publish it as an openflux `Artifact`, report in the status.
//!
//! The Artifact is the whole contract with openflux: it is written by
//! server-side apply (field manager `openflux-http-source`) in the
//! HttpSource's namespace, under the HttpSource's name, with a controller
//! ownerReference to the HttpSource (`openflux_api::producer`). Logs,
//! metrics and events follow Flux's conventions (`openflux_api::runtime`).
//!
//! `--concurrent` reconciles run at a time, on workers shared fairly across
//! namespaces (`workers`): kube's controller hands every due source over at
//! once, and each waits for a worker of its namespace's share.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt as _, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use openflux_api::producer::storage::Retention;
use openflux_api::runtime::logging::reconcile_span;
use openflux_api::runtime::{panics, Health, ObjectLabels, ReconcileResult};
use openflux_api::Artifact;
use tracing::{debug, info, warn, Instrument};

use crate::api::{condition, HttpSource, REQUESTED_AT_ANNOTATION};
use crate::context::{Context, Error};
use crate::reconcile::{is_ready, reconcile_source};

/// Hash of what should trigger a reconcile: a new generation, a new
/// `reconcile.fluxcd.io/requestedAt` value, or a move to another shard (the
/// Artifact carries the source's `sharding.fluxcd.io/key` label); status
/// updates do not.
fn reconcile_trigger(hs: &HttpSource) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hs.metadata.generation.hash(&mut h);
    hs.annotations().get(REQUESTED_AT_ANNOTATION).hash(&mut h);
    hs.labels().get(openflux_api::SHARD_LABEL).hash(&mut h);
    Some(h.finish())
}

/// One reconcile once a worker is free for the source's namespace, of the
/// object as it is then (it may have changed or gone while waiting).
async fn reconcile_in_turn(
    hs: Arc<HttpSource>,
    ctx: Arc<Context>,
    store: Store<HttpSource>,
) -> Result<Action, Error> {
    let _worker = ctx
        .workers
        .acquire(&hs.namespace().unwrap_or_default())
        .await;
    match store.get(&ObjectRef::from_obj(hs.as_ref())) {
        Some(latest) => reconcile(latest, ctx).await,
        // Deleted meanwhile: its metrics and artifacts went with the watch
        // event.
        None => Ok(Action::await_change()),
    }
}

/// One reconcile, in its log span and counted once in Flux's metrics.
pub async fn reconcile(hs: Arc<HttpSource>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = reconcile_span(&ctx.id, &hs.namespace().unwrap_or_default(), &hs.name_any());
    async move {
        let object = ObjectLabels::of(hs.as_ref());
        let mut guard = ctx.metrics.reconcile(object.clone());
        if hs.metadata.deletion_timestamp.is_some() {
            guard.object_deleted();
        } else {
            ctx.metrics.record_suspend(&object, hs.spec.suspend);
        }
        // A panic (a defect) is a failed reconcile, retried with the
        // backoff: kube's controller would carry it out of the stream that
        // drives every reconcile and end this controller.
        let result = AssertUnwindSafe(reconcile_source(&hs, &ctx))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(Error::Panicked(panics::message(&*panic))));
        match &result {
            Ok(done) => {
                ctx.retries.succeeded(&ObjectRef::from_obj(hs.as_ref()));
                guard.set_result(done.result);
                if let Some(ready) = done.ready.or_else(|| is_ready(&hs)) {
                    let status = if ready { "True" } else { "False" };
                    ctx.metrics
                        .record_condition(&object, condition::READY, status);
                }
            }
            Err(_) => guard.set_result(ReconcileResult::Error),
        }
        result.map(|done| done.action)
    }
    .instrument(span)
    .await
}

pub fn error_policy(hs: Arc<HttpSource>, error: &Error, ctx: Arc<Context>) -> Action {
    let span = reconcile_span(&ctx.id, &hs.namespace().unwrap_or_default(), &hs.name_any());
    let delay = ctx.retries.failed(ObjectRef::from_obj(hs.as_ref()));
    span.in_scope(|| warn!(error = %error, retry_in = ?delay, "Reconciler error"));
    Action::requeue(delay)
}

/// What to watch.
pub struct Watch {
    /// `None`: all namespaces.
    pub namespace: Option<String>,
    /// The HttpSources' watcher configuration (label selector).
    pub config: watcher::Config,
}

/// Runs the controller until a termination signal.
pub async fn run(ctx: Arc<Context>, health: Health, watch: Watch) {
    let client = ctx.client.clone();
    let (sources, artifacts): (Api<HttpSource>, Api<Artifact>) = match &watch.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let (reader, writer) = reflector::store();
    let synced = health.clone();
    let metrics = ctx.metrics.clone();
    let catalog = ctx.catalog.clone();
    let stream = watcher(sources, watch.config)
        .default_backoff()
        .reflect(writer)
        .inspect_ok(move |event| match event {
            watcher::Event::InitDone if !synced.is_ready() => {
                info!("HttpSource watch synced");
                synced.set_ready();
            }
            // The object is gone: so are its gotk_* series, and its
            // artifacts are no longer served.
            watcher::Event::Delete(hs) => {
                metrics.delete_object(&ObjectLabels::of(hs));
                catalog.remove_source(&hs.namespace().unwrap_or_default(), &hs.name_any());
            }
            _ => {}
        })
        .applied_objects()
        .predicate_filter(reconcile_trigger, Default::default());

    let sweeper = tokio::spawn(sweep_storage(reader.clone(), ctx.clone(), health));
    let latest = reader.clone();
    // Unbounded here: `ctx.workers` bounds what runs, fairly.
    Controller::for_stream(stream, reader)
        .owns(artifacts, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(0))
        .shutdown_on_signal()
        .run(
            move |hs, ctx| reconcile_in_turn(hs, ctx, latest.clone()),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => debug!(object = %object, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile error"),
            }
        })
        .await;
    sweeper.abort();
}

/// Once the watch synced (the store is complete, so a source missing from
/// it is gone), periodically removes the storage of deleted HttpSources and
/// expired artifacts.
async fn sweep_storage(store: Store<HttpSource>, ctx: Arc<Context>, health: Health) {
    health.wait_ready().await;
    let every = (ctx.retention.ttl / 2).clamp(Duration::from_secs(5), Duration::from_secs(60));
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        ctx.forget_missing(&store);
        let root = ctx.storage_root.clone();
        ctx.catalog.retain(
            |namespace, name| {
                store
                    .get(&ObjectRef::<HttpSource>::new(name).within(namespace))
                    .is_some()
            },
            |relative| std::fs::symlink_metadata(root.join(relative)).is_ok_and(|m| m.is_file()),
        );
        let sources = match ctx.storage.sources().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "cannot list storage");
                continue;
            }
        };
        for (namespace, name) in sources {
            let key = ObjectRef::<HttpSource>::new(&name).within(&namespace);
            match store.get(&key) {
                None => match ctx.storage.remove_source(&namespace, &name).await {
                    Ok(()) => info!(%namespace, %name, "removed storage of a deleted HttpSource"),
                    Err(e) => warn!(%namespace, %name, error = %e, "cannot remove storage"),
                },
                Some(hs) => {
                    let current = hs
                        .status
                        .as_ref()
                        .and_then(|s| s.artifact.as_ref())
                        .map(|a| a.path.clone());
                    // The sweep only expires by age: a reconcile may be
                    // storing a newer artifact than the status says yet.
                    let by_age = Retention {
                        records: usize::MAX,
                        ..ctx.retention
                    };
                    if let Err(e) = ctx
                        .storage
                        .collect_garbage(&namespace, &name, current.as_deref(), by_age)
                        .await
                    {
                        warn!(%namespace, %name, error = %e, "cannot collect old artifacts");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HttpSourceStatus, API_VERSION, KIND};

    fn source(spec: serde_json::Value) -> HttpSource {
        serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": "app", "namespace": "team", "uid": "u-1", "generation": 3},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn reconciles_on_generation_request_or_shard_only() {
        let hs = source(serde_json::json!({"url": "https://e.com/a.tgz", "interval": "1m"}));
        let mut with_status = hs.clone();
        with_status.status = Some(HttpSourceStatus {
            observed_generation: Some(3),
            ..HttpSourceStatus::default()
        });
        assert_eq!(reconcile_trigger(&hs), reconcile_trigger(&with_status));
        let mut requested = hs.clone();
        requested
            .annotations_mut()
            .insert(REQUESTED_AT_ANNOTATION.into(), "now".into());
        assert_ne!(reconcile_trigger(&hs), reconcile_trigger(&requested));
        let mut newer = hs.clone();
        newer.metadata.generation = Some(4);
        assert_ne!(reconcile_trigger(&hs), reconcile_trigger(&newer));
        // Moved to another shard: the Artifact must follow.
        let mut moved = hs.clone();
        moved
            .labels_mut()
            .insert(openflux_api::SHARD_LABEL.into(), "shard1".into());
        assert_ne!(reconcile_trigger(&hs), reconcile_trigger(&moved));
        let mut labelled = hs.clone();
        labelled.labels_mut().insert("team".into(), "a".into());
        assert_eq!(reconcile_trigger(&hs), reconcile_trigger(&labelled));
    }

    #[test]
    fn the_artifact_is_owned_by_its_source() {
        use crate::plan::artifact_spec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::Timestamp;
        let hs = source(serde_json::json!({"url": "https://e.com/a.tgz", "interval": "1m"}));
        let summary = crate::api::ArtifactSummary {
            url: "http://storage/team/app/ab.tar.gz".into(),
            revision: "sha256:ab".into(),
            digest: "sha256:ab".into(),
            path: "team/app/ab.tar.gz".into(),
            size: 42,
            last_update_time: Time(Timestamp::from_second(1_700_000_000).unwrap()),
        };
        let artifact =
            openflux_api::producer::artifact_for(&hs, "app", artifact_spec(&summary)).unwrap();
        let json = serde_json::to_value(&artifact).unwrap();
        assert_eq!(
            json["metadata"]["ownerReferences"],
            serde_json::json!([{
                "apiVersion": "sources.openflux.dev/v1alpha1",
                "kind": "HttpSource",
                "name": "app",
                "uid": "u-1",
                "controller": true,
                "blockOwnerDeletion": true
            }])
        );
        assert_eq!(json["metadata"]["namespace"], "team");
        assert_eq!(json["spec"]["digest"], "sha256:ab");
        assert_eq!(json["spec"]["lastUpdateTime"], "2023-11-14T22:13:20Z");
    }
}
