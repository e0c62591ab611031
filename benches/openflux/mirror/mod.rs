//! The mirror on the local control plane: N suspended GitRepositories whose
//! `status.artifact` the bench writes, one `openflux run` scoped to their
//! namespace.
//!
//! - initial sync: openflux start to all N Artifacts seen by a watch;
//!   baselines: N server-side applies of ConfigMaps, and of the Artifacts
//!   openflux would write, at openflux's concurrency, each deleted before
//!   the next phase so every phase finds the API server holding the same;
//!   and the two-hop relay's first list of the same sources (`relay.rs`:
//!   the floor of openflux's path, which reads the sources as openflux
//!   does), timed by the same kind of watch;
//! - propagation: a status write to the Artifact's update seen by a watch;
//!   baselines: the same relay, and the same watch client seeing the
//!   source's own update (one hop);
//! - API writes per change and per no-op status write, from openflux's
//!   metrics and from the API server's;
//! - peak RSS of the openflux process, and of a restart with every Artifact
//!   present (`restart.rs`) next to it.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::cluster::{self, MANAGER};
use crate::observe::{string_at, Observer};
use crate::process::{self, Openflux};
use crate::report::Report;
use crate::stats::ms;

mod figures;
mod relay;
mod restart;
pub(crate) mod setup;

use crate::support::Env;
use figures::Measured;
use setup::{artifact, plain_artifact, source_name, watched_applies, write_status};

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

    // The sources, suspended, with an artifact in their status.
    let repos = cluster::api(client, ns, &cluster::git_repositories());
    let setup = Instant::now();
    setup::create_sources(&repos, ns, n, p.setup_concurrency).await?;
    eprintln!(
        "{section}: {n} GitRepositories with status.artifact written in {:.1}s",
        setup.elapsed().as_secs_f64()
    );
    // Baseline: the API server accepting N plain writes at openflux's
    // concurrency, after the sources exist: the API server's cost per
    // request grows with what it holds (its watch cache, its heap's
    // collection), so the floors are taken holding what openflux's sync
    // finds.
    let configmaps = cluster::api(
        client,
        ns,
        &cluster::resource("v1", "ConfigMap", "configmaps"),
    );
    let api_cpu_before = process::apiserver_metrics(client).await?;
    let baseline_sync = watched_applies(
        configmaps.clone(),
        &configmaps,
        n,
        p.concurrent,
        |name, i| {
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": MANAGER}},
                "data": {"revision": format!("main@sha1:{i:040x}")},
            })
        },
    )
    .await?;
    let api_cpu_after = process::apiserver_metrics(client).await?;
    let baseline_api_cpu = process::apiserver_cpu_seconds(&api_cpu_after)
        - process::apiserver_cpu_seconds(&api_cpu_before);
    setup::print_requests(&section, "baseline", &api_cpu_before, &api_cpu_after);
    eprintln!(
        "{section}: baseline, {n} ConfigMap applies at concurrency {}: {:.2}s",
        p.concurrent,
        baseline_sync.as_secs_f64()
    );
    let delete_bound = Duration::from_secs(120) + Duration::from_millis(10 * n as u64);
    let cleared = setup::delete_all(
        &configmaps,
        &format!("app.kubernetes.io/managed-by={MANAGER}"),
        delete_bound,
    )
    .await?;
    eprintln!(
        "{section}: the ConfigMaps deleted in {:.1}s",
        cleared.as_secs_f64()
    );
    // The floor of openflux's own writes: the Artifacts it would write
    // (its labels, and its identity where the control plane gives it one,
    // so the same RBAC and admission policy judge them), by a plain client
    // at the same concurrency, in a namespace openflux does not watch.
    let writer = match env.vars.get("OPENFLUX_E2E_OPENFLUX_KUBECONFIG") {
        Some(_) => crate::support::identity::openflux_client(env).await,
        None => client.clone(),
    };
    let plain_artifacts = cluster::api(&writer, plain_ns, &cluster::artifacts());
    let plain_artifact = |name: &str, i: usize| plain_artifact(plain_ns, name, i);
    let api_cpu_before = process::apiserver_metrics(client).await?;
    let plain_admin = cluster::api(client, plain_ns, &cluster::artifacts());
    let artifact_sync = watched_applies(
        plain_admin.clone(),
        &plain_artifacts,
        n,
        p.concurrent,
        plain_artifact,
    )
    .await?;
    let artifact_api_cpu =
        process::apiserver_cpu_seconds(&process::apiserver_metrics(client).await?)
            - process::apiserver_cpu_seconds(&api_cpu_before);
    eprintln!(
        "{section}: the same {n} Artifacts applied by a plain client at concurrency {}: {:.2}s, {artifact_api_cpu:.1} API server CPU-seconds",
        p.concurrent,
        artifact_sync.as_secs_f64()
    );
    // The sync then finds what the floors found: the N sources, nothing
    // of the floors' N writes each.
    let cleared = setup::delete_all(&plain_admin, "", delete_bound).await?;
    eprintln!(
        "{section}: the plain Artifacts deleted in {:.1}s",
        cleared.as_secs_f64()
    );
    let sync_timeout = Duration::from_secs(120) + Duration::from_millis(40 * n as u64);
    let relay_sync = relay::sync_floor(
        &repos,
        client,
        &plain_artifacts,
        plain_ns,
        n,
        p,
        sync_timeout,
    )
    .await?;

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
    artifacts
        .until_count(n, false, sync_timeout, || of.check_alive())
        .await?;
    let present = artifacts
        .last_first_seen()
        .context("no Artifact seen")?
        .duration_since(of.started);
    let first = artifacts
        .first_first_seen()
        .context("no Artifact seen")?
        .duration_since(of.started);
    let sync_openflux_cpu = of.cpu_seconds();
    let api_at_sync = process::apiserver_metrics(client).await?;
    let sync_api_cpu = process::apiserver_cpu_seconds(&api_at_sync)
        - process::apiserver_cpu_seconds(&api_at_start);
    setup::print_requests(&section, "initial sync", &api_at_start, &api_at_sync);
    eprintln!(
        "{section}: all Artifacts present after {:.2}s",
        present.as_secs_f64()
    );
    // Let the last writes and watch events settle.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The two-hop floor: the relay again, running beside openflux from
    // here on. Its first list writes its Artifacts again (untimed), so its
    // writes after are updates, as openflux's are.
    let relayed = relay::observer(client, plain_ns).await?;
    let api_before_relay = process::apiserver_metrics(client).await?;
    let (relay, _) = relay::sync(&repos, &plain_artifacts, &relayed, n, p, sync_timeout).await?;
    let api_after_relay = process::apiserver_metrics(client).await?;

    // Propagation of changes, one at a time.
    let of_before = of.metrics().await?;
    let relay_before = relay.writes();
    let api_before = process::apiserver_metrics(client).await?;
    // What the initial sync cost per source, for the record.
    // openflux's writes from its start until now, without the relay's
    // Artifacts written again in between.
    let writes = |m: &str| process::apiserver_writes(m, "openflux.dev", "artifacts");
    let sync_writes = (writes(&api_before) - writes(&api_at_start) + writes(&api_before_relay)
        - writes(&api_after_relay))
        / n as f64;
    let sync_reconciles = process::mirror_reconciles(&of_before) / n as f64;
    let mut via_openflux = Vec::with_capacity(p.samples);
    let mut via_source = Vec::with_capacity(p.samples);
    let mut via_relay = Vec::with_capacity(p.samples);
    let mut revision = 1_000_000u64;
    for k in 0..p.samples {
        let i = (k * 7919 + 13) % n;
        let name = source_name(i);
        revision += 1;
        let next = artifact(ns, &name, revision);
        let rev = next["revision"].as_str().unwrap_or_default().to_string();
        let seen_source = sources.expect(&name, &rev);
        let seen_artifact = artifacts.expect(&format!("gitrepository-{name}"), &rev);
        let seen_relayed = relayed.expect(&relay::target_name(&name), &rev);
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
        let t_relayed = seen_relayed.wait(Duration::from_secs(30)).await?;
        via_source.push(ms(t_source.duration_since(t0)));
        via_relay.push(ms(t_relayed.duration_since(t0)));
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
    let relay_after = relay.writes();
    let api_writes = (process::apiserver_writes(&api_after, "openflux.dev", "artifacts")
        - process::apiserver_writes(&api_before, "openflux.dev", "artifacts")
        - (relay_after - relay_before))
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
        - process::apiserver_writes(&api_after, "openflux.dev", "artifacts")
        - (relay.writes() - relay_after))
        / noops;
    drop(relay);
    drop(relayed);
    let first_peak_rss = of.peak_rss().map(|b| b as f64 / (1024.0 * 1024.0));
    of.stop();

    // A restart with every Artifact present.
    let restart = restart::measure(
        env,
        &format!("bench-mirror-restart-{n}"),
        &args,
        n,
        sync_timeout,
    )
    .await?;
    eprintln!(
        "{section}: restart: every source reconciled after {:.2}s, peak RSS {:.1} MiB (first start {:.1} MiB)",
        restart.reconciled.as_secs_f64(),
        restart.peak_rss.unwrap_or(f64::NAN),
        first_peak_rss.unwrap_or(f64::NAN),
    );

    let measured = Measured {
        present,
        first,
        baseline_sync,
        artifact_sync,
        relay_sync,
        sync_writes,
        sync_reconciles,
        sync_api_cpu,
        baseline_api_cpu,
        sync_openflux_cpu,
        via_openflux,
        via_source,
        via_relay,
        peak_rss: first_peak_rss,
        restart,
        of_writes,
        api_writes,
        of_noop_writes,
        api_noop_writes,
    };
    drop(artifacts);
    drop(sources);
    figures::push(&section, n, &measured, report);
    Ok(())
}
