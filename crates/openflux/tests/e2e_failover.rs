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
