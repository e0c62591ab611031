//! The mirror on the local control plane: N suspended GitRepositories whose
//! `status.artifact` the bench writes, one `openflux run` scoped to their
//! namespace.
//!
//! - initial sync: openflux start to all N Artifacts seen by a watch;
//!   baseline: N server-side applies of ConfigMaps at openflux's concurrency;
//! - propagation: a status write to the Artifact's update seen by a watch;
//!   baseline: the same watch client seeing the source's own update;
//! - API writes per change and per no-op status write, from openflux's
//!   metrics and from the API server's;
//! - peak RSS of the openflux process.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::{stream, StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::cluster::{self, MANAGER, SOURCE};
use crate::observe::{string_at, Observer};
use crate::process::{self, Openflux};
use crate::report::Report;
use crate::stats::ms;

mod figures;

use crate::support::Env;
use figures::Measured;

pub struct Params {
    /// Numbers of sources, one run each.
    pub sizes: Vec<usize>,
    /// Status writes whose propagation is timed.
    pub samples: usize,
    /// Status writes that change no artifact.
    pub noop_samples: usize,
    /// openflux's `--concurrent`, and the baseline's client concurrency.
    pub concurrent: usize,
    /// Concurrency of the bench's own setup writes.
    pub setup_concurrency: usize,
    /// Wait for each namespace to be gone before the next size.
    pub wait_cleanup: bool,
    /// Whether a section runs after this one: if not, the namespaces of
    /// the last size are left to go away on their own (tens of minutes at
    /// 50,000 sources, and nothing left to measure).
    pub measured_after: bool,
}

/// The Flux finalizer, set at creation so source-controller has nothing to
/// write on a suspended source.
const FLUX_FINALIZER: &str = "finalizers.fluxcd.io";

fn source_name(i: usize) -> String {
    format!("repo-{i:05}")
}

/// A GitRepository `status.artifact` for `revision`.
fn artifact(ns: &str, name: &str, revision: u64) -> Value {
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

fn status_body(artifact: &Value, message: &str) -> Value {
    json!({
        "apiVersion": SOURCE,
        "kind": "GitRepository",
        "status": {
            "artifact": artifact,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Bench",
                "message": message, "lastTransitionTime": "2025-01-01T00:00:00Z",
            }],
        },
    })
}

async fn write_status(
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
async fn timed_applies(
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

pub async fn run(env: &Env, p: &Params, report: &mut Report) -> anyhow::Result<()> {
    cluster::install_crds(env).await?;
    report.param("mirror.sizes", &p.sizes);
    report.param("mirror.propagation_samples", p.samples);
    report.param("mirror.noop_samples", p.noop_samples);
    report.param("mirror.concurrent", p.concurrent);
    for (i, &n) in p.sizes.iter().enumerate() {
        let last = i + 1 == p.sizes.len();
        let ns = env.namespace("bench-mirror").await;
        let plain = env.namespace("bench-plain").await;
        let (name, plain_name) = (ns.name().to_string(), plain.name().to_string());
        let result = one_size(env, p, n, &name, &plain_name, report).await;
        let cleanup = (p.wait_cleanup && (p.measured_after || !last))
            .then(|| Duration::from_secs(120 + n as u64 / 20));
        let (a, b) = futures::join!(
            cluster::delete_namespace(env, ns, cleanup),
            cluster::delete_namespace(env, plain, cleanup)
        );
        if let (Some(a), Some(b)) = (a, b) {
            eprintln!(
                "mirror N={n}: namespaces deleted in {:.1}s",
                a.max(b).as_secs_f64()
            );
        }
        result.with_context(|| format!("mirror benchmark with N={n}"))?;
    }
    Ok(())
}

async fn one_size(
    env: &Env,
    p: &Params,
    n: usize,
    ns: &str,
    plain_ns: &str,
    report: &mut Report,
) -> anyhow::Result<()> {
    let section = format!("mirror N={n}");
    let client = &env.client;
    eprintln!("{section}: namespace {ns}");

    // Baseline: the API server accepting N plain writes at openflux's concurrency.
    let configmaps = cluster::api(
        client,
        ns,
        &cluster::resource("v1", "ConfigMap", "configmaps"),
    );
    let baseline_sync = timed_applies(&configmaps, n, p.concurrent, |name, i| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": MANAGER}},
            "data": {"revision": format!("main@sha1:{i:040x}")},
        })
    })
    .await?;
    eprintln!(
        "{section}: baseline, {n} ConfigMap applies at concurrency {}: {:.2}s",
        p.concurrent,
        baseline_sync.as_secs_f64()
    );
    // For comparison: the same number of Artifacts written by a plain
    // client, in a namespace openflux does not watch.
    let plain_artifacts = cluster::api(client, plain_ns, &cluster::artifacts());
    let artifact_sync = timed_applies(&plain_artifacts, n, p.concurrent, |name, i| {
        let a = artifact(plain_ns, name, i as u64 + 1);
        json!({
            "apiVersion": cluster::ARTIFACT, "kind": "Artifact",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": MANAGER}},
            "spec": {"url": a["url"], "revision": a["revision"], "digest": a["digest"],
                     "size": a["size"], "lastUpdateTime": a["lastUpdateTime"]},
        })
    })
    .await?;
    eprintln!(
        "{section}: {n} Artifact applies by a plain client at concurrency {}: {:.2}s",
        p.concurrent,
        artifact_sync.as_secs_f64()
    );

    // The sources, suspended, with an artifact in their status.
    let repos = cluster::api(client, ns, &cluster::git_repositories());
    let setup = Instant::now();
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
        .buffer_unordered(p.setup_concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    eprintln!(
        "{section}: {n} GitRepositories with status.artifact written in {:.1}s",
        setup.elapsed().as_secs_f64()
    );
    // The current artifact of each source, so a no-op write can repeat it.
    let mut current: Vec<Value> = (0..n)
        .map(|i| artifact(ns, &source_name(i), i as u64 + 1))
        .collect();

    let sources = Observer::start("GitRepository", repos.clone(), |o| {
        string_at(o, "/status/artifact/revision")
    });
    let artifacts = Observer::start(
        "Artifact",
        cluster::api(client, ns, &cluster::artifacts()),
        |o| string_at(o, "/spec/revision"),
    );
    sources.synced(Duration::from_secs(120)).await?;
    artifacts.synced(Duration::from_secs(60)).await?;
    if artifacts.count() != 0 {
        bail!("namespace {ns} already has Artifacts");
    }

    // Initial sync.
    let args = vec![
        "--watch-all-namespaces=false".to_string(),
        format!("--namespace={ns}"),
        format!("--concurrent={}", p.concurrent),
    ];
    let api_at_start = process::apiserver_metrics(client).await?;
    let mut of = Openflux::spawn(env, &format!("bench-mirror-{n}"), &args)?;
    let sync_timeout = Duration::from_secs(120) + Duration::from_millis(40 * n as u64);
    artifacts
        .until_count(n, false, sync_timeout, || of.check_alive())
        .await?;
    let present = artifacts
        .last_first_seen()
        .context("no Artifact seen")?
        .duration_since(of.started);
    eprintln!(
        "{section}: all Artifacts present after {:.2}s",
        present.as_secs_f64()
    );
    // Let the last writes and watch events settle.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Propagation of changes, one at a time.
    let of_before = of.metrics().await?;
    let api_before = process::apiserver_metrics(client).await?;
    // What the initial sync cost per source, for the record.
    let sync_writes = (process::apiserver_writes(&api_before, "openflux.dev", "artifacts")
        - process::apiserver_writes(&api_at_start, "openflux.dev", "artifacts"))
        / n as f64;
    let sync_reconciles = process::mirror_reconciles(&of_before) / n as f64;
    let mut via_openflux = Vec::with_capacity(p.samples);
    let mut via_source = Vec::with_capacity(p.samples);
    let mut revision = 1_000_000u64;
    for k in 0..p.samples {
        let i = (k * 7919 + 13) % n;
        let name = source_name(i);
        revision += 1;
        let next = artifact(ns, &name, revision);
        let rev = next["revision"].as_str().unwrap_or_default().to_string();
        let seen_source = sources.expect(&name, &rev);
        let seen_artifact = artifacts.expect(&format!("gitrepository-{name}"), &rev);
        let t0 = Instant::now();
        write_status(&repos, &name, &next, "changed").await?;
        let t_source = seen_source.wait(Duration::from_secs(30)).await?;
        let t_artifact = match seen_artifact.wait(Duration::from_secs(30)).await {
            Ok(t) => t,
            Err(e) => {
                of.check_alive()?;
                bail!("{e}\n{}", of.log_tail(30));
            }
        };
        via_source.push(ms(t_source.duration_since(t0)));
        via_openflux.push(ms(t_artifact.duration_since(t0)));
        current[i] = next;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let of_after = of.metrics().await?;
    let api_after = process::apiserver_metrics(client).await?;
    let changes = p.samples.max(1) as f64;
    let of_writes = (process::mirrored_writes(&of_after, "GitRepository")
        - process::mirrored_writes(&of_before, "GitRepository"))
        / changes;
    let api_writes = (process::apiserver_writes(&api_after, "openflux.dev", "artifacts")
        - process::apiserver_writes(&api_before, "openflux.dev", "artifacts"))
        / changes;

    // Status writes that change no artifact: a condition message only.
    let reconciles_before = process::mirror_reconciles(&of_after);
    let mut touched = Vec::new();
    for k in 0..p.noop_samples {
        let i = (k * 104_729 + 7) % n;
        if touched.contains(&i) {
            continue;
        }
        touched.push(i);
        write_status(&repos, &source_name(i), &current[i], &format!("no-op {k}")).await?;
    }
    // openflux reconciles each of them once; wait for that, bounded.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reconciled = 0.0;
    while Instant::now() < deadline {
        reconciled = process::mirror_reconciles(&of.metrics().await?) - reconciles_before;
        if reconciled >= touched.len() as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if reconciled < touched.len() as f64 {
        report.note(format!(
            "{section}: openflux reconciled {reconciled} of {} no-op status writes within 30s",
            touched.len()
        ));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let of_noop = of.metrics().await?;
    let api_noop = process::apiserver_metrics(client).await?;
    let noops = touched.len().max(1) as f64;
    let of_noop_writes = (process::mirrored_writes(&of_noop, "GitRepository")
        - process::mirrored_writes(&of_after, "GitRepository"))
        / noops;
    let api_noop_writes = (process::apiserver_writes(&api_noop, "openflux.dev", "artifacts")
        - process::apiserver_writes(&api_after, "openflux.dev", "artifacts"))
        / noops;

    let measured = Measured {
        present,
        baseline_sync,
        artifact_sync,
        sync_writes,
        sync_reconciles,
        via_openflux,
        via_source,
        peak_rss: of.peak_rss().map(|b| b as f64 / (1024.0 * 1024.0)),
        of_writes,
        api_writes,
        of_noop_writes,
        api_noop_writes,
    };
    of.stop();
    drop(artifacts);
    drop(sources);
    figures::push(&section, n, &measured, report);
    Ok(())
}
