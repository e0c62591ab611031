//! What the mirror benchmark writes: the sources, their artifacts, and the
//! plain writes its baselines time.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{stream, StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use openflux_api::{MANAGED_BY, MANAGED_BY_LABEL, SOURCE_KIND_LABEL, SOURCE_NAME_LABEL};

use crate::cluster::{self, MANAGER, SOURCE};
use crate::observe::Observer;

/// The Flux finalizer, set at creation so source-controller has nothing to
/// write on a suspended source.
const FLUX_FINALIZER: &str = "finalizers.fluxcd.io";

pub fn source_name(i: usize) -> String {
    format!("repo-{i:05}")
}

/// A GitRepository `status.artifact` for `revision`.
pub fn artifact(ns: &str, name: &str, revision: u64) -> Value {
    let sha = format!("{revision:040x}");
    let digest = format!("sha256:{:064x}", u128::from(revision) << 7 | 0x5eed);
    let path = format!("gitrepository/{ns}/{name}/{sha}.tar.gz");
    json!({
        "digest": digest,
        "lastUpdateTime": "2025-01-01T00:00:00Z",
        "path": path,
        "revision": format!("main@sha1:{sha}"),
        "size": 1024,
        "url": format!("http://127.0.0.1:9/{path}"),
    })
}

/// A status as source-controller leaves a suspended GitRepository's: it
/// records the generation it saw (always 1 here: the bench never changes a
/// source's spec), so with it already written source-controller has nothing
/// to patch. Without it, source-controller's own status patches (at its
/// default 50 requests/s) trail the set-up by minutes and land in the
/// phases being measured.
fn status_body(artifact: &Value, message: &str) -> Value {
    json!({
        "apiVersion": SOURCE,
        "kind": "GitRepository",
        "status": {
            "observedGeneration": 1,
            "artifact": artifact,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Bench",
                "message": message, "lastTransitionTime": "2025-01-01T00:00:00Z",
            }],
        },
    })
}

pub async fn write_status(
    api: &Api<DynamicObject>,
    name: &str,
    artifact: &Value,
    message: &str,
) -> anyhow::Result<()> {
    api.patch_status(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(status_body(artifact, message)),
    )
    .await
    .with_context(|| format!("writing the status of GitRepository {name}"))?;
    Ok(())
}

/// Time to server-side apply `n` objects made by `make(name, i)` with
/// `concurrency` requests in flight.
pub async fn timed_applies(
    api: &Api<DynamicObject>,
    n: usize,
    concurrency: usize,
    make: impl Fn(&str, usize) -> Value,
) -> anyhow::Result<Duration> {
    let make = &make;
    let started = Instant::now();
    stream::iter(0..n)
        .map(|i| async move {
            let name = format!("plain-{i:05}");
            api.patch(
                &name,
                &PatchParams::apply(MANAGER),
                &Patch::Apply(make(&name, i)),
            )
            .await
            .with_context(|| format!("applying {name}"))
        })
        .buffer_unordered(concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(started.elapsed())
}

/// [`timed_applies`] watched as the initial sync is: the benchmark's
/// observer of the namespace's objects (through `watch`) runs from before
/// the first apply, and the floor ends when it has seen the last object,
/// as the sync ends when its observer has seen the last Artifact. So a
/// floor pays for the same watch (the API server sending each object, the
/// benchmark reading it) as the sync it is compared with.
pub async fn watched_applies(
    watch: Api<DynamicObject>,
    api: &Api<DynamicObject>,
    n: usize,
    concurrency: usize,
    make: impl Fn(&str, usize) -> Value,
) -> anyhow::Result<Duration> {
    let observer = Observer::start("floor object", watch, |o| o.metadata.name.clone());
    observer.synced(Duration::from_secs(60)).await?;
    let before = observer.count();
    let started = Instant::now();
    let applied = timed_applies(api, n, concurrency, make).await?;
    observer
        .until_count(before + n, false, Duration::from_secs(60), || Ok(()))
        .await?;
    let seen = observer
        .last_first_seen()
        .map_or(applied, |at| at.duration_since(started));
    Ok(seen.max(applied))
}

/// Deletes the objects of `api` that `selector` selects (all: empty) and
/// waits until a list shows none, bounded by `bound`; returns how long it
/// took. A floor removes what it wrote this way, so the phase after it
/// finds the API server holding what it held before the floor.
///
/// The API server cuts a DELETECOLLECTION off at its request timeout (60
/// seconds; tens of thousands of objects on a busy machine take longer),
/// having deleted only part of the collection; the next call goes on from
/// what is left.
pub async fn delete_all(
    api: &Api<DynamicObject>,
    selector: &str,
    bound: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let lp = ListParams::default().labels(selector);
    let first = lp.clone().limit(1);
    let mut cut_off = delete_collection(api, &lp).await;
    loop {
        if api.list_metadata(&first).await?.items.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > bound {
            let why = cut_off.map(|e| format!(" (the last DELETECOLLECTION: {e})"));
            anyhow::bail!(
                "a floor's objects were still there after {bound:?}{}",
                why.unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if cut_off.is_some() {
            cut_off = delete_collection(api, &lp).await;
        }
    }
}

/// One DELETECOLLECTION; its error, if the API server cut it off.
async fn delete_collection(api: &Api<DynamicObject>, lp: &ListParams) -> Option<kube::Error> {
    api.delete_collection(&DeleteParams::background(), lp)
        .await
        .err()
}

/// Creates `n` suspended GitRepositories in `ns` and writes an artifact
/// into the status of each, `concurrency` at a time.
pub async fn create_sources(
    repos: &Api<DynamicObject>,
    ns: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    stream::iter(0..n)
        .map(|i| {
            let repos = repos.clone();
            async move {
                let name = source_name(i);
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": SOURCE, "kind": "GitRepository",
                    "metadata": {"name": name, "namespace": ns, "finalizers": [FLUX_FINALIZER]},
                    "spec": {"url": "http://127.0.0.1:9/none.git", "interval": "10m",
                             "ref": {"branch": "main"}, "suspend": true},
                }))?;
                repos
                    .create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("creating GitRepository {name}"))?;
                write_status(&repos, &name, &artifact(ns, &name, i as u64 + 1), "set up").await
            }
        })
        .buffer_unordered(concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await
}

/// The Artifact openflux would write for source `i`, as the plain client
/// of the floor and the relay's target: openflux's labels, `name` in
/// `plain_ns`.
pub fn plain_artifact(plain_ns: &str, name: &str, i: usize) -> Value {
    let a = artifact(plain_ns, name, i as u64 + 1);
    json!({
        "apiVersion": cluster::ARTIFACT, "kind": "Artifact",
        "metadata": {"name": name, "labels": {
            MANAGED_BY_LABEL: MANAGED_BY,
            SOURCE_KIND_LABEL: "gitrepository",
            SOURCE_NAME_LABEL: source_name(i),
        }},
        "spec": {"url": a["url"], "revision": a["revision"], "digest": a["digest"],
                 "size": a["size"], "lastUpdateTime": a["lastUpdateTime"]},
    })
}

/// What the API server was asked during a phase, largest counts first.
pub fn print_requests(section: &str, phase: &str, before: &str, after: &str) {
    let grown = crate::process::requests_between(
        &crate::process::apiserver_requests(before),
        &crate::process::apiserver_requests(after),
    );
    let lines: Vec<String> = grown
        .iter()
        .take(16)
        .map(|(key, count)| format!("{count:.0} {key}"))
        .collect();
    eprintln!("{section}: {phase}, API server: {}", lines.join(", "));
}
