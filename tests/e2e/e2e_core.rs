//! End to end: the mirror and export controllers against a real API server
//! and the stock Flux controllers. Each test runs its own `openflux run`,
//! scoped to the test's namespace, so tests stay independent.

use openflux_testkit as support;

use std::time::Duration;

use kube::api::{Api, DynamicObject};
use kube::ResourceExt;
use serde_json::json;
use support::openflux::{publish, Openflux};
use support::{cluster, field, ready_condition, unique_name, wait_for, Cell, Env, TIMEOUT};

const ARTIFACT: &str = "openflux.dev/v1alpha1";
const SOURCE: &str = "source.toolkit.fluxcd.io/v1";
const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const TEST_SOURCE: &str = "e2e.openflux.dev/v1";

async fn install_crds(env: &Env) {
    support::install_artifact_crd(env).await;
    support::install_test_source_crd(env, "e2e.openflux.dev").await;
    support::wait_established(
        env,
        &["artifacts.openflux.dev", "testsources.e2e.openflux.dev"],
    )
    .await;
}

async fn start_openflux(env: &Env, ns: &str) -> Openflux {
    Openflux::start(
        env,
        ns,
        &[
            "--watch-all-namespaces=false",
            &format!("--namespace={ns}"),
            // As deployed: replicas elect a leader in the runtime namespace.
            "--enable-leader-election",
            // Each process its own webhook port: tests run side by side.
            &format!("--webhook-addr={}", support::openflux::free_addr()),
        ],
    )
    .await
}

async fn delete(env: &Env, api_version: &str, kind: &str, ns: &str, name: &str) {
    env.delete_object(api_version, kind, ns, name).await;
}

/// Waits until the Artifact mirrored from GitRepository `app` in `ns` is at
/// commit `sha`, checks its digest is the source's, and returns both.
async fn mirrored_at(env: &Env, ns: &str, sha: &str) -> (DynamicObject, DynamicObject) {
    let expect = json!(format!("main@sha1:{sha}"));
    let what = format!("the GitRepository's Artifact at {sha}");
    let artifact = wait_for(&what, TIMEOUT, || async {
        let a = env
            .find(ARTIFACT, "Artifact", ns, "gitrepository-app")
            .await?;
        (field(&a, "/spec/revision")? == &expect).then_some(a)
    })
    .await;
    let source = env
        .find(SOURCE, "GitRepository", ns, "app")
        .await
        .expect("GitRepository");
    assert_eq!(
        field(&artifact, "/spec/digest"),
        field(&source, "/status/artifact/digest")
    );
    (artifact, source)
}

/// The mirror's GitRepository writes, once at least `least` are counted: a
/// write is counted when it returns, just after the watch can show it.
async fn git_writes(of: &Openflux, least: f64) -> f64 {
    wait_for("the mirror's writes counted", TIMEOUT, || async {
        of.metric("openflux_mirrored_writes_total{kind=\"GitRepository\"}")
            .await
            .filter(|writes| *writes >= least)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_repository_is_mirrored_updated_and_collected() {
    git_repository_is_mirrored_updated_and_collected_on(Cell::Main).await;
}

/// [`git_repository_is_mirrored_updated_and_collected`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn git_repository_is_mirrored_updated_and_collected_on(cell: Cell) {
    let env = support::cell(cell).await;
    let fx = env.fixtures();
    install_crds(&env).await;
    let ns = env.namespace("mirror-git").await;
    let n = ns.name().to_string();
    let (repo, first) = fx
        .create_repo(
            &unique_name("mirror"),
            &[("deploy/cm.yaml", &support::configmap_yaml("one"))],
        )
        .expect("creating a git repository");
    let of = start_openflux(&env, &n).await;

    env.apply(&json!({
        "apiVersion": SOURCE, "kind": "GitRepository",
        "metadata": {"name": "app", "namespace": n},
        "spec": {"url": repo.url, "interval": "10m", "ref": {"branch": "main"}}
    }))
    .await
    .expect("creating the GitRepository");

    let (artifact, source) = mirrored_at(&env, &n, &first).await;
    assert_eq!(
        field(&artifact, "/spec/url"),
        field(&source, "/status/artifact/url")
    );
    let owner = &artifact.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("GitRepository", Some(true))
    );
    assert_eq!(owner.uid, source.uid().unwrap());
    // One write made it: the spec, and no status (a mirrored Artifact is a
    // copy of its source's artifact, the source's Ready says the rest).
    assert_eq!(
        git_writes(&of, 1.0).await,
        1.0,
        "a new mirrored Artifact costs one write"
    );
    assert!(
        artifact.data.get("status").is_none(),
        "a mirrored Artifact has no status: {:?}",
        artifact.data.get("status")
    );

    // Someone else edits the mirrored Artifact: the mirror puts it back,
    // with one write. (Its own write's echo, seen before, woke nothing.)
    let edit = json!({"spec": {"revision": "main@sha1:edited"}});
    support::merge_patch(
        &env.client,
        ARTIFACT,
        "Artifact",
        &n,
        "gitrepository-app",
        &edit,
    )
    .await
    .expect("editing the mirrored Artifact");
    mirrored_at(&env, &n, &first).await;
    assert_eq!(
        git_writes(&of, 2.0).await,
        2.0,
        "an edited mirrored Artifact is put back with one write"
    );

    // A new commit: the Artifact follows, with exactly one more write.
    let second = repo
        .commit(
            &[("deploy/cm.yaml", &support::configmap_yaml("two"))],
            &[],
            "Change",
        )
        .expect("pushing a commit");
    support::request_reconcile(&env.client, SOURCE, "GitRepository", &n, "app")
        .await
        .expect("requesting a reconcile");
    let (updated, _) = mirrored_at(&env, &n, &second).await;
    assert!(
        updated.data.get("status").is_none(),
        "a mirrored Artifact never gets a status: {:?}",
        updated.data.get("status")
    );
    assert_eq!(
        git_writes(&of, 3.0).await,
        3.0,
        "one write to create, one to put it back, one for the new revision"
    );

    // Deleting the source removes its Artifact through garbage collection.
    delete(&env, SOURCE, "GitRepository", &n, "app").await;
    wait_for("the Artifact to be garbage collected", TIMEOUT, || async {
        env.find(ARTIFACT, "Artifact", &n, "gitrepository-app")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    drop(of);
    ns.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_repository_and_chart_are_mirrored() {
    let env = cluster().await;
    let helm_url = env.fixtures().helm_repo_url.clone();
    install_crds(&env).await;
    let ns = env.namespace("mirror-helm").await;
    let n = ns.name().to_string();
    let _of = start_openflux(&env, &n).await;
    env.apply(&json!({
        "apiVersion": SOURCE, "kind": "HelmRepository",
        "metadata": {"name": "charts", "namespace": n},
        "spec": {"url": helm_url, "interval": "10m"}
    }))
    .await
    .expect("creating the HelmRepository");
    env.apply(&json!({
        "apiVersion": SOURCE, "kind": "HelmChart",
        "metadata": {"name": "hello", "namespace": n},
        "spec": {"chart": "hello", "version": "0.1.0", "interval": "10m",
                 "sourceRef": {"kind": "HelmRepository", "name": "charts"}}
    }))
    .await
    .expect("creating the HelmChart");
    for (kind, name, artifact) in [
        ("HelmRepository", "charts", "helmrepository-charts"),
        ("HelmChart", "hello", "helmchart-hello"),
    ] {
        let (a, s) = wait_for(&format!("the {kind}'s Artifact"), TIMEOUT, || async {
            let s = env.find(SOURCE, kind, &n, name).await?;
            let a = env.find(ARTIFACT, "Artifact", &n, artifact).await?;
            let digest = field(&s, "/status/artifact/digest")?;
            (field(&a, "/spec/digest") == Some(digest)).then_some((a, s))
        })
        .await;
        assert_eq!(
            field(&a, "/spec/revision"),
            field(&s, "/status/artifact/revision")
        );
        assert_eq!(
            a.labels()
                .get("openflux.dev/source-kind")
                .map(String::as_str),
            Some(kind.to_ascii_lowercase().as_str())
        );
    }
    ns.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_source_is_exported_and_deployed_by_stock_kustomize_controller() {
    custom_source_is_exported_and_deployed_by_stock_kustomize_controller_on(Cell::Main).await;
}

/// [`custom_source_is_exported_and_deployed_by_stock_kustomize_controller`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn custom_source_is_exported_and_deployed_by_stock_kustomize_controller_on(
    cell: Cell,
) {
    let env = support::cell(cell).await;
    let fx = env.fixtures();
    install_crds(&env).await;
    let ns = env.namespace("export").await;
    let n = ns.name().to_string();
    let _of = start_openflux(&env, &n).await;

    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": "web", "namespace": n},
            "spec": {"anything": "goes"}
        }))
        .await
        .expect("creating the custom source");
    let owner = json!([{
        "apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web",
        "uid": source.uid().expect("uid"), "controller": true
    }]);
    let publish_web = |revision: &str| {
        let spec = publish(
            fx,
            &n,
            "web",
            revision,
            &[("configmap.yaml", &support::configmap_yaml(revision))],
        );
        json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": "web", "namespace": n, "ownerReferences": owner},
            "spec": spec,
        })
    };
    let artifact = publish_web("one");
    let spec = &artifact["spec"];
    env.apply(&artifact).await.expect("writing the Artifact");

    let (artifact, exported) = support::exports::wait_export(&env, &n, "web", |e| {
        field(e, "/status/artifact/digest") == Some(&spec["digest"])
    })
    .await;
    assert_eq!(field(&exported, "/status/artifact/url"), Some(&spec["url"]));
    assert_eq!(
        support::exports::source_revision(&exported).as_deref(),
        spec["revision"].as_str()
    );
    let export_ref = support::exports::reference_to(&exported);
    let export_name = export_ref["name"].as_str().unwrap_or_default().to_string();
    // The export is named after the source's group, kind and name.
    assert_eq!(
        export_name,
        openflux::names::identity::source_export_name(
            TEST_SOURCE.split('/').next().unwrap(),
            "TestSource",
            "web"
        )
    );
    if support::exports::is_shadow(&exported) {
        assert_eq!(field(&exported, "/spec/suspend"), Some(&json!(true)));
        assert_eq!(
            field(&exported, "/status/observedGeneration").and_then(|g| g.as_i64()),
            exported.metadata.generation
        );
    } else {
        assert_eq!(
            field(&exported, "/spec/sourceRef"),
            Some(
                &json!({"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web", "namespace": n})
            )
        );
    }
    assert_eq!(
        ready_condition(&exported).map(|c| c.0),
        Some("True".to_string())
    );
    assert_eq!(
        exported
            .labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("openflux")
    );
    assert_eq!(
        field(&artifact, "/status/source"),
        Some(&json!("TestSource/web"))
    );

    // The stock kustomize-controller deploys it.
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "web", "namespace": n},
        "spec": {
            "interval": "10m", "prune": true, "path": "./", "targetNamespace": n,
            "sourceRef": export_ref,
        }
    }))
    .await
    .expect("creating the Kustomization");
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.client.clone(), &n);
    let wait_value = |value: &'static str| {
        let cms = cms.clone();
        async move {
            wait_for(&format!("the ConfigMap to hold {value:?}"), TIMEOUT, || {
                let cms = cms.clone();
                async move {
                    let cm = cms.get_opt("app-config").await.ok().flatten()?;
                    (cm.data?.get("value")? == value).then_some(())
                }
            })
            .await
        }
    };
    wait_value("one").await;

    // A new revision of the Artifact rolls out.
    let artifact2 = publish_web("two");
    let spec2 = &artifact2["spec"];
    env.apply(&artifact2).await.expect("updating the Artifact");
    wait_value("two").await;
    let (_, exported2) = support::exports::wait_export(&env, &n, "web", |e| {
        field(e, "/status/artifact/digest") == Some(&spec2["digest"])
    })
    .await;
    // kustomize-controller writes its status after it applied the objects:
    // wait for it to name the exported revision rather than read it once.
    let revision = field(&exported2, "/status/artifact/revision").cloned();
    assert!(revision.is_some(), "the export carries a revision");
    wait_for(
        "the Kustomization to have applied the new revision",
        TIMEOUT,
        || async {
            let ks = env.find(KUSTOMIZE, "Kustomization", &n, "web").await?;
            (field(&ks, "/status/lastAppliedRevision").cloned() == revision).then_some(())
        },
    )
    .await;

    // A producer that keeps its revision over new content still reaches the
    // consumer: the export's revision follows the digest. With the
    // Kustomization's 10m interval only a new revision wakes it in time. A
    // chart-like version is what a shadow used to keep as it was.
    let artifact3 = publish_web("3.0.0");
    env.apply(&artifact3).await.expect("updating the Artifact");
    wait_value("3.0.0").await;
    let mut spec4 = publish(
        fx,
        &n,
        "web",
        "3.0.0",
        &[("configmap.yaml", &support::configmap_yaml("3.0.0 rebuilt"))],
    );
    spec4["revision"] = artifact3["spec"]["revision"].clone();
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": "web", "namespace": n, "ownerReferences": owner},
        "spec": spec4,
    }))
    .await
    .expect("new content under the same revision");
    wait_value("3.0.0 rebuilt").await;

    // Deleting the custom source removes its Artifact and the export.
    delete(&env, KUSTOMIZE, "Kustomization", &n, "web").await;
    delete(&env, TEST_SOURCE, "TestSource", &n, "web").await;
    wait_for(
        "the Artifact and its export to be collected",
        TIMEOUT,
        || async {
            let a = env.find(ARTIFACT, "Artifact", &n, "web").await;
            let export = env
                .find(
                    export_ref["apiVersion"].as_str().unwrap_or_default(),
                    export_ref["kind"].as_str().unwrap_or_default(),
                    &n,
                    &export_name,
                )
                .await;
            (a.is_none() && export.is_none()).then_some(())
        },
    )
    .await;
    ns.delete().await;
}

/// The `gotk_reconcile_duration_seconds` series of an Artifact go with it,
/// at once (well within the 30 s sweep): one that was exported (its export
/// is collected with it) and one that never was (nothing else changes when
/// it goes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_of_a_deleted_artifact_are_removed() {
    let env = cluster().await;
    install_crds(&env).await;
    let ns = env.namespace("series").await;
    let n = ns.name().to_string();
    let of = start_openflux(&env, &n).await;
    let series = |name: &str| {
        format!(
            "gotk_reconcile_duration_seconds_count{{kind=\"Artifact\",name=\"{name}\",namespace=\"{n}\"}}"
        )
    };
    let mut spec = publish(
        env.fixtures(),
        &n,
        "kept",
        "v1",
        &[("cm.yaml", &support::configmap_yaml("kept"))],
    );
    for name in ["exported", "invalid"] {
        if name == "invalid" {
            spec.as_object_mut().map(|s| s.remove("digest"));
        }
        env.apply(&json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": name, "namespace": n}, "spec": spec,
        }))
        .await
        .expect("writing the Artifact");
    }
    for name in ["exported", "invalid"] {
        wait_for(
            &format!("the series of Artifact {name}"),
            TIMEOUT,
            || async { of.metric(&series(name)).await.map(|_| ()) },
        )
        .await;
    }
    for name in ["exported", "invalid"] {
        delete(&env, ARTIFACT, "Artifact", &n, name).await;
    }
    for name in ["exported", "invalid"] {
        wait_for(
            &format!("the series of Artifact {name} to go"),
            Duration::from_secs(5),
            || async { of.metric(&series(name)).await.is_none().then_some(()) },
        )
        .await;
    }
    drop(of);
    ns.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_without_digest_says_why_it_is_not_exported() {
    let env = cluster().await;
    install_crds(&env).await;
    let ns = env.namespace("invalid").await;
    let n = ns.name().to_string();
    let _of = start_openflux(&env, &n).await;
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": "nodigest", "namespace": n},
        "spec": {"url": "http://127.0.0.1:1/a.tar.gz", "revision": "v1"},
    }))
    .await
    .expect("writing the Artifact");
    let (status, reason, message) = wait_for("the Artifact's Ready=False", TIMEOUT, || async {
        let a = env.find(ARTIFACT, "Artifact", &n, "nodigest").await?;
        ready_condition(&a)
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "InvalidArtifact")
    );
    assert!(message.contains("spec.digest"), "{message}");
    // ... and says it as a Warning Event on the Artifact, as Flux does.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), &n);
    let note = wait_for("an InvalidArtifact Event", TIMEOUT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref() == Some("nodigest");
            let warning = e.type_.as_deref() == Some("Warning");
            (about && warning && e.reason.as_deref() == Some("InvalidArtifact")).then_some(e.note)
        })
    })
    .await;
    assert!(note.is_some_and(|n| n.contains("spec.digest")));
    for kind in ["ExternalArtifact", "OCIRepository"] {
        assert!(env
            .find(
                SOURCE,
                kind,
                &n,
                &openflux::names::identity::artifact_export_name("nodigest"),
            )
            .await
            .is_none());
    }
    // Bad input is refused by the API server itself: the digest pattern.
    let bad = env
        .apply(&json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": "baddigest", "namespace": n},
            "spec": {"url": "http://x/a.tar.gz", "revision": "v1", "digest": "not a digest"},
        }))
        .await;
    assert!(
        bad.is_err(),
        "a malformed digest must be rejected by the CRD schema"
    );
    ns.delete().await;
}

/// A producer's own Artifact that happens to carry the name the mirror
/// gives a GitRepository (`gitrepository-<name>`) keeps its content and its
/// owner, whether the producer owns it as controller or not; the conflict
/// shows on the GitRepository as a Warning Event naming the Artifact, and
/// in a count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_artifact_under_a_mirror_name_is_never_written_over() {
    let env = cluster().await;
    let fx = env.fixtures();
    install_crds(&env).await;
    let ns = env.namespace("mirror-taken").await;
    let n = ns.name().to_string();
    let (repo, _) = fx
        .create_repo(
            &unique_name("taken"),
            &[("deploy/cm.yaml", &support::configmap_yaml("git"))],
        )
        .expect("creating a git repository");
    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": "producer", "namespace": n}, "spec": {}
        }))
        .await
        .expect("creating the custom source");
    let uid = source.uid().expect("uid");
    let of = start_openflux(&env, &n).await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), &n);
    for (git, controller) in [("app", None), ("lib", Some(true))] {
        let name = format!("gitrepository-{git}");
        let spec = publish(
            env.fixtures(),
            &n,
            &name,
            "v1",
            &[("cm.yaml", &support::configmap_yaml("producer"))],
        );
        env.apply(&json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": name, "namespace": n, "ownerReferences": [
                {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "producer",
                 "uid": uid, "controller": controller}]},
            "spec": spec,
        }))
        .await
        .expect("the producer's Artifact");
        env.apply(&json!({
            "apiVersion": SOURCE, "kind": "GitRepository",
            "metadata": {"name": git, "namespace": n},
            "spec": {"url": repo.url, "interval": "10m", "ref": {"branch": "main"}}
        }))
        .await
        .expect("creating the GitRepository");
        wait_for(
            &format!("GitRepository {git} to have an artifact"),
            TIMEOUT,
            || async {
                let g = env.find(SOURCE, "GitRepository", &n, git).await?;
                field(&g, "/status/artifact/url").map(|_| ())
            },
        )
        .await;
        // The conflict is told on the GitRepository, naming the Artifact
        // (or the producer's Artifact changed, which fails below).
        let note = wait_for(
            &format!("the conflict on GitRepository {git}"),
            TIMEOUT,
            || async {
                let a = env.find(ARTIFACT, "Artifact", &n, &name).await?;
                if field(&a, "/spec/url") != spec.get("url") {
                    return Some(None);
                }
                let list = events.list(&Default::default()).await.ok()?;
                list.items.into_iter().find_map(|e| {
                    let regarding = e.regarding.as_ref()?;
                    let about = regarding.name.as_deref() == Some(git)
                        && regarding.kind.as_deref() == Some("GitRepository");
                    let warning = e.type_.as_deref() == Some("Warning");
                    (about && warning && e.reason.as_deref() == Some("ArtifactNameTaken"))
                        .then(|| Some(e.note.unwrap_or_default()))
                })
            },
        )
        .await;
        let artifact = env
            .find(ARTIFACT, "Artifact", &n, &name)
            .await
            .expect("the producer's Artifact");
        for key in ["url", "revision", "digest"] {
            assert_eq!(
                field(&artifact, &format!("/spec/{key}")),
                spec.get(key),
                "{name} was written over"
            );
        }
        let owners = artifact.owner_references();
        assert_eq!(owners.len(), 1, "{name}: {owners:?}");
        assert_eq!(owners[0].uid, uid);
        let note = note.expect("an Event on the GitRepository");
        assert!(note.contains(&name) && note.contains("renamed"), "{note}");
    }
    assert_eq!(
        of.metric("openflux_mirror_conflicts_total{kind=\"GitRepository\"}")
            .await,
        Some(2.0),
        "each conflict counted once"
    );
    drop(of);
    ns.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_writes_and_a_standby_takes_over() {
    let env = cluster().await;
    install_crds(&env).await;
    let ns = env.namespace("leader").await;
    let n = ns.name().to_string();
    let mut a = start_openflux(&env, &n).await;
    let mut b = start_openflux(&env, &n).await;
    // Both race for the Lease; exactly one wins.
    let a_leads = wait_for("one replica to lead", TIMEOUT, || async {
        let (la, lb) = (
            a.metric("openflux_leader ").await.unwrap_or(0.0),
            b.metric("openflux_leader ").await.unwrap_or(0.0),
        );
        assert!(la + lb <= 1.0, "two replicas lead at once");
        (la + lb == 1.0).then_some(la == 1.0)
    })
    .await;
    let (leader, standby) = if a_leads {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert_eq!(standby.metric("openflux_leader ").await, Some(0.0));

    // The leader steps down on SIGTERM and gives the Lease up.
    assert!(
        leader.stop().is_some_and(|s| s.success()),
        "clean exit on SIGTERM"
    );
    wait_for("the standby to take the Lease", TIMEOUT, || async {
        (standby.metric("openflux_leader ").await == Some(1.0)).then_some(())
    })
    .await;
    // ... and runs the controllers: a new Artifact is exported.
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": "after-failover", "namespace": n},
        "spec": {"url": "http://127.0.0.1:1/a.tar.gz", "revision": "v1", "digest": "sha256:00"},
    }))
    .await
    .expect("writing the Artifact");
    support::exports::wait_export(&env, &n, "after-failover", |_| true).await;
    drop(a);
    drop(b);
    ns.delete().await;
}

/// A consumer that kustomize-controller refuses for its ExternalArtifact
/// gate (off on this control plane, as in Flux's default install) is
/// noticed from the leader's watch of Kustomizations: the gauge turns 1
/// and one warning names the consumer and the fix; once the consumer is
/// gone the gauge is 0 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_refused_for_the_gate_is_reported() {
    let env = cluster().await;
    install_crds(&env).await;
    let ns = env.namespace("gate").await;
    let n = ns.name().to_string();
    let of = start_openflux(&env, &n).await;
    let gauge = r#"openflux_consumer_external_artifact_gate_disabled{consumer="Kustomization"} "#;
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "refused", "namespace": n},
        "spec": {"interval": "10m", "prune": true, "path": "./",
                 "sourceRef": {"apiVersion": SOURCE, "kind": "ExternalArtifact", "name": "web"}},
    }))
    .await
    .expect("the Kustomization");
    wait_for(
        "kustomize-controller to refuse it for the gate",
        TIMEOUT,
        || async {
            let ks = env.find(KUSTOMIZE, "Kustomization", &n, "refused").await?;
            let (status, _, message) = ready_condition(&ks)?;
            (status == "False" && message.contains("ExternalArtifact feature gate is disabled"))
                .then_some(())
        },
    )
    .await;
    wait_for(
        "the gate gauge to turn 1",
        Duration::from_secs(30),
        || async { (of.metric(gauge).await == Some(1.0)).then_some(()) },
    )
    .await;
    let log = of.log_tail(400);
    assert!(
        log.contains(&format!(
            "Kustomization {n}/refused cannot read the ExternalArtifact"
        )) && log.contains("--feature-gates=ExternalArtifact=true"),
        "no warning naming the consumer:\n{log}"
    );
    delete(&env, KUSTOMIZE, "Kustomization", &n, "refused").await;
    wait_for(
        "the gate gauge to turn 0",
        Duration::from_secs(30),
        || async { (of.metric(gauge).await == Some(0.0)).then_some(()) },
    )
    .await;
    drop(of);
    ns.delete().await;
}
