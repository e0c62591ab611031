//! The webhook of this tree against a previous release's, in the same run:
//! a regression shows as a ratio below 1.
//!
//! Both are built here with the release profile (`cargo build --release
//! --locked`: this tree in `target/bench-previous/`, the previous commit in
//! a clone of its own under the e2e build cache, kept between runs) and run as `openflux
//! run` against the local control plane, side by side, on the same
//! serving certificate. They answer from what they watch: one namespace
//! of custom sources (`TestSource`) with one Artifact each. The same load
//! generator as the webhook section drives each in turn, the order
//! alternating between rounds, with Kustomization reviews naming those
//! sources; both must patch every one before anything is measured.
//!
//! Besides requests per second (saturated) and the latency at a fixed
//! rate, the CPU time each process spent per answered request, read from
//! `/proc`: it does not move with what else the machine runs, so it is
//! the figure to bisect a regression with.
//!
//! `cargo bench --bench openflux -- --only previous [--previous-commit REV]`
//! (by default `OPENFLUX_PREVIOUS_RELEASE` of e2e/versions.env).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use axum::body::Bytes;
use kube::api::{Patch, PatchParams};
use kube::ResourceExt;
use openflux::webhook::server::MUTATE_PATH;
use rustls::pki_types::ServerName;
use serde_json::{json, Value};

use crate::cluster::{self, ARTIFACT, MANAGER, TEST_SOURCE};
use crate::loadgen::{self, Connection, Target};
use crate::process::Openflux;
use crate::report::{Figure, Report};
use crate::stats::{median, summarize};
use crate::support::{release, workspace_root, Env};
use crate::webhook_setup::RECORDED;
use crate::WebhookParams;

const SECTION: &str = "webhook vs. previous release";
/// Custom sources in the namespace, one Artifact each; requests name them
/// in turn.
const SOURCES: usize = 100;

pub async fn run(
    env: &Env,
    p: &WebhookParams,
    previous: Option<&str>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let commit = match previous {
        Some(rev) => resolve(rev)?,
        None => release::previous_commit(),
    };
    let (this, before) = tokio::task::spawn_blocking({
        let commit = commit.clone();
        move || -> anyhow::Result<(PathBuf, PathBuf)> {
            // Not target/release: `cargo bench` builds the bench profile
            // there, and each build would undo the other's.
            let root = workspace_root();
            let this = build(&root, &root.join("target/bench-previous"))?;
            let base = release::cache_root().join("bench-previous");
            let tree = release::checkout_at(&commit, &base);
            let before = build(&tree, &base.join("target"))?;
            Ok((this, before))
        }
    })
    .await??;
    report
        .versions
        .insert("previous release (compared)".into(), commit.clone());

    cluster::install_crds(env).await?;
    let ns = env.namespace("bench-previous").await;
    let name = ns.name().to_string();
    let result = measure(env, p, &name, [&this, &before], report).await;
    cluster::delete_namespace(env, ns, Some(Duration::from_secs(60))).await;
    result
}

/// The full commit `rev` names in this repository.
fn resolve(rev: &str) -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(workspace_root())
        .args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .output()
        .context("running git rev-parse")?;
    if !out.status.success() {
        bail!(
            "--previous-commit {rev}: not a commit of this repository: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `openflux` built with the release profile from the workspace at `tree`
/// into `target`: the binary's path.
fn build(tree: &Path, target: &Path) -> anyhow::Result<PathBuf> {
    eprintln!(
        "previous: building {} (release profile) into {}",
        tree.display(),
        target.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(tree)
        .env("CARGO_TARGET_DIR", target)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "openflux",
            "--bin",
            "openflux",
        ])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!(
            "cargo build --release in {} failed ({status})",
            tree.display()
        );
    }
    Ok(target.join("release/openflux"))
}

/// The two builds, as the figures name them.
const NAMES: [&str; 2] = ["this tree", "previous release"];

async fn measure(
    env: &Env,
    p: &WebhookParams,
    ns: &str,
    binaries: [&Path; 2],
    report: &mut Report,
) -> anyhow::Result<()> {
    // One serving certificate for both, trusted by the load generator.
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .context("a serving certificate")?;
    let dir = std::env::temp_dir().join(crate::support::unique_name("bench-previous-tls"));
    std::fs::create_dir_all(&dir)?;
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert.cert.pem())?;
    std::fs::write(&key_file, cert.signing_key.serialize_pem())?;

    sources(env, ns).await?;
    // Both in the namespace alone, with the same lease: one leads and
    // exports, the other only serves (as a second replica does); the
    // webhook answers from what each watches either way. Without the lease
    // both would export, each rewriting what the other wrote, and the API
    // server's work would take the CPU being measured.
    let args = vec![
        "--enable-leader-election=true".to_string(),
        "--watch-all-namespaces=false".to_string(),
        format!("--namespace={ns}"),
        "--export=shadow".to_string(),
        "--verify-artifact-writers=false".to_string(),
        format!("--tls-cert-file={}", cert_file.display()),
        format!("--tls-key-file={}", key_file.display()),
        format!("--log-level={}", p.log_level),
    ];
    let mut processes = Vec::new();
    for (binary, name) in binaries.into_iter().zip(NAMES) {
        let mut of = Openflux::spawn_binary(env, binary, "bench-previous", &args)
            .with_context(|| format!("starting {name}"))?;
        of.wait_serving(Duration::from_secs(60))
            .await
            .with_context(|| format!("{name} at {}", binary.display()))?;
        processes.push(of);
    }
    let client_tls = loadgen::client_config(cert.cert.pem().as_bytes())?;
    let server_name = ServerName::try_from("localhost")?;
    let bodies = bodies(ns)?;
    let targets: Vec<Arc<Target>> = processes
        .iter()
        .map(|of| {
            Target::new(
                of.webhook_addr,
                client_tls.clone(),
                server_name.clone(),
                MUTATE_PATH,
                bodies.clone(),
            )
        })
        .collect();
    for (target, name) in targets.iter().zip(NAMES) {
        patches_all(target)
            .await
            .with_context(|| format!("{name} does not patch every request"))?;
    }

    report.param("previous.sources", SOURCES);
    report.param("previous.connections", p.connections);
    report.param("previous.seconds_per_run", p.seconds);
    report.param("previous.rounds", p.rounds);
    let warmup = Duration::from_secs_f64(p.warmup);
    let duration = Duration::from_secs_f64(p.seconds);
    let mut rate = [Vec::new(), Vec::new()];
    let mut cpu = [Vec::new(), Vec::new()];
    let mut latency = [Vec::new(), Vec::new()];
    for round in 0..p.rounds {
        // Alternate the order, so neither always runs first.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let before = processes[i].cpu_seconds().context("reading /proc")?;
            let s = loadgen::saturate(&targets[i], p.connections, warmup, duration).await?;
            let spent = processes[i].cpu_seconds().context("reading /proc")? - before;
            // The warm-up's answers cost CPU too: spread it over all of them.
            let answered = s.answered as f64;
            eprintln!(
                "previous round {round}: {} saturated at {:.0} req/s, {:.1} µs CPU a request",
                NAMES[i],
                s.per_second,
                spent * 1e6 / answered
            );
            rate[i].push(s.per_second);
            cpu[i].push(spent * 1e6 / answered);
        }
        for i in order {
            let r = loadgen::paced(&targets[i], p.connections, p.rate, warmup, duration).await?;
            latency[i].extend(r.latencies_ms);
        }
    }
    for of in &mut processes {
        of.check_alive()?;
        of.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);

    let (now, then) = (median(&rate[0]), median(&rate[1]));
    report.push(
        Figure::new(
            SECTION,
            &format!(
                "throughput, saturated, {} connections, median of {} (req/s)",
                p.connections, p.rounds
            ),
            "req/s",
            now,
        )
        .baseline(then)
        .target("ratio >= 0.98", now / then >= 0.98),
    );
    let (now, then) = (median(&cpu[0]), median(&cpu[1]));
    report.push(
        Figure::new(SECTION, "CPU time a request, median", "µs", now)
            .baseline(then)
            .target("ratio <= 1.02", now / then <= 1.02),
    );
    let (now, then) = (summarize(latency[0].clone()), summarize(latency[1].clone()));
    let at = p.rate;
    report.push(
        Figure::new(
            SECTION,
            &format!("p50 latency at {at:.0} req/s"),
            "ms",
            now.p50,
        )
        .baseline(then.p50),
    );
    report.push(
        Figure::new(
            SECTION,
            &format!("p99 latency at {at:.0} req/s"),
            "ms",
            now.p99,
        )
        .baseline(then.p99),
    );
    report.samples("previous: saturated req/s per round, this tree", &rate[0]);
    report.samples(
        "previous: saturated req/s per round, previous release",
        &rate[1],
    );
    report.samples("previous: CPU µs a request per round, this tree", &cpu[0]);
    report.samples(
        "previous: CPU µs a request per round, previous release",
        &cpu[1],
    );
    Ok(())
}

fn source_name(i: usize) -> String {
    format!("src-{i:03}")
}

/// The namespace's custom sources and their Artifacts, applied; returns
/// once each Artifact is stored.
async fn sources(env: &Env, ns: &str) -> anyhow::Result<()> {
    let artifacts = cluster::api(&env.client, ns, &cluster::artifacts());
    for i in 0..SOURCES {
        let name = source_name(i);
        let source = env
            .apply(&json!({
                "apiVersion": TEST_SOURCE, "kind": "TestSource",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"producer": "openflux-bench"},
            }))
            .await?;
        let owner = json!([{
            "apiVersion": TEST_SOURCE, "kind": "TestSource", "name": name,
            "uid": source.uid().context("TestSource without uid")?, "controller": true,
        }]);
        let body = json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": name, "ownerReferences": owner},
            "spec": {
                "url": format!("http://127.0.0.1:1/{ns}/{name}.tar.gz"),
                "revision": "v1",
                "digest": format!("sha256:{i:064x}"),
            },
        });
        artifacts
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
            .context("writing an Artifact")?;
    }
    Ok(())
}

/// The recorded Kustomization review, once for each source of `ns`.
fn bodies(ns: &str) -> anyhow::Result<Vec<Bytes>> {
    let recorded: Value = serde_json::from_str(RECORDED).context("the recorded review")?;
    let mut bodies = Vec::with_capacity(SOURCES);
    for i in 0..SOURCES {
        let mut review = recorded.clone();
        let name = format!("app-{i}");
        for (pointer, value) in [
            ("/request/uid", format!("00000000-0000-4000-8000-{i:012}")),
            ("/request/name", name.clone()),
            ("/request/namespace", ns.to_string()),
            ("/request/object/metadata/name", name.clone()),
            ("/request/object/metadata/namespace", ns.to_string()),
            (
                "/request/object/spec/sourceRef/apiVersion",
                TEST_SOURCE.to_string(),
            ),
            (
                "/request/object/spec/sourceRef/kind",
                "TestSource".to_string(),
            ),
            ("/request/object/spec/sourceRef/name", source_name(i)),
        ] {
            *review
                .pointer_mut(pointer)
                .with_context(|| format!("the recorded review has no {pointer}"))? =
                Value::String(value);
        }
        bodies.push(Bytes::from(serde_json::to_vec(&review)?));
    }
    Ok(bodies)
}

/// Waits (bounded) until `target` allows and patches every request: it
/// has seen every Artifact.
async fn patches_all(target: &Arc<Target>) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut conn = Connection::open(target).await?;
    let mut last = String::new();
    loop {
        let mut all = true;
        for body in &target.bodies {
            let answer: Value = serde_json::from_slice(&conn.post(body.clone()).await?)?;
            let patched = answer.pointer("/response/allowed") == Some(&Value::Bool(true))
                && answer
                    .pointer("/response/patchType")
                    .and_then(Value::as_str)
                    == Some("JSONPatch");
            if !patched {
                all = false;
                last = answer.to_string();
                break;
            }
        }
        if all {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("not every request patched after 60 s; the last answer: {last:.400}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
