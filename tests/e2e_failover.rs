//! End to end: the leader killed with SIGKILL among two replicas while
//! Artifacts are being updated; nothing is lost and the standby converges
//! within the bound. `make chaos` runs the same with 1,000 updates.

#[path = "chaos/failover.rs"]
mod failover;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use openflux_testkit as support;
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
