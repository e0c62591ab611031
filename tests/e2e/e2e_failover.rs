//! End to end: the leader killed with SIGKILL among two replicas while
//! Artifacts are being updated; nothing is lost and the standby converges
//! within the bound. `make chaos` runs the same with 1,000 updates.

use crate::failover;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use openflux_testkit as support;
use serde_json::json;
use support::openflux::http_get;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_loses_no_update() {
    let outcome = failover::run(200).await.expect("the failover scenario");
    eprintln!("{outcome:?}");
    assert_eq!(outcome.lost, 0, "{outcome:?}");
    assert!(
        outcome.converged_after <= failover::CONVERGENCE_BOUND,
        "{outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_loses_the_lease_keeps_serving_and_leads_again() {
    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("rejoin").await;
    let n = ns.name().to_string();
    let of = failover::start(&env, &n).await;
    support::wait_for("the replica to lead", support::TIMEOUT, || async {
        failover::leads(&of).await.then_some(())
    })
    .await;
    // Someone else writes the Lease: the replica loses it.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &n);
    let mut lease = leases
        .get("openflux-leader-election")
        .await
        .expect("the Lease");
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some("intruder".into());
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    leases
        .replace("openflux-leader-election", &PostParams::default(), &lease)
        .await
        .expect("taking the Lease over");
    support::wait_for(
        "the replica to step down",
        Duration::from_secs(30),
        || async { (!failover::leads(&of).await).then_some(()) },
    )
    .await;
    // It still runs and is ready: the webhook and its index keep serving.
    assert_eq!(
        http_get(of.health_addr, "/readyz").await.map(|r| r.0),
        Some(200)
    );
    assert!(of.log_tail(200).contains("rejoining the leader election"));
    // The intruder never renews: after a lease duration the replica leads again.
    support::wait_for(
        "the replica to lead again",
        Duration::from_secs(30),
        || async { failover::leads(&of).await.then_some(()) },
    )
    .await;
    drop(of);
    ns.delete().await;
}

/// The leader's watch of a consumer kind breaks (its CRD deleted): the
/// replica stays ready, since the webhook does not need that watch, and
/// the broken watch is reported by metric, log and `/readyz` body; once the
/// CRD is back, the report clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_consumer_watch_leaves_the_leader_ready() {
    const STACKS: &str = "stacks.pulumi.com";
    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    let path = support::workspace_root().join("e2e/crds/pulumi-stack.yaml");
    let stack_crd = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    env.apply_yaml(&stack_crd).await.expect("the Stack CRD");
    support::wait_established(&env, &["artifacts.openflux.dev", STACKS]).await;
    let ns = env.namespace("readiness").await;
    let n = ns.name().to_string();
    let of = failover::start(&env, &n).await;
    support::wait_for("the replica to lead", support::TIMEOUT, || async {
        failover::leads(&of).await.then_some(())
    })
    .await;
    // The survey saw Stacks: the leader watches them as consumers.
    support::wait_for("Stacks to be a consumer", support::TIMEOUT, || async {
        of.log_tail(400).contains("Stack: export to").then_some(())
    })
    .await;
    let crds = kube::Api::<kube::core::DynamicObject>::all_with(
        env.client.clone(),
        &kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
            ),
            "customresourcedefinitions",
        ),
    );
    crds.delete(STACKS, &Default::default())
        .await
        .expect("deleting the Stack CRD");
    let broken = r#"openflux_broken_watches{scope="controllers"} "#;
    let unready = std::sync::Mutex::new(Vec::new());
    // A watch counts as broken after 60 s of errors.
    support::wait_for(
        "the Stack watch to be reported broken",
        Duration::from_secs(150),
        || async {
            match http_get(of.health_addr, "/readyz").await {
                Some((200, _)) => {}
                other => unready.lock().unwrap().push(format!("{other:?}")),
            }
            (of.metric(broken).await? >= 1.0).then_some(())
        },
    )
    .await;
    let unready = unready.into_inner().unwrap();
    assert!(unready.is_empty(), "the replica was not ready: {unready:?}");
    let (status, body) = http_get(of.health_addr, "/readyz").await.expect("/readyz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Stack consumers failing for"), "{body}");
    assert_eq!(
        of.metric(r#"openflux_broken_watches{scope="serving"} "#)
            .await,
        Some(0.0)
    );
    // Logged on the watch's next error past the 60 s.
    support::wait_for(
        "the broken watch's log line",
        Duration::from_secs(30),
        || async {
            of.log_tail(400)
                .contains("watch broken; the controllers' view is stale")
                .then_some(())
        },
    )
    .await;
    // Back: the watch recovers and the report clears.
    env.apply_yaml(&stack_crd)
        .await
        .expect("the Stack CRD again");
    support::wait_for(
        "the Stack watch to recover",
        Duration::from_secs(60),
        || async { (of.metric(broken).await == Some(0.0)).then_some(()) },
    )
    .await;
    assert!(of.log_tail(400).contains("watch recovered"));
    drop(of);
    ns.delete().await;
}

/// Leadership is a fence: a former leader writes nothing after the new
/// leader's first write. The first replica talks to the API server through
/// a proxy that holds the answer to each of its writes for 1.5 s, so its
/// export reconciles stall mid-chain (each write applied, its sender still
/// waiting), while Artifacts keep changing. Then the proxy stops passing
/// its Lease traffic: it can no longer renew, the second replica takes the
/// Lease over and exports. Every write the first replica made must have
/// been answered by the API server (so applied) before the second replica
/// sent its first write, on the proxies' one clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_leader_writes_nothing_after_the_new_leaders_first_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    use kube::api::{Patch, PatchParams};
    use support::proxy::ApiProxy;

    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("fence").await;
    let n = ns.name().to_string();
    let identity = support::identity::openflux_kubeconfig(&env).expect("a kubeconfig for openflux");
    let proxy_a = ApiProxy::start(&identity).await;
    let a = failover::start_as(&env, &n, Some(proxy_a.kubeconfig())).await;
    support::wait_for("the first replica to lead", support::TIMEOUT, || async {
        failover::leads(&a).await.then_some(())
    })
    .await;
    let proxy_b = ApiProxy::start(&identity).await;
    let b = failover::start_as(&env, &n, Some(proxy_b.kubeconfig())).await;
    failover::create_artifacts(&env, &n)
        .await
        .expect("the Artifacts");
    let kinds = failover::export_apis(&env, &n).await;
    support::wait_for(
        "the first replica to export every Artifact",
        support::TIMEOUT,
        || async {
            let seen = failover::exported(&kinds).await.ok()?;
            (seen.len() == failover::ARTIFACTS && seen.values().all(|r| r == "start")).then_some(())
        },
    )
    .await;
    assert!(
        proxy_b.writes().is_empty(),
        "the standby wrote while the first replica led: {:?}",
        proxy_b.writes()
    );

    // Slow answers, and Artifacts that keep changing: the first replica's
    // export reconciles are always mid-chain.
    proxy_a.delay_write_answers(Duration::from_millis(1500));
    let slowed = Instant::now();
    let (artifacts, _) =
        support::dynamic_api(&env.client, failover::ARTIFACT, "Artifact", Some(&n))
            .await
            .expect("the Artifact API");
    let updating = Arc::new(AtomicBool::new(true));
    let updates = tokio::spawn({
        let (artifacts, updating) = (artifacts.clone(), updating.clone());
        async move {
            let mut pace = tokio::time::interval(Duration::from_millis(100));
            let mut i = 0;
            while updating.load(Ordering::SeqCst) {
                pace.tick().await;
                let patch = json!({"spec": {"revision": format!("r{i}")}});
                let name = format!("a{}", i % failover::ARTIFACTS);
                let _ = artifacts
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                i += 1;
            }
        }
    });
    support::wait_for(
        "the first replica's writes to be slowed",
        support::TIMEOUT,
        || async {
            let slowed = proxy_a.writes().iter().filter(|w| w.sent > slowed).count();
            (slowed >= 3).then_some(())
        },
    )
    .await;

    proxy_a.cut_leases();
    let cut = Instant::now();
    support::wait_for(
        "the first replica to step down",
        Duration::from_secs(30),
        || async { (!failover::leads(&a).await).then_some(()) },
    )
    .await;
    let stepped_down = cut.elapsed();
    support::wait_for(
        "the second replica to lead",
        Duration::from_secs(30),
        || async { failover::leads(&b).await.then_some(()) },
    )
    .await;
    support::wait_for(
        "the second replica's first write",
        Duration::from_secs(30),
        || async {
            proxy_b
                .writes()
                .iter()
                .any(|w| w.answered.is_some())
                .then_some(())
        },
    )
    .await;
    // The second replica exports the last revisions: it took over.
    updating.store(false, Ordering::SeqCst);
    updates.await.expect("the updates");
    for j in 0..failover::ARTIFACTS {
        let patch = json!({"spec": {"revision": "last"}});
        artifacts
            .patch(
                &format!("a{j}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect("the last revision");
    }
    support::wait_for(
        "the second replica to export the last revisions",
        support::TIMEOUT,
        || async {
            let seen = failover::exported(&kinds).await.ok()?;
            seen.values().all(|r| r == "last").then_some(())
        },
    )
    .await;

    let of_a = proxy_a.writes();
    let of_b = proxy_b.writes();
    // The second replica's first write was sent no earlier than this.
    let first_b = of_b
        .iter()
        .map(|w| w.sent)
        .min()
        .expect("a write of the second replica");
    // A write of the first replica certainly landed before it when the
    // API server answered it before that write was sent; one not answered
    // counts as late.
    let late: Vec<_> = of_a
        .iter()
        .filter(|w| w.answered.is_none_or(|answered| answered >= first_b))
        .collect();
    let after_cut = of_a.iter().filter(|w| w.sent > cut).count();
    let last_a = of_a
        .iter()
        .filter_map(|w| w.answered)
        .max()
        .expect("writes of the first replica");
    eprintln!(
        "first replica: {} writes, {after_cut} sent after its renewals were cut, the last answered {:?} after the cut; \
         stepped down {stepped_down:?} after the cut; second replica's first write sent {:?} after the cut, \
         {:?} after the first replica's last write was answered; {} writes of the first replica after it",
        of_a.len(),
        last_a.saturating_duration_since(cut),
        first_b.saturating_duration_since(cut),
        first_b.saturating_duration_since(last_a),
        late.len(),
    );
    // The race was run: the first replica was still writing, mid-chain,
    // once it could no longer renew.
    assert!(
        after_cut > 0,
        "the first replica wrote nothing after its renewals were cut"
    );
    let late: Vec<String> = late
        .iter()
        .map(|w| {
            format!(
                "{} {} ({:?}): sent {:?} after the cut, answered {}",
                w.method,
                w.path,
                w.status,
                w.sent.saturating_duration_since(cut),
                w.answered.map_or("never".to_string(), |a| format!(
                    "{:?} after the cut",
                    a.saturating_duration_since(cut)
                )),
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "the former leader wrote after the new leader's first write: {late:#?}"
    );
    drop((a, b));
    ns.delete().await;
}
