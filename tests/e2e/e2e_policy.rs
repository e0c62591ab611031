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
//!
//! And the other half of the empty-apiVersion rule: the API server, running
//! the shipped webhook configuration's `matchConditions`, sends a recording
//! endpoint exactly the consumer objects the table of source references
//! (`tests/fixtures/source-references.json`) says openflux acts on; the
//! webhook's decision is held to the same table by a unit test.

use openflux_testkit as support;

#[path = "../common/https.rs"]
mod https;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use https::HttpsServer;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::ResourceExt;
use serde_json::{json, Value};
use support::exports::wait_export;
use support::identity::acting_as;
use support::openflux::{publish, Openflux};
use support::{cluster, wait_for, Cell, Env, TIMEOUT};

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
    support::identity::wait_allowed(
        env,
        ns,
        "editor",
        "create",
        "source.toolkit.fluxcd.io",
        "externalartifacts",
    )
    .await;
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
    only_openflux_creates_changes_or_deletes_an_export_on(Cell::Main).await;
}

/// [`only_openflux_creates_changes_or_deletes_an_export`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn only_openflux_creates_changes_or_deletes_an_export_on(cell: Cell) {
    let env = support::cell(cell).await;
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

/// A Role in `ns` letting ServiceAccount `sa_ns`/`sa` do anything with
/// ExternalArtifacts and OCIRepositories (and their status) in `ns`; the
/// client acting as it.
async fn granted(env: &Env, ns: &str, sa_ns: &str, sa: &str) -> kube::Client {
    let rbac = "rbac.authorization.k8s.io/v1";
    let role = format!("exports-{sa_ns}-{sa}");
    for obj in [
        json!({"apiVersion": rbac, "kind": "Role", "metadata": {"name": role, "namespace": ns},
               "rules": [{"apiGroups": ["source.toolkit.fluxcd.io"],
                          "resources": ["externalartifacts", "externalartifacts/status",
                                        "ocirepositories", "ocirepositories/status"],
                          "verbs": ["*"]}]}),
        json!({"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": role, "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]}),
    ] {
        env.apply(&obj).await.expect("the grant");
    }
    support::identity::wait_allowed_in(
        env,
        (sa_ns, sa),
        ns,
        "create",
        "source.toolkit.fluxcd.io",
        "externalartifacts",
    )
    .await;
    acting_as(env, sa_ns, sa)
}

/// Who else may touch an export: the garbage collector may delete it or
/// change its other metadata (finalizers), never its spec, labels,
/// annotations or status; source-controller may change what it writes on
/// a suspended shadow (its finalizer, conditions) but not its spec or the
/// artifact consumers read, and only the source-controller of the Flux
/// namespace: one of that name elsewhere is nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_flux_namespaces_source_controller_and_the_garbage_collector_touch_exports() {
    let env = cluster().await;
    install(&env).await;
    let ns = env.namespace("policy-who").await;
    let n = ns.name().to_string();
    let _of = start(&env, &n, "shadow").await;
    let (_, export) = exported(&env, &n, "web").await;
    let name = export.name_any();
    let kind = "OCIRepository";
    let pp = PatchParams::default();
    let forged = json!({"status": {"artifact": {"url": "http://127.0.0.1:1/forged.tar.gz"}}});
    // The garbage collector's identity (RBAC allows it here): metadata it
    // keeps (finalizers) yes; the status, spec, labels and annotations no.
    let system = granted(&env, &n, "kube-system", "generic-garbage-collector").await;
    let (api, _) = support::dynamic_api(&system, SOURCE, kind, Some(&n))
        .await
        .expect("discovery");
    wait_for("the kube-system grant to apply", TIMEOUT, || async {
        api.get(&name).await.ok()
    })
    .await;
    assert_refused(
        "a kube-system controller writing the export's status.artifact",
        api.patch_status(&name, &pp, &Patch::Merge(forged.clone()))
            .await,
    );
    for (what, change) in [
        (
            "annotations",
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        ("labels", json!({"metadata": {"labels": {"x": "y"}}})),
        ("spec", json!({"spec": {"suspend": false}})),
    ] {
        assert_refused(
            &format!("the garbage collector changing the export's {what}"),
            api.patch(&name, &pp, &Patch::Merge(change)).await,
        );
    }
    for finalizers in [json!(["example.com/held"]), Value::Null] {
        api.patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
        )
        .await
        .expect("the garbage collector changing the export's finalizers");
    }
    // A ServiceAccount named source-controller outside the Flux namespace.
    let impostor = granted(&env, &n, &n, "source-controller").await;
    let (api, _) = support::dynamic_api(&impostor, SOURCE, kind, Some(&n))
        .await
        .expect("discovery");
    wait_for("the impostor's grant to apply", TIMEOUT, || async {
        api.get(&name).await.ok()
    })
    .await;
    assert_refused(
        "a source-controller of another namespace writing the shadow's status",
        api.patch_status(&name, &pp, &Patch::Merge(forged.clone()))
            .await,
    );
    assert_refused(
        "a source-controller of another namespace adding a finalizer",
        api.patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/held"]}})),
        )
        .await,
    );
    // Flux's own source-controller: its conditions yes, the artifact no.
    let flux = acting_as(&env, "flux-system", "source-controller");
    let (api, _) = support::dynamic_api(&flux, SOURCE, kind, Some(&n))
        .await
        .expect("discovery");
    assert_refused(
        "source-controller resuming the shadow",
        api.patch(
            &name,
            &pp,
            &Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await,
    );
    assert_refused(
        "source-controller writing the shadow's status.artifact",
        api.patch_status(&name, &pp, &Patch::Merge(forged.clone()))
            .await,
    );
    let current = env.find(SOURCE, kind, &n, &name).await.expect("the export");
    let mut conditions = current.data["status"]["conditions"].clone();
    if let Some(list) = conditions.as_array_mut() {
        list.push(
            json!({"type": "Reconciling", "status": "False", "reason": "Suspended",
                         "message": "suspended", "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        );
    }
    api.patch_status(
        &name,
        &pp,
        &Patch::Merge(json!({"status": {"conditions": conditions}})),
    )
    .await
    .expect("source-controller writing a condition on a suspended shadow");
    let now = env.find(SOURCE, kind, &n, &name).await.expect("the export");
    assert_eq!(
        now.data["status"]["artifact"],
        export.data["status"]["artifact"]
    );
    ns.delete().await;
}

/// An export the API server refuses (here openflux runs as an identity the
/// shipped policy does not let write exports: the cluster administrator)
/// shows on the Artifact: `Ready=False`, reason `ExportFailed`, with the API
/// server's message, and a Warning Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_export_shows_on_the_artifact() {
    let env = cluster().await;
    install(&env).await;
    let ns = env.namespace("policy-refused").await;
    let n = ns.name().to_string();
    let _of = Openflux::start_as(
        &env,
        &n,
        &[
            "--watch-all-namespaces=false",
            &format!("--namespace={n}"),
            "--export=external-artifact",
            &format!("--webhook-addr={}", support::openflux::free_addr()),
        ],
        env.kubeconfig.clone(),
    )
    .await;
    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": "web", "namespace": n}, "spec": {}
        }))
        .await
        .expect("creating the custom source");
    let spec = publish(
        env.fixtures(),
        &n,
        "web",
        "v1",
        &[("configmap.yaml", &support::configmap_yaml("web"))],
    );
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": "web", "namespace": n, "ownerReferences": [
            {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web",
             "uid": source.uid().expect("uid"), "controller": true}]},
        "spec": spec,
    }))
    .await
    .expect("writing the Artifact");
    let (status, reason, message) = wait_for("the Artifact's Ready condition", TIMEOUT, || async {
        let a = env.find(ARTIFACT, "Artifact", &n, "web").await?;
        support::ready_condition(&a)
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ExportFailed"),
        "{message}"
    );
    assert!(
        message.contains(REFUSED),
        "the API server's message is not told: {message}"
    );
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &n);
    wait_for("an ExportFailed Event on the Artifact", TIMEOUT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref() == Some("web");
            let warning = e.type_.as_deref() == Some("Warning");
            (about && warning && e.reason.as_deref() == Some("ExportFailed")).then_some(())
        })
    })
    .await;
    ns.delete().await;
}

/// Deleting an Artifact in the foreground deletes its export first, and
/// orphaning deletion takes the export's ownerReference off: the garbage
/// collector does both under the policy (otherwise the Artifact would stay,
/// held by its deletion finalizer). On a shadow, source-controller keeps
/// its finalizer, which only it adds and removes. Both export kinds.
/// Deleting a namespace takes its exports with it: the namespace
/// controller's deletes pass the policies, and a shadow's finalizer
/// (source-controller's) comes off with openflux running, which takes it
/// off itself, and with openflux stopped, when source-controller takes it
/// off as for any source. The namespace is gone within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_takes_its_exports_with_it() {
    let env = cluster().await;
    install(&env).await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(env.client.clone());
    for (mode, kind, running) in [
        ("external-artifact", "ExternalArtifact", true),
        ("external-artifact", "ExternalArtifact", false),
        ("shadow", "OCIRepository", true),
        ("shadow", "OCIRepository", false),
    ] {
        let what = format!("a namespace with {kind} exports, openflux running: {running}");
        let ns = env.namespace("policy-gone").await;
        let n = ns.name().to_string();
        let mut openflux = start(&env, &n, mode).await;
        let (_, export) = exported(&env, &n, "web").await;
        let name = export.name_any();
        let (exports, _) = support::dynamic_api(&env.client, SOURCE, kind, Some(&n))
            .await
            .expect("discovery");
        if kind == "OCIRepository" {
            wait_for(
                "source-controller's finalizer on the shadow",
                TIMEOUT,
                || async {
                    let now = exports.get(&name).await.ok()?;
                    now.finalizers()
                        .iter()
                        .any(|f| f == SOURCE_FINALIZER)
                        .then_some(())
                },
            )
            .await;
        }
        if !running {
            openflux.stop();
        }
        ns.delete().await;
        let waited = format!("{what}: the namespace {n} to be gone, its {kind} {name} with it");
        wait_for(&waited, TIMEOUT, || async {
            let left = namespaces.get_opt(&n).await.ok()?;
            left.is_none().then_some(())
        })
        .await;
        println!("{what}: the namespace is gone");
    }
}

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

/// A webhook endpoint over HTTPS that admits everything unchanged and
/// records the name of every object sent to it; stops when dropped.
struct Recorder {
    server: HttpsServer,
    ca_pem: String,
    seen: Arc<Mutex<BTreeSet<String>>>,
}

async fn recorder() -> Recorder {
    use openflux::certs::{Authority, DEFAULT_CA_VALIDITY};
    let ca = Authority::generate(DEFAULT_CA_VALIDITY).expect("a test CA");
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let record = seen.clone();
    let router = axum::Router::new().fallback(move |body: axum::body::Bytes| {
        let record = record.clone();
        async move {
            let review: Value = serde_json::from_slice(&body).unwrap_or_default();
            let request = &review["request"];
            if let Some(name) = request["object"]["metadata"]["name"].as_str() {
                record.lock().expect("the record").insert(name.to_string());
            }
            axum::Json(json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": request["uid"], "allowed": true}
            }))
        }
    });
    Recorder {
        server: HttpsServer::serve(&ca, router).await,
        ca_pem: ca.cert_pem.clone(),
        seen,
    }
}

/// The shipped webhook configuration's `matchConditions`, run by the API
/// server, send a webhook exactly the objects the table of source
/// references says openflux acts on: no stock reference (whatever its
/// apiVersion: absent, empty or Flux's) and every custom one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_match_conditions_send_openflux_what_the_table_says() {
    the_match_conditions_send_openflux_what_the_table_says_on(Cell::Main).await;
}

/// [`the_match_conditions_send_openflux_what_the_table_says`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn the_match_conditions_send_openflux_what_the_table_says_on(cell: Cell) {
    let env = support::cell(cell).await;
    let stacks = support::workspace_root().join("e2e/crds/pulumi-stack.yaml");
    env.apply_yaml(&std::fs::read_to_string(&stacks).expect("the Stack CRD"))
        .await
        .expect("installing the Stack CRD");
    support::wait_established(
        &env,
        &[
            "stacks.pulumi.com",
            "kustomizations.kustomize.toolkit.fluxcd.io",
            "helmreleases.helm.toolkit.fluxcd.io",
            "artifactgenerators.source.extensions.fluxcd.io",
        ],
    )
    .await;
    let ns = env.namespace("match-conditions").await;
    let n = ns.name().to_string();
    let recorder = recorder().await;
    let webhook =
        support::webhook::local_webhook(&env, "openflux-cel", &n, recorder.server.addr).await;
    let ca_bundle = serde_json::to_value(k8s_openapi::ByteString(
        recorder.ca_pem.clone().into_bytes(),
    ))
    .expect("the CA bundle");
    let config = env
        .get(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            None,
            &webhook.name,
        )
        .await
        .expect("reading the webhook configuration")
        .expect("the webhook configuration");
    let mut webhooks = config.data["webhooks"].clone();
    for w in webhooks.as_array_mut().expect("webhooks") {
        w["clientConfig"]["caBundle"] = ca_bundle.clone();
    }
    env.apply(&json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": webhook.name}, "webhooks": webhooks,
    }))
    .await
    .expect("setting the CA bundle");

    // The configuration takes effect shortly after it is written: wait
    // until a case that reaches the webhook is seen.
    let cases = support::references::source_reference_cases();
    let probe = cases
        .iter()
        .find(|c| c.openflux)
        .expect("a case for openflux");
    wait_for(
        "the webhook configuration to take effect",
        TIMEOUT,
        || async {
            let name = format!("probe-{}", support::unique_name("p"));
            let _ = dry_run_create(&env, &probe.object(&n, &name)).await;
            recorder
                .seen
                .lock()
                .expect("the record")
                .contains(&name)
                .then_some(())
        },
    )
    .await;
    let mut wrong = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = format!("case-{i}");
        if let Err(e) = dry_run_create(&env, &case.object(&n, &name)).await {
            // Refused after admission (for example a custom kind in a
            // field whose schema lists Flux's kinds): the webhook ran.
            assert!(
                matches!(&e, kube::Error::Api(s) if s.code == 422 || s.code == 400),
                "{case}: {e}"
            );
        }
        let reached = recorder.seen.lock().expect("the record").contains(&name);
        if reached != case.openflux {
            wrong.push(format!(
                "{case}: reached openflux: {reached}, the table says {}",
                case.openflux
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the matchConditions and the table disagree:\n{}",
        wrong.join("\n")
    );
    drop(webhook);
    ns.delete().await;
}

/// A server-side dry-run create of `obj`.
async fn dry_run_create(env: &Env, obj: &Value) -> Result<DynamicObject, kube::Error> {
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    let (api, _) = support::dynamic_api(
        &env.client,
        obj["apiVersion"].as_str().unwrap_or_default(),
        obj["kind"].as_str().unwrap_or_default(),
        Some(ns),
    )
    .await
    .expect("discovery");
    let object: DynamicObject = serde_json::from_value(obj.clone()).expect("an object");
    api.create(
        &PostParams {
            dry_run: true,
            field_manager: None,
        },
        &object,
    )
    .await
}
