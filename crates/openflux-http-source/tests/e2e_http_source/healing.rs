//! Every reconcile checks the published artifact: in this controller's
//! storage, advertised at its current address. And the artifact server
//! serves the current artifacts and nothing else.

use super::*;

const KUSTOMIZATION: &str = "kustomize.toolkit.fluxcd.io/v1";
/// The Kustomization's interval (and so its retry interval).
const KS_INTERVAL: Duration = Duration::from_secs(10);

/// What openflux exports the source's Artifact as (an ExternalArtifact or a
/// shadow OCIRepository, found through the Artifact's status), once it names
/// `url`.
async fn exported_at(env: &Env, ns: &str, url: &str) -> DynamicObject {
    let (_, export) =
        support::exports::wait_export(env, ns, "app", |e| text(e, "/status/artifact/url") == url)
            .await;
    export
}

async fn kustomization(w: &World) -> Option<DynamicObject> {
    w.env
        .get(KUSTOMIZATION, "Kustomization", Some(w.ns()), "app")
        .await
        .ok()
        .flatten()
}

/// The Kustomization of the healing test.
fn kustomization_object(
    ns: &str,
    source_ref: &serde_json::Value,
    suspend: bool,
) -> serde_json::Value {
    json!({
        "apiVersion": KUSTOMIZATION, "kind": "Kustomization",
        "metadata": {"name": "app", "namespace": ns},
        "spec": {
            "interval": format!("{}s", KS_INTERVAL.as_secs()), "prune": true,
            "path": "./deploy", "targetNamespace": ns, "suspend": suspend,
            "sourceRef": source_ref,
        },
    })
}

/// The controller restarts with another `--storage-adv-addr` while the
/// remote is down, so nothing can be fetched: the first reconcile still
/// advertises the stored artifact at the new address (status, Artifact,
/// the exported ExternalArtifact), and the stock kustomize-controller
/// deploys from there (the old address is gone) within one interval.
///
/// The Kustomization is suspended while the controller moves: a download
/// kustomize-controller starts from the address that is going away is
/// retried for minutes (`--http-retry=9`, 5s to 30s apart), which would
/// measure kustomize-controller's retry policy rather than the healing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_storage_address_is_advertised_and_the_consumer_recovers() {
    let w = world("hs-heal").await;
    require_flux(&w.env).await;
    let ns = w.ns().to_string();
    let _openflux = OpenfluxRun::start(&w.env, &ns);
    let path = "heal.tgz";
    let manifest =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: heal\ndata:\n  v: one\n".to_string();
    w.server
        .content
        .put(path, tgz(&[("deploy/cm.yaml", &manifest)], 0, 0));
    w.apply_source("app", json!({"url": w.server.url(path), "interval": "5s"}))
        .await;
    let hs = w.wait_ready("app", None).await;
    let first = revision(&hs).expect("revision");
    let old_addr = w.controller.storage_addr;
    let old_url = text(&hs, "/status/artifact/url");
    assert!(old_url.starts_with(&format!("http://{old_addr}/")));
    let export = exported_at(&w.env, &ns, &old_url).await;
    let source_ref = support::exports::reference_to(&export);
    // The revision Flux sees (a shadow's may be the digest).
    let flux_revision = text(&export, "/status/artifact/revision");
    w.env
        .apply(&kustomization_object(&ns, &source_ref, false))
        .await
        .expect("applying the Kustomization");
    wait_for(
        "the Kustomization to apply the first revision",
        TIMEOUT,
        || async {
            let ks = kustomization(&w).await?;
            (text(&ks, "/status/lastAppliedRevision") == flux_revision).then_some(())
        },
    )
    .await;

    // The remote goes down and the controller moves to another address,
    // with the same storage.
    w.env
        .apply(&kustomization_object(&ns, &source_ref, true))
        .await
        .expect("suspending the Kustomization");
    w.server.content.set_down(path, true);
    let World {
        env,
        ns: test_ns,
        server,
        controller,
        kubeconfig,
        _dir,
    } = w;
    let storage = controller.stop();
    assert!(
        http_get(old_addr, "/").await.is_none(),
        "the old address is gone"
    );
    let launch = Launch {
        storage: Some(storage),
        ..Launch::new(&ns, &[])
    };
    let controller = Controller::launch(&kubeconfig, &ns, launch).await;
    let w = World {
        env,
        ns: test_ns,
        server,
        controller,
        kubeconfig,
        _dir,
    };

    // The first reconcile fails to fetch, and advertises the artifact at
    // the new address all the same.
    let new_prefix = format!("http://{}/", w.controller.storage_addr);
    let (hs, _) = w.wait_not_ready("app", "FetchFailed").await;
    let new_url = text(&hs, "/status/artifact/url");
    assert!(new_url.starts_with(&new_prefix), "{new_url}");
    assert_eq!(
        revision(&hs).as_deref(),
        Some(first.as_str()),
        "the same artifact"
    );
    let bytes = w.controller.download(&new_url).await;
    assert_eq!(sha256(&bytes), first);
    let artifact = w.artifact("app").await.expect("the Artifact");
    assert_eq!(text(&artifact, "/spec/url"), new_url);
    exported_at(&w.env, &ns, &new_url).await;

    // The consumer deploys from the new address within one interval.
    w.env
        .apply(&kustomization_object(&ns, &source_ref, false))
        .await
        .expect("resuming the Kustomization");
    let resumed = kustomization(&w).await.expect("the Kustomization");
    let generation = resumed.metadata.generation;
    let resumed_at = std::time::Instant::now();
    let bound = KS_INTERVAL + Duration::from_secs(20);
    wait_for(
        "the Kustomization to deploy from the new address",
        bound,
        || async {
            let ks = kustomization(&w).await?;
            let (status, _, _) = ready_condition(&ks)?;
            let observed = field(&ks, "/status/observedGeneration").and_then(|g| g.as_i64());
            (status == "True"
                && observed == generation
                && text(&ks, "/status/lastAttemptedRevision") == flux_revision)
                .then_some(())
        },
    )
    .await;
    assert!(resumed_at.elapsed() <= bound);
}

/// The artifact server serves the current artifact and the one retention
/// keeps, nothing else: no listing, no other file in storage, no other
/// path; a suspended source's artifact stays served across a restart; a
/// deleted source's artifacts go at once; a file missing from storage is
/// fetched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_artifact_server_serves_only_current_artifacts() {
    let w = world("hs-serve").await;
    let ns = w.ns().to_string();
    let path = "serve.tgz";
    w.server
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_ONE)], 0, 0));
    w.apply_source("app", json!({"url": w.server.url(path), "interval": "1s"}))
        .await;
    let first = w.wait_ready("app", None).await;
    w.server
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_TWO)], 0, 0));
    let second = w.wait_ready("app", revision(&first).as_deref()).await;
    let c = &w.controller;
    let current = format!("/{}", text(&second, "/status/artifact/path"));
    let previous = format!("/{}", text(&first, "/status/artifact/path"));
    let (status, body) = c.artifact_server(&current).await;
    assert_eq!((status, sha256(&body)), (200, revision(&second).unwrap()));
    assert_eq!(
        c.artifact_server(&previous).await.0,
        200,
        "kept by retention"
    );

    // Files in storage this controller did not publish.
    let dir = c.storage.path().join(&ns).join("app");
    let planted = format!("{}.tar.gz", "f".repeat(64));
    std::fs::write(dir.join(&planted), b"planted").expect("planting a file");
    std::fs::write(dir.join(".tmp-planted"), b"planted").expect("planting a file");
    let hex = text(&second, "/status/artifact/digest")
        .trim_start_matches("sha256:")
        .to_string();
    for path in [
        "/".to_string(),
        format!("/{ns}"),
        format!("/{ns}/"),
        format!("/{ns}/app"),
        format!("/{ns}/app/"),
        format!("/{ns}/app/{planted}"),
        format!("/{ns}/app/.tmp-planted"),
        format!("/{ns}/app/{}.tar.gz", "0".repeat(64)),
        format!("/{ns}/other/{hex}.tar.gz"),
        format!("/{ns}/app/../app/{hex}.tar.gz"),
        format!("/{ns}/app/{hex}.tar"),
        format!("/{ns}/app/{hex}.tar.gz/"),
    ] {
        assert_eq!(c.artifact_server(&path).await.0, 404, "{path}");
    }

    // The artifact file disappears: the next reconcile stores it again.
    std::fs::remove_file(c.storage.path().join(current.trim_start_matches('/')))
        .expect("removing the artifact file");
    wait_for(
        "the artifact to be stored and served again",
        TIMEOUT,
        || async { (c.artifact_server(&current).await.0 == 200).then_some(()) },
    )
    .await;

    // Suspended, the last artifact stays published, also after a restart.
    w.patch_spec("app", json!({"suspend": true})).await;
    let World {
        env,
        ns: test_ns,
        server,
        controller,
        kubeconfig,
        _dir,
    } = w;
    let launch = Launch {
        storage: Some(controller.stop()),
        ..Launch::new(&ns, &[])
    };
    let controller = Controller::launch(&kubeconfig, &ns, launch).await;
    let w = World {
        env,
        ns: test_ns,
        server,
        controller,
        kubeconfig,
        _dir,
    };
    let c = &w.controller;
    wait_for(
        "the suspended source's artifact to be served",
        TIMEOUT,
        || async { (c.artifact_server(&current).await.0 == 200).then_some(()) },
    )
    .await;

    // The source is deleted: its artifacts are not served any more.
    let ar = kube::core::ApiResource::from_gvk(&support::gvk(HTTP_SOURCE, "HttpSource"));
    Api::<DynamicObject>::namespaced_with(w.env.client.clone(), &ns, &ar)
        .delete("app", &DeleteParams::default())
        .await
        .expect("deleting the HttpSource");
    wait_for(
        "the deleted source's artifact to be gone",
        TIMEOUT,
        || async { (c.artifact_server(&current).await.0 == 404).then_some(()) },
    )
    .await;
    assert_eq!(c.artifact_server(&previous).await.0, 404);
}
