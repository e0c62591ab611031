//! End to end: the shipped admission policy on openflux's exports
//! (`webhook-config/externalartifact-policy.yaml`, installed by
//! `e2e/cluster up`) on the local control plane, where openflux, the Flux
//! controllers and the controller manager each act as themselves.
//!
//! A user with every right on ExternalArtifacts and OCIRepositories cannot
//! create, change or delete an export, nor put openflux's label on an
//! object; the garbage collector still removes or orphans the exports of a
//! deleted Artifact, and source-controller still keeps its finalizer on a
//! shadow.

use openflux_testkit as support;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::ResourceExt;
use serde_json::{json, Value};
use support::exports::wait_export;
use support::identity::acting_as;
use support::openflux::{publish, Openflux};
use support::{cluster, wait_for, Env, TIMEOUT};

const ARTIFACT: &str = "openflux.dev/v1alpha1";
const SOURCE: &str = "source.toolkit.fluxcd.io/v1";
const TEST_GROUP: &str = "policy.e2e.openflux.dev";
const TEST_SOURCE: &str = "policy.e2e.openflux.dev/v1";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// What the policy's message says on every refusal.
const REFUSED: &str = "is managed by openflux";
/// source-controller's finalizer.
const SOURCE_FINALIZER: &str = "finalizers.fluxcd.io";

async fn install(env: &Env) {
    support::install_artifact_crd(env).await;
    support::install_test_source_crd(env, TEST_GROUP).await;
    support::wait_established(
        env,
        &[
            "artifacts.openflux.dev",
            &format!("testsources.{TEST_GROUP}"),
        ],
    )
    .await;
}

/// openflux for `ns`, exporting as `export` (`external-artifact` or
/// `shadow`); no webhook, so every Artifact is trusted.
async fn start(env: &Env, ns: &str, export: &str) -> Openflux {
    Openflux::start(
        env,
        ns,
        &[
            "--watch-all-namespaces=false",
            &format!("--namespace={ns}"),
            &format!("--export={export}"),
            &format!("--webhook-addr={}", support::openflux::free_addr()),
        ],
    )
    .await
}

/// A custom source `name` with an Artifact of the same name owned by it;
/// waits until it is exported and returns the Artifact and its export.
async fn exported(env: &Env, ns: &str, name: &str) -> (DynamicObject, DynamicObject) {
    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": name, "namespace": ns}, "spec": {}
        }))
        .await
        .expect("creating the custom source");
    let spec = publish(
        env.fixtures(),
        ns,
        name,
        "v1",
        &[("configmap.yaml", &support::configmap_yaml(name))],
    );
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [
            {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": name,
             "uid": source.uid().expect("uid"), "controller": true}]},
        "spec": spec,
    }))
    .await
    .expect("writing the Artifact");
    wait_export(env, ns, name, |_| true).await
}

/// ServiceAccount `editor` of `ns`, which may do anything with
/// ExternalArtifacts and OCIRepositories (and their status) in `ns`.
async fn editor(env: &Env, ns: &str) -> kube::Client {
    let rbac = "rbac.authorization.k8s.io/v1";
    for obj in [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "editor", "namespace": ns}}),
        json!({"apiVersion": rbac, "kind": "Role", "metadata": {"name": "editor", "namespace": ns},
               "rules": [{"apiGroups": ["source.toolkit.fluxcd.io"],
                          "resources": ["externalartifacts", "externalartifacts/status",
                                        "ocirepositories", "ocirepositories/status"],
                          "verbs": ["*"]}]}),
        json!({"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": "editor", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "editor"},
               "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": ns}]}),
    ] {
        env.apply(&obj).await.expect("the editor's RBAC");
    }
    acting_as(env, ns, "editor")
}

/// An object of `kind` that is not an export: an ExternalArtifact naming a
/// custom source, or a suspended OCIRepository.
fn plain(kind: &str, ns: &str, name: &str) -> Value {
    let spec = if kind == "ExternalArtifact" {
        json!({"sourceRef": {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": name}})
    } else {
        json!({"url": "oci://127.0.0.1:1/none", "interval": "10m", "suspend": true})
    };
    json!({"apiVersion": SOURCE, "kind": kind,
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// Asserts that `result` is the policy's refusal.
fn assert_refused<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(e)) => {
            assert!(
                e.message.contains(REFUSED) && e.message.contains("only openflux may"),
                "{what}: refused, but not by the policy: {e:?}"
            );
        }
        other => panic!("{what}: not refused: {other:?}"),
    }
}

/// A user with every right on ExternalArtifacts and OCIRepositories can
/// manage objects of their own, but cannot create, change (spec, labels,
/// status) or delete an export, nor put openflux's label on an object;
/// openflux keeps the export as it was. Both export kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_openflux_creates_changes_or_deletes_an_export() {
    let env = cluster().await;
    install(&env).await;
    for (mode, kind) in [
        ("external-artifact", "ExternalArtifact"),
        ("shadow", "OCIRepository"),
    ] {
        let ns = env.namespace("policy").await;
        let n = ns.name().to_string();
        let _of = start(&env, &n, mode).await;
        let (_, export) = exported(&env, &n, "web").await;
        assert_eq!(export.types.as_ref().map(|t| t.kind.as_str()), Some(kind));
        let name = export.name_any();
        let user = editor(&env, &n).await;
        let (api, _) = support::dynamic_api(&user, SOURCE, kind, Some(&n))
            .await
            .expect("discovery");
        // The user's own object: RBAC allows it (bindings take a moment).
        let own: DynamicObject = serde_json::from_value(plain(kind, &n, "own")).expect("an object");
        wait_for(&format!("the editor to create a {kind}"), TIMEOUT, || {
            let (api, own) = (api.clone(), own.clone());
            async move { api.create(&PostParams::default(), &own).await.ok() }
        })
        .await;

        let spec_change = if kind == "ExternalArtifact" {
            json!({"spec": {"sourceRef": {"name": "elsewhere"}}})
        } else {
            json!({"spec": {"suspend": false}})
        };
        let merge = |patch: Value| Patch::Merge(patch);
        let pp = PatchParams::default();
        assert_refused(
            "changing the export's spec",
            api.patch(&name, &pp, &merge(spec_change)).await,
        );
        assert_refused(
            "taking openflux's label off the export",
            api.patch(
                &name,
                &pp,
                &merge(json!({"metadata": {"labels": {MANAGED_BY: null}}})),
            )
            .await,
        );
        assert_refused(
            "adding a label to the export",
            api.patch(
                &name,
                &pp,
                &merge(json!({"metadata": {"labels": {"team": "x"}}})),
            )
            .await,
        );
        assert_refused(
            "writing the export's status",
            api.patch_status(
                &name,
                &pp,
                &merge(json!({"status": {"artifact": {"url": "http://127.0.0.1:1/forged"}}})),
            )
            .await,
        );
        assert_refused(
            "deleting the export",
            api.delete(&name, &DeleteParams::default()).await,
        );
        let mut forged = plain(kind, &n, "forged");
        forged["metadata"]["labels"] = json!({MANAGED_BY: "openflux"});
        let forged: DynamicObject = serde_json::from_value(forged).expect("an object");
        assert_refused(
            "creating an object with openflux's label",
            api.create(&PostParams::default(), &forged).await,
        );
        assert_refused(
            "putting openflux's label on the user's own object",
            api.patch(
                "own",
                &pp,
                &merge(json!({"metadata": {"labels": {MANAGED_BY: "openflux"}}})),
            )
            .await,
        );
        // The user's own object stays theirs to change and delete.
        api.patch(
            "own",
            &pp,
            &merge(json!({"metadata": {"labels": {"team": "x"}}})),
        )
        .await
        .expect("labelling the user's own object");
        api.delete("own", &DeleteParams::default())
            .await
            .expect("deleting the user's own object");

        let now = env
            .find(SOURCE, kind, &n, &name)
            .await
            .expect("the export is still there");
        assert_eq!(now.data["spec"], export.data["spec"]);
        assert_eq!(
            now.labels().get(MANAGED_BY).map(String::as_str),
            Some("openflux")
        );
        assert!(env.find(SOURCE, kind, &n, "forged").await.is_none());
        ns.delete().await;
    }
}

/// Deleting an Artifact in the foreground deletes its export first, and
/// orphaning deletion takes the export's ownerReference off: the garbage
/// collector does both under the policy (otherwise the Artifact would stay,
/// held by its deletion finalizer). On a shadow, source-controller keeps
/// its finalizer, which only it adds and removes. Both export kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_garbage_collector_deletes_or_orphans_exports_with_their_artifact() {
    let env = cluster().await;
    install(&env).await;
    for (mode, kind) in [
        ("external-artifact", "ExternalArtifact"),
        ("shadow", "OCIRepository"),
    ] {
        let ns = env.namespace("policy-gc").await;
        let n = ns.name().to_string();
        let _of = start(&env, &n, mode).await;
        let (artifacts, _) = support::dynamic_api(&env.client, ARTIFACT, "Artifact", Some(&n))
            .await
            .expect("discovery");

        // Foreground: the export goes first, then the Artifact.
        let (_, export) = exported(&env, &n, "fore").await;
        let name = export.name_any();
        if kind == "OCIRepository" {
            wait_for(
                "source-controller's finalizer on the shadow",
                TIMEOUT,
                || async {
                    let shadow = env.find(SOURCE, kind, &n, &name).await?;
                    shadow
                        .finalizers()
                        .iter()
                        .any(|f| f == SOURCE_FINALIZER)
                        .then_some(())
                },
            )
            .await;
        }
        artifacts
            .delete("fore", &DeleteParams::foreground())
            .await
            .expect("deleting the Artifact in the foreground");
        wait_for(
            &format!("{kind} {name} and Artifact fore to be deleted"),
            TIMEOUT,
            || async {
                let export = env.find(SOURCE, kind, &n, &name).await;
                let artifact = env.find(ARTIFACT, "Artifact", &n, "fore").await;
                (export.is_none() && artifact.is_none()).then_some(())
            },
        )
        .await;

        // Orphaning: the Artifact goes once its export no longer names it.
        let (artifact, export) = exported(&env, &n, "orphan").await;
        let (name, uid) = (export.name_any(), artifact.uid().expect("uid"));
        artifacts
            .delete("orphan", &DeleteParams::orphan())
            .await
            .expect("deleting the Artifact, orphaning its export");
        wait_for("Artifact orphan to be deleted", TIMEOUT, || async {
            env.find(ARTIFACT, "Artifact", &n, "orphan")
                .await
                .is_none()
                .then_some(())
        })
        .await;
        if let Some(export) = env.find(SOURCE, kind, &n, &name).await {
            assert!(
                export.owner_references().iter().all(|o| o.uid != uid),
                "{kind} {name} still names the deleted Artifact"
            );
        }
        ns.delete().await;
    }
}
