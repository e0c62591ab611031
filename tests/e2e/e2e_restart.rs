//! End to end: etcd and kube-apiserver killed with SIGKILL and started
//! again while Artifacts are being updated; openflux recovers without a
//! restart of its own and loses no update. `make chaos` runs the same with
//! 1,000 updates. Alone in its module, which runs beside no other module
//! (`openflux_testkit::turns`): their tests would see the API server
//! vanish.

use crate::{failover, restart};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_recovers_from_an_api_server_and_etcd_crash() {
    let outcome = restart::run(200).await.expect("the restart scenario");
    eprintln!("{outcome:?}");
    assert!(outcome.same_processes, "openflux restarted: {outcome:?}");
    assert_eq!(outcome.lost, 0, "{outcome:?}");
    assert!(
        outcome.recovered_after <= restart::RECOVERY_BOUND,
        "{outcome:?}"
    );
    assert!(
        outcome.converged_after <= failover::CONVERGENCE_BOUND,
        "{outcome:?}"
    );
}
