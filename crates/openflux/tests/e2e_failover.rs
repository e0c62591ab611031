//! End to end: the leader killed with SIGKILL among two replicas while
//! Artifacts are being updated; nothing is lost and the standby converges
//! within the bound. `make chaos` runs the same with 1,000 updates.

#[path = "chaos/failover.rs"]
mod failover;

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
