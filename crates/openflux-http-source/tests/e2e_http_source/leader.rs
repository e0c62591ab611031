//! Leader election (`--enable-leader-election`, off by default): of two
//! controllers, only the one holding the Lease fetches and writes; when it
//! stops, the other takes over.

use super::*;

use k8s_openapi::api::coordination::v1::Lease;

const LEASE: &str = "openflux-http-source-leader-election";

/// Leader election with short timings, so a takeover is quick.
fn elected(ns: &str, instance: &str, wait_ready: bool) -> Launch {
    let flags = [
        "--enable-leader-election",
        "--leader-election-lease-duration=6s",
        "--leader-election-renew-deadline=4s",
        "--leader-election-retry-period=1s",
    ]
    .map(String::from);
    Launch {
        instance: format!("{ns}-{instance}"),
        wait_ready,
        ..Launch::new(ns, &flags)
    }
}

async fn holder(env: &Env, ns: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), ns);
    leases.get_opt(LEASE).await.ok()??.spec?.holder_identity
}

async fn fetches(c: &Controller) -> u64 {
    c.fetches("downloaded").await + c.fetches("not_modified").await + c.fetches("failed").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles() {
    let w = world_launched("hs-leader", |ns| elected(ns, "a", true)).await;
    let ns = w.ns().to_string();
    let a_prefix = format!("{ns}-a_");
    wait_for("controller a to hold the Lease", TIMEOUT, || async {
        holder(&w.env, &ns)
            .await
            .filter(|h| h.starts_with(&a_prefix))
    })
    .await;
    let b = Controller::launch(&w.kubeconfig, &ns, elected(&ns, "b", false)).await;
    wait_for("controller b to wait for the Lease", TIMEOUT, || async {
        b.log_text().contains("waiting for the lease").then_some(())
    })
    .await;

    let path = "leader.tgz";
    w.server
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_ONE)], 0, 0));
    w.apply_source("app", json!({"url": w.server.url(path), "interval": "1s"}))
        .await;
    let first = revision(&w.wait_ready("app", None).await).expect("revision");
    let requests = w.server.content.stats(path).requests;
    wait_for("more fetches", TIMEOUT, || async {
        (w.server.content.stats(path).requests >= requests + 3).then_some(())
    })
    .await;
    assert!(fetches(&w.controller).await >= 3, "the leader fetches");
    assert_eq!(fetches(&b).await, 0, "the standby does not fetch");
    assert!(!b.log_text().contains("stored new artifact"));
    for event in w.events("app", "NewArtifact").await {
        assert_eq!(
            event.reporting_instance.as_deref(),
            Some(format!("{ns}-a").as_str()),
            "written by the leader"
        );
    }
    assert!(holder(&w.env, &ns)
        .await
        .is_some_and(|h| h.starts_with(&a_prefix)));

    // The leader stops (releasing the Lease): b takes over and writes.
    let World {
        env,
        ns: test_ns,
        server,
        controller: a,
        kubeconfig,
        _dir,
    } = w;
    drop(a.stop());
    let b_prefix = format!("{ns}-b_");
    wait_for("controller b to hold the Lease", TIMEOUT, || async {
        holder(&env, &ns).await.filter(|h| h.starts_with(&b_prefix))
    })
    .await;
    let w = World {
        env,
        ns: test_ns,
        server,
        controller: b,
        kubeconfig,
        _dir,
    };
    w.server
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_TWO)], 0, 0));
    let hs = w.wait_ready("app", Some(&first)).await;
    let second = revision(&hs).expect("revision");
    assert!(fetches(&w.controller).await >= 1, "the new leader fetches");
    assert!(text(&hs, "/status/artifact/url")
        .starts_with(&format!("http://{}/", w.controller.storage_addr)));
    let bytes = w
        .controller
        .download(&text(&hs, "/status/artifact/url"))
        .await;
    assert_eq!(sha256(&bytes), second);
}
