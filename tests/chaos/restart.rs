//! The API server and etcd crash under load: two openflux replicas (as in
//! the failover scenario) while Artifacts are updated many times in a row;
//! half way through, etcd and kube-apiserver are killed with SIGKILL, kept
//! down a few seconds and started again (`e2e/cluster crash-api`,
//! `start-api`). The writer keeps retrying its update meanwhile, as a
//! producer would. openflux must come back on its own: the same processes
//! ready again, one of them leading, and every Artifact's last revision
//! exported.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use kube::api::{Patch, PatchParams};
use openflux_testkit as support;
use serde_json::json;
use support::openflux::{http_get, Openflux};

use crate::failover::{self, ARTIFACTS, CONVERGENCE_BOUND};

/// How long etcd and kube-apiserver stay down.
pub const DOWN_FOR: Duration = Duration::from_secs(5);
/// How long openflux may take, from the API server being ready again,
/// until both replicas are ready, one leads and every update acknowledged
/// before that moment is exported.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(30);
/// How long one update is retried while the API server is away.
const WRITE_RETRY_BOUND: Duration = Duration::from_secs(120);

/// What a run measured.
#[derive(Debug)]
pub struct Outcome {
    pub updates: usize,
    /// Artifacts whose last revision was not exported within the bound.
    pub lost: usize,
    /// From SIGKILL until the API server answered ready again.
    pub down_for: Duration,
    /// From the API server ready again until openflux caught up (see
    /// [`RECOVERY_BOUND`]).
    pub recovered_after: Duration,
    /// From the last update until every last revision was exported.
    pub converged_after: Duration,
    /// Both replicas are the processes started before the crash.
    pub same_processes: bool,
}

/// Runs `e2e/cluster ARG` (blocking), failing with what it printed.
fn cluster_script(arg: &str) -> anyhow::Result<()> {
    let script = support::cluster_script();
    let out = std::process::Command::new(&script)
        .arg(arg)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {} {arg}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {arg} failed ({}):\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Starts etcd and kube-apiserver again if they are down, whatever
/// happened to the scenario (so the control plane is whole for what runs
/// next).
struct Restore {
    crashed: bool,
}

impl Drop for Restore {
    fn drop(&mut self) {
        if self.crashed {
            if let Err(e) = cluster_script("start-api") {
                eprintln!("restoring the API server: {e:#}");
            }
        }
    }
}

/// Whether one of the replicas leads (`None` when a metrics endpoint does
/// not answer).
async fn one_leads(replicas: &[Openflux]) -> bool {
    for of in replicas {
        if let Some((200, body)) = http_get(of.metrics_addr, "/metrics").await {
            if body.lines().any(|l| l == "openflux_leader 1") {
                return true;
            }
        }
    }
    false
}

/// The number in revision `r{i}`.
fn revision_number(revision: &str) -> Option<usize> {
    revision.strip_prefix('r')?.parse().ok()
}

/// Runs the scenario with `updates` Artifact updates.
pub async fn run(updates: usize) -> anyhow::Result<Outcome> {
    let env = support::cluster().await;
    if !env.local {
        bail!(
            "the API server restart scenario needs the local control plane of e2e/cluster \
             (it kills and restarts etcd and kube-apiserver); KUBECONFIG points elsewhere"
        );
    }
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("restart").await;
    let n = ns.name().to_string();
    let (mut replicas, _) = failover::two_replicas(&env, &n).await?;
    let pids: Vec<_> = replicas.iter().map(Openflux::pid).collect();
    let (artifacts, _) =
        support::dynamic_api(&env.client, failover::ARTIFACT, "Artifact", Some(&n)).await?;
    let kinds = failover::export_apis(&env, &n).await;
    // The last update acknowledged per Artifact, shared with the watcher
    // of the recovery.
    let acked: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let mut restore = Restore { crashed: false };
    let mut crash = None;
    for i in 0..updates {
        let name = format!("a{}", i % ARTIFACTS);
        let patch = Patch::Merge(json!({"spec": {"revision": format!("r{i}")}}));
        let started = Instant::now();
        // While the API server is away the write fails: retried, as a
        // producer would.
        loop {
            match artifacts
                .patch(&name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => break,
                Err(e) if started.elapsed() > WRITE_RETRY_BOUND => {
                    return Err(e).with_context(|| format!("update {i}, retried for 2 min"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, i);
        if i == updates / 2 {
            restore.crashed = true;
            crash = Some(tokio::spawn(crash_and_watch(
                acked.clone(),
                kinds.clone(),
                [replicas[0].health_addr, replicas[1].health_addr],
            )));
        }
    }
    let last_update = Instant::now();
    let crash = crash.context("fewer than two updates: nothing to crash under")?;
    let (down_for, recovery) = crash.await.context("the crash task")??;
    restore.crashed = false;
    let last = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut missing = usize::MAX;
    while last_update.elapsed() < CONVERGENCE_BOUND * 3 {
        let seen = failover::exported(&kinds).await?;
        missing = last
            .iter()
            .filter(|(k, v)| seen.get(*k).and_then(|r| revision_number(r)) != Some(**v))
            .count();
        if missing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converged_after = last_update.elapsed();
    let recovered_after = match recovery {
        Some(d) if one_leads(&replicas).await => d,
        _ => bail!(
            "openflux did not recover within {RECOVERY_BOUND:?} of the API server's return \
             (ready, leading, caught up):\n{}\n----\n{}",
            replicas[0].log_tail(30),
            replicas[1].log_tail(30)
        ),
    };
    let same_processes = replicas.iter_mut().all(Openflux::running)
        && replicas.iter().map(Openflux::pid).collect::<Vec<_>>() == pids;
    drop(replicas);
    ns.delete().await;
    Ok(Outcome {
        updates,
        lost: missing,
        down_for,
        recovered_after,
        converged_after,
        same_processes,
    })
}

/// Kills etcd and kube-apiserver, keeps them down for [`DOWN_FOR`], starts
/// them again, then watches openflux catch up: how long the API server was
/// away, and the time from its return until both replicas are ready and
/// every update acknowledged by then is exported (`None`: not within
/// [`RECOVERY_BOUND`]).
async fn crash_and_watch(
    acked: Arc<Mutex<BTreeMap<String, usize>>>,
    kinds: Vec<kube::Api<kube::core::DynamicObject>>,
    health: [std::net::SocketAddr; 2],
) -> anyhow::Result<(Duration, Option<Duration>)> {
    let killed = Instant::now();
    tokio::task::spawn_blocking(|| cluster_script("crash-api")).await??;
    tokio::time::sleep(DOWN_FOR).await;
    tokio::task::spawn_blocking(|| cluster_script("start-api")).await??;
    let back = Instant::now();
    let down_for = back - killed;
    let wanted = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    while back.elapsed() < RECOVERY_BOUND {
        let mut all_ready = true;
        for addr in health {
            all_ready &= matches!(http_get(addr, "/readyz").await, Some((200, _)));
        }
        let caught_up = match failover::exported(&kinds).await {
            Ok(seen) => wanted.iter().all(|(name, i)| {
                seen.get(name)
                    .and_then(|r| revision_number(r))
                    .is_some_and(|r| r >= *i)
            }),
            Err(_) => false,
        };
        if all_ready && caught_up {
            return Ok((down_for, Some(back.elapsed())));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((down_for, None))
}
