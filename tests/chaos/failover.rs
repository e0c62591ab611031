//! Failover under load on the local control plane: two openflux replicas
//! elect a leader (with short Lease timings), Artifacts are updated many
//! times in a row, and half way through the leader is killed with SIGKILL
//! (no shutdown, no Lease release). Every Artifact's last revision must
//! reach its export (an ExternalArtifact or a shadow OCIRepository), within a bound after the last
//! update.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use kube::api::{ListParams, Patch, PatchParams};
use openflux_testkit as support;
use serde_json::json;
use support::openflux::Openflux;

pub const ARTIFACT: &str = "openflux.dev/v1alpha1";
const SOURCE: &str = "source.toolkit.fluxcd.io/v1";
/// Artifacts the updates go round.
pub const ARTIFACTS: usize = 10;
/// How long the last revisions may take to be exported before they count
/// as lost.
pub const CONVERGENCE_BOUND: Duration = Duration::from_secs(10);

/// What a run measured.
#[derive(Debug)]
pub struct Outcome {
    pub updates: usize,
    /// Artifacts whose last revision was not exported within the bound.
    pub lost: usize,
    /// From the last update until every last revision was exported.
    pub converged_after: Duration,
    /// From the kill until the standby led.
    pub failover_after: Duration,
    /// Updates written per second.
    pub update_rate: f64,
}

/// One replica with short Lease timings (4 s, 3 s, 1 s), in namespace `ns`.
pub async fn start(env: &support::Env, ns: &str) -> Openflux {
    let identity = support::identity::openflux_kubeconfig(env);
    start_as(env, ns, identity).await
}

/// [`start`] with the kubeconfig `kubeconfig` (for example one that goes
/// through a [`support::proxy::ApiProxy`]).
pub async fn start_as(
    env: &support::Env,
    ns: &str,
    kubeconfig: Option<std::path::PathBuf>,
) -> Openflux {
    Openflux::start_as(
        env,
        ns,
        &[
            "--watch-all-namespaces=false",
            &format!("--namespace={ns}"),
            "--enable-leader-election",
            "--leader-election-lease-duration=4s",
            "--leader-election-renew-deadline=3s",
            "--leader-election-retry-period=1s",
            &format!("--webhook-addr={}", support::openflux::free_addr()),
        ],
        kubeconfig,
    )
    .await
}

pub async fn leads(of: &Openflux) -> bool {
    of.metric("openflux_leader ").await == Some(1.0)
}

/// Two replicas in namespace `ns`, one of them leading (its index is
/// returned), and [`ARTIFACTS`] Artifacts `a0`.. at revision `start`.
pub async fn two_replicas(env: &support::Env, ns: &str) -> anyhow::Result<([Openflux; 2], usize)> {
    let replicas = [start(env, ns).await, start(env, ns).await];
    let leader = support::wait_for("one replica to lead", support::TIMEOUT, || async {
        for (i, of) in replicas.iter().enumerate() {
            if leads(of).await {
                return Some(i);
            }
        }
        None
    })
    .await;
    create_artifacts(env, ns).await?;
    Ok((replicas, leader))
}

/// [`ARTIFACTS`] Artifacts `a0`.. in `ns`, at revision `start`.
pub async fn create_artifacts(env: &support::Env, ns: &str) -> anyhow::Result<()> {
    let digest = format!("sha256:{}", "0".repeat(64));
    for j in 0..ARTIFACTS {
        env.apply(&json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": format!("a{j}"), "namespace": ns},
            "spec": {"url": "http://127.0.0.1:1/a.tar.gz", "revision": "start", "digest": digest},
        }))
        .await
        .context("creating an Artifact")?;
    }
    Ok(())
}

/// The APIs of the kinds exports may have: ExternalArtifacts or shadow
/// OCIRepositories, as the cluster's Flux flags allow.
pub async fn export_apis(
    env: &support::Env,
    ns: &str,
) -> Vec<kube::Api<kube::core::DynamicObject>> {
    let mut kinds = Vec::new();
    for kind in ["ExternalArtifact", "OCIRepository"] {
        if let Ok((api, _)) = support::dynamic_api(&env.client, SOURCE, kind, Some(ns)).await {
            kinds.push(api);
        }
    }
    kinds
}

/// Each exported Artifact's name and the revision its export carries.
pub async fn exported(
    apis: &[kube::Api<kube::core::DynamicObject>],
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut seen = BTreeMap::new();
    for api in apis {
        let list = api.list(&ListParams::default()).await?;
        seen.extend(list.items.iter().filter_map(|export| {
            // The Artifact it is exported from: its owner.
            let name = export
                .metadata
                .owner_references
                .as_ref()?
                .iter()
                .find(|o| o.kind == "Artifact")?
                .name
                .clone();
            // The Artifact's own revision: a shadow keeps it in its
            // origin metadata when its revision had to be the digest.
            let artifact = export.data.pointer("/status/artifact")?;
            let revision = artifact
                .pointer("/metadata/org.opencontainers.image.revision")
                .or_else(|| artifact.get("revision"))?
                .as_str()?
                .to_string();
            Some((name, revision))
        }));
    }
    Ok(seen)
}

/// Runs the scenario with `updates` Artifact updates.
pub async fn run(updates: usize) -> anyhow::Result<Outcome> {
    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("failover").await;
    let n = ns.name().to_string();
    let (mut replicas, leader) = two_replicas(&env, &n).await?;
    let (artifacts, _) = support::dynamic_api(&env.client, ARTIFACT, "Artifact", Some(&n)).await?;
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let started = Instant::now();
    let mut killed_at = None;
    for i in 0..updates {
        let name = format!("a{}", i % ARTIFACTS);
        let revision = format!("r{i}");
        artifacts
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"revision": revision}})),
            )
            .await
            .with_context(|| format!("update {i}"))?;
        last.insert(name, revision);
        if i == updates / 2 {
            replicas[leader].kill();
            killed_at = Some(Instant::now());
        }
    }
    let last_update = Instant::now();
    let update_rate = updates as f64 / started.elapsed().as_secs_f64();
    let standby = &replicas[1 - leader];
    let kinds = export_apis(&env, &n).await;
    let mut failover_after = None;
    let mut missing = usize::MAX;
    while last_update.elapsed() < CONVERGENCE_BOUND * 3 {
        if failover_after.is_none() && leads(standby).await {
            failover_after = killed_at.map(|k| k.elapsed());
        }
        let seen = exported(&kinds).await?;
        missing = last
            .iter()
            .filter(|(k, v)| seen.get(*k) != Some(*v))
            .count();
        if missing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converged_after = last_update.elapsed();
    let failover_after = match failover_after {
        Some(d) => d,
        None if leads(standby).await => killed_at.map_or(Duration::ZERO, |k| k.elapsed()),
        None => return Err(anyhow!("the standby never led:\n{}", standby.log_tail(30))),
    };
    let lost = missing;
    drop(replicas);
    ns.delete().await;
    Ok(Outcome {
        updates,
        lost,
        converged_after,
        failover_after,
        update_rate,
    })
}
