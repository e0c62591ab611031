//! Faults at the level of Pods, counted from the client side: the leader's
//! Pod deleted during Artifact updates, a rolling update to a new image, a
//! flood of maximum-size reviews against the container's memory limit.
//! Each prints its figures (docs/reliability.md, "Pods and nodes").

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use openflux_testkit as support;
use serde_json::json;
use support::pods::{leader_pod, openflux_pods, MemoryCgroup, OpenfluxPod, OPENFLUX_PODS, SYSTEM};
use support::Env;

use super::failover;
use super::load::{self, Admissions};
use super::{all_available, installed, ROLLOUT};

const ARTIFACT: &str = "openflux.dev/v1alpha1";
/// Artifacts the updates go round.
const ARTIFACTS: usize = 10;
const UPDATES: usize = 500;

/// openflux as installed: its Deployment Available and exactly its two
/// replicas' Pods, none of an earlier rollout still terminating.
pub(crate) async fn settled(env: &Env) {
    all_available(env, SYSTEM, &["openflux"]).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM);
    support::wait_for("openflux's two Pods, none terminating", ROLLOUT, || async {
        let list = pods
            .list(&ListParams::default().labels(OPENFLUX_PODS))
            .await
            .ok()?;
        let live = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        (list.items.len() == 2 && live == 2).then_some(())
    })
    .await;
}

/// Waits until every Artifact's last revision in `last` is exported; how
/// long that took.
async fn all_exported(env: &Env, ns: &str, last: &BTreeMap<String, String>) -> Duration {
    let started = Instant::now();
    support::wait_for(
        "every Artifact's last revision to be exported",
        ROLLOUT,
        || async {
            let apis = failover::export_apis(env, ns).await;
            let seen = failover::exported(&apis).await.ok()?;
            last.iter()
                .all(|(name, revision)| seen.get(name) == Some(revision))
                .then_some(())
        },
    )
    .await;
    started.elapsed()
}

/// The leader's Pod is deleted (as `kubectl delete pod` or a node drain
/// does) half way through 500 Artifact updates while admissions keep
/// coming: every Artifact's last revision is exported, no admission fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_leader_pod_during_500_artifact_updates_loses_none_and_fails_no_admission() {
    let env = installed().await;
    settled(&env).await;
    let ns = env.namespace("nodes-leader").await;
    let n = ns.name().to_string();
    let (artifacts, _) = support::dynamic_api(&env.client, ARTIFACT, "Artifact", Some(&n))
        .await
        .expect("the Artifact API");
    let digest = format!("sha256:{}", "0".repeat(64));
    let mut last = BTreeMap::new();
    for j in 0..ARTIFACTS {
        let name = format!("a{j}");
        env.apply(&json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": name, "namespace": n},
            "spec": {"url": "http://198.18.0.1:1/a.tar.gz", "revision": "start", "digest": digest},
        }))
        .await
        .expect("creating an Artifact");
        last.insert(name, "start".to_string());
    }
    all_exported(&env, &n, &last).await;
    let leader = support::wait_for("a leader", ROLLOUT, || leader_pod(&env)).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM);

    let admissions = Admissions::start(&env, &n, 2, Duration::from_millis(100)).await;
    let started = Instant::now();
    let mut deleted_at = None;
    for i in 0..UPDATES {
        let name = format!("a{}", i % ARTIFACTS);
        let revision = format!("r{i}");
        artifacts
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"revision": revision}})),
            )
            .await
            .unwrap_or_else(|e| panic!("Artifact update {i}: {e}"));
        last.insert(name, revision);
        if i == UPDATES / 2 {
            pods.delete(&leader, &DeleteParams::default())
                .await
                .expect("deleting the leader's Pod");
            deleted_at = Some(Instant::now());
        }
    }
    let updated_in = started.elapsed();
    let converged_in = all_exported(&env, &n, &last).await;
    let deleted_at = deleted_at.expect("the leader's Pod was deleted");
    let new_leader = support::wait_for("another Pod to lead", ROLLOUT, || async {
        leader_pod(&env).await.filter(|p| *p != leader)
    })
    .await;
    let led_after = deleted_at.elapsed();
    // Admissions through the hand-over, until the deleted Pod is gone and
    // its replacement is ready.
    settled(&env).await;
    let tally = admissions.stop().await;
    println!(
        "leader Pod {leader} deleted during {UPDATES} Artifact updates ({updated_in:?}): \
         {new_leader} leads within {led_after:?} of the delete; every last revision exported \
         {converged_in:?} after the last update; admissions: {} answered, {} failed",
        tally.answered,
        tally.failures.len()
    );
    assert!(
        tally.failures.is_empty(),
        "{} of {} admissions failed while the leader's Pod was replaced: {:?}",
        tally.failures.len(),
        tally.answered + tally.failures.len(),
        tally.first_failures()
    );
    assert!(tally.answered > 0, "no admission was made");
    ns.delete().await;
}

/// openflux is rolled to a new image (the same program under a new digest)
/// while admissions keep coming: readiness, the preStop pause and the
/// PodDisruptionBudget keep every request answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_to_a_new_image_under_admission_load_fails_no_request() {
    let env = installed().await;
    settled(&env).await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), SYSTEM);
    let before = deployments
        .get("openflux")
        .await
        .expect("openflux's Deployment");
    let old_image = container_image(&before);
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs();
    let new_image = tokio::task::block_in_place(|| {
        support::nodes::push_restamped_openflux(&env, epoch, &format!("rolled-{epoch}"))
    });
    assert_ne!(old_image, new_image, "the new image has a new digest");
    let ns = env.namespace("nodes-rolling").await;
    let n = ns.name().to_string();
    let admissions = Admissions::start(&env, &n, 2, Duration::from_millis(100)).await;
    support::wait_for("admissions answered before the roll", ROLLOUT, || async {
        (admissions.answered() >= 10).then_some(())
    })
    .await;
    let started = Instant::now();
    deployments
        .patch(
            "openflux",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "openflux", "image": new_image}
            ]}}}})),
        )
        .await
        .expect("setting openflux's new image");
    support::wait_for("the rollout to the new image", ROLLOUT, || async {
        let d = deployments.get("openflux").await.ok()?;
        let status = d.status.as_ref()?;
        let generation = d.metadata.generation?;
        let done = status.observed_generation == Some(generation)
            && status.updated_replicas == status.replicas
            && status.ready_replicas == status.replicas
            && status.replicas == d.spec.as_ref()?.replicas;
        let pods = openflux_pods(&env).await;
        let on_new = pods.len() == 2 && running_images(&env).await.iter().all(|i| *i == new_image);
        (done && on_new).then_some(())
    })
    .await;
    let rolled_in = started.elapsed();
    // The old Pods' shutdown (preStop, then SIGTERM) is when requests are
    // most at risk: keep the load on until they are gone.
    settled(&env).await;
    let tally = admissions.stop().await;
    println!(
        "rolling update {old_image} -> {new_image} in {rolled_in:?}: admissions {} answered, {} failed",
        tally.answered,
        tally.failures.len()
    );
    tally.assert_none_failed("the rolling update");
    assert!(tally.answered > 0, "no admission was made");
    ns.delete().await;
}

fn container_image(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().find(|c| c.name == "openflux"))
        .and_then(|c| c.image.clone())
        .expect("openflux's container image")
}

/// The images openflux's live Pods run.
async fn running_images(env: &Env) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM);
    let Ok(list) = pods
        .list(&ListParams::default().labels(OPENFLUX_PODS))
        .await
    else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let spec = p.spec.as_ref()?;
            spec.containers
                .iter()
                .find(|c| c.name == "openflux")?
                .image
                .clone()
        })
        .collect()
}

/// Sixteen clients per replica post maximum-size reviews (3 MiB each)
/// straight to openflux's Pods for 20 s: the real memory limit (256 MiB)
/// holds, no container is killed or restarted, and every request gets an
/// answer (200, or 429 while openflux sheds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_maximum_size_reviews_kills_no_container() {
    let env = installed().await;
    settled(&env).await;
    // Pods of an earlier rollout may still be terminating.
    let (before, cgroups) = support::wait_for(
        "two openflux Pods and their two containers' memory cgroups",
        ROLLOUT,
        || async {
            let pods = openflux_pods(&env).await;
            let cgroups = MemoryCgroup::of_containers("openflux");
            (pods.len() == 2 && cgroups.len() == 2).then_some((pods, cgroups))
        },
    )
    .await;
    let mut limits = Vec::new();
    for cgroup in &cgroups {
        // The peak from here on.
        cgroup.reset_peak();
        limits.push(cgroup.limit());
    }
    let tls = load::tls_trusting(&load::webhook_ca(&env));
    let addrs: Vec<std::net::SocketAddr> = before
        .iter()
        .map(|p| format!("{}:9443", p.ip).parse().expect("a Pod address"))
        .collect();
    let seconds = Duration::from_secs(20);
    let flood = load::flood(
        &addrs,
        tls,
        load::max_size_review(),
        16,
        Instant::now() + seconds,
    )
    .await;
    let peaks: Vec<u64> = cgroups.iter().map(MemoryCgroup::peak).collect();
    let after = openflux_pods(&env).await;
    let mib = |b: u64| b as f64 / 1048576.0;
    println!(
        "max-size flood, 16 clients per replica for {seconds:?}: {} answered, {} shed (429), {} without an answer; \
         container memory peaks {:?} MiB against limits {:?} MiB",
        flood.ok,
        flood.shed,
        flood.other.len(),
        peaks.iter().map(|b| format!("{:.0}", mib(*b))).collect::<Vec<_>>(),
        limits.iter().map(|b| format!("{:.0}", mib(*b))).collect::<Vec<_>>(),
    );
    for pod in &after {
        let name = &pod.name;
        assert!(
            !pod.oom_killed,
            "{name} was killed for memory during the flood"
        );
        assert_eq!(pod.restarts, 0, "{name} restarted during the flood");
    }
    let names = |pods: &[OpenfluxPod]| {
        let mut n: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
        n.sort();
        n
    };
    assert_eq!(
        names(&before),
        names(&after),
        "openflux's Pods changed during the flood"
    );
    assert!(
        flood.other.is_empty(),
        "{} requests got no answer or an unexpected one: {:?}",
        flood.other.len(),
        flood.other.iter().take(5).collect::<Vec<_>>()
    );
    assert!(flood.ok > 0, "no maximum-size review was answered");
    for (peak, limit) in peaks.iter().zip(&limits) {
        assert!(peak < limit, "a container reached its memory limit");
    }
}
