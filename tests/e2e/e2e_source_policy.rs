//! End to end: SourcePolicy, the tenant policy on custom source kinds, on the
//! local control plane with openflux's shipped mutating and validating
//! webhook configurations.
//!
//! Tenant A may use HttpSource only, tenant B only a kind made up here; a
//! third namespace no policy selects may use both. Each rule holds for a
//! reference to the source (rewritten by the mutating webhook) and for a
//! reference that names the source's export directly (which only the
//! validating webhook sees, whether the export exists yet or openflux made
//! it from a real source), with the denial naming the policy and the kind.
//! A change of a namespace's labels or of a policy takes effect for the next
//! admission.

use openflux_testkit as support;

use kube::api::{DynamicObject, PostParams};
use serde_json::{json, Value};
use support::{cluster, wait_for, Cell, Env, TIMEOUT};

const HTTP_SOURCE_CRD: &str = include_str!("../../manifests/http-source/crd.yaml");
const HTTP_GROUP: &str = "sources.openflux.dev";
/// The made-up kind of tenant B: `TestSource` of this group.
const WIDGET_GROUP: &str = "widgets.source-policy.e2e.test";
const FLUX: &str = "source.toolkit.fluxcd.io/v1";
const POLICY: &str = "openflux.dev/v1alpha1";

/// The label the test's policies select namespaces by.
const TENANT: &str = "source-policy.e2e.openflux.dev/tenant";

fn http_export(name: &str) -> String {
    openflux::names::identity::source_export_name(HTTP_GROUP, "HttpSource", name)
}

fn widget_export(name: &str) -> String {
    openflux::names::identity::source_export_name(WIDGET_GROUP, "TestSource", name)
}

fn http_ref(name: &str) -> Value {
    json!({"apiVersion": format!("{HTTP_GROUP}/v1alpha1"), "kind": "HttpSource", "name": name})
}

fn widget_ref(name: &str) -> Value {
    json!({"apiVersion": format!("{WIDGET_GROUP}/v1"), "kind": "TestSource", "name": name})
}

fn export_ref(kind: &str, name: &str) -> Value {
    json!({"apiVersion": FLUX, "kind": kind, "name": name})
}

/// A server-side dry-run create of a Kustomization in `ns` with
/// `source_ref`: `Ok(())` when admitted, else the API server's message.
async fn admit(env: &Env, ns: &str, source_ref: &Value) -> Result<(), String> {
    let name = support::unique_name("ks");
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"interval": "10m", "prune": true, "path": "./", "sourceRef": source_ref}
    }))
    .expect("a Kustomization");
    let (api, _) = support::dynamic_api(
        &env.client,
        "kustomize.toolkit.fluxcd.io/v1",
        "Kustomization",
        Some(ns),
    )
    .await
    .expect("discovery");
    let params = PostParams {
        dry_run: true,
        field_manager: None,
    };
    match api.create(&params, &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(e) => Err(format!("not an API answer: {e}")),
    }
}

/// Asserts the reference is denied by `policy` for `kind`, by the webhook
/// `webhook` (`kustomizations.openflux.dev` or
/// `kustomizations.validate.openflux.dev`).
fn assert_denied(what: &str, got: Result<(), String>, webhook: &str, policy: &str, kind: &str) {
    let message = match got {
        Ok(()) => panic!("{what}: admitted, expected a denial by SourcePolicy {policy}"),
        Err(message) => message,
    };
    for part in [
        format!("admission webhook \"{webhook}\" denied the request"),
        format!("SourcePolicy {policy} "),
        format!("a source of kind {kind},"),
    ] {
        assert!(
            message.contains(&part),
            "{what}: {message:?} lacks {part:?}"
        );
    }
}

fn assert_admitted(what: &str, got: Result<(), String>) {
    if let Err(message) = got {
        panic!("{what}: denied: {message}");
    }
}

async fn label(env: &Env, ns: &str, tenant: &str) {
    env.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": ns, "labels": {TENANT: tenant}}}))
        .await
        .expect("labelling the namespace");
}

async fn policy(env: &Env, name: &str, tenant: &str, allowed: &[(&str, &str)]) {
    let allowed: Vec<Value> = allowed
        .iter()
        .map(|(group, kind)| json!({"group": group, "kind": kind}))
        .collect();
    env.apply(&json!({
        "apiVersion": POLICY, "kind": "SourcePolicy", "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": {TENANT: tenant}}, "allowedKinds": allowed}
    }))
    .await
    .expect("writing the SourcePolicy");
}

/// A TestSource `name` of `ns` with an Artifact owned by it, once openflux
/// has exported it; returns the reference a consumer would name the export
/// by.
async fn exported_widget(env: &Env, ns: &str, name: &str) -> Value {
    let api_version = format!("{WIDGET_GROUP}/v1");
    let source = env
        .apply(&json!({
            "apiVersion": api_version, "kind": "TestSource",
            "metadata": {"name": name, "namespace": ns}, "spec": {}
        }))
        .await
        .expect("creating the TestSource");
    // The tarball is named after the source, cut to a file name's length.
    let spec = support::openflux::publish(
        env.fixtures(),
        ns,
        &name[..name.len().min(64)],
        "v1",
        &[("configmap.yaml", &support::configmap_yaml(name))],
    );
    env.apply(&json!({
        "apiVersion": POLICY, "kind": "Artifact",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [
            {"apiVersion": api_version, "kind": "TestSource", "name": name,
             "uid": source.metadata.uid.clone().expect("uid"), "controller": true}]},
        "spec": spec,
    }))
    .await
    .expect("writing the Artifact");
    let (_, export) = support::exports::wait_export(env, ns, name, |_| true).await;
    support::exports::reference_to(&export)
}

/// Points both of the test's webhook configurations at `namespaces`.
async fn cover(env: &Env, name: &str, namespaces: &[&str]) {
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let config = env
            .get("admissionregistration.k8s.io/v1", kind, None, name)
            .await
            .expect("reading the webhook configuration")
            .expect("the webhook configuration");
        let mut webhooks = config.data["webhooks"].clone();
        for w in webhooks.as_array_mut().expect("webhooks") {
            w["namespaceSelector"] = json!({"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]});
        }
        env.apply(&json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name}, "webhooks": webhooks,
        }))
        .await
        .expect("widening the webhook configuration");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_use_only_the_source_kinds_their_policies_allow_however_they_refer() {
    tenants_use_only_the_source_kinds_their_policies_allow_however_they_refer_on(Cell::Main).await;
}

/// [`tenants_use_only_the_source_kinds_their_policies_allow_however_they_refer`] on `cell`'s control plane (e2e_kubernetes runs it on
/// every Kubernetes line).
pub(crate) async fn tenants_use_only_the_source_kinds_their_policies_allow_however_they_refer_on(
    cell: Cell,
) {
    let env = support::cell(cell).await;
    support::install_artifact_crd(&env).await;
    env.apply_yaml(HTTP_SOURCE_CRD)
        .await
        .expect("installing the HttpSource CRD");
    support::install_test_source_crd(&env, WIDGET_GROUP).await;
    support::wait_established(
        &env,
        &[
            "httpsources.sources.openflux.dev",
            &format!("testsources.{WIDGET_GROUP}"),
            "kustomizations.kustomize.toolkit.fluxcd.io",
        ],
    )
    .await;
    let (a, b, open) = (
        env.namespace("tenant-a").await,
        env.namespace("tenant-b").await,
        env.namespace("no-policy").await,
    );
    let (na, nb, no) = (
        a.name().to_string(),
        b.name().to_string(),
        open.name().to_string(),
    );
    let unique = support::unique_name("t");
    let (tenant_a, tenant_b) = (format!("{unique}-a"), format!("{unique}-b"));
    label(&env, &na, &tenant_a).await;
    label(&env, &nb, &tenant_b).await;

    let (of, webhook) = support::webhook::openflux_with_webhook(&env, &na, &[]).await;
    cover(&env, &webhook.name, &[&na, &nb, &no]).await;
    let (policy_a, policy_b) = (format!("{unique}-a"), format!("{unique}-b"));
    policy(&env, &policy_a, &tenant_a, &[(HTTP_GROUP, "HttpSource")]).await;
    policy(&env, &policy_b, &tenant_b, &[(WIDGET_GROUP, "TestSource")]).await;

    // The configurations and the policy take effect shortly after they are
    // written: wait until B's reference to an HttpSource export is denied.
    wait_for("tenant B's policy in force", TIMEOUT, || async {
        admit(
            &env,
            &nb,
            &export_ref("ExternalArtifact", &http_export("web")),
        )
        .await
        .err()
        .filter(|m| m.contains(&policy_b))
    })
    .await;
    wait_for("tenant A's policy in force", TIMEOUT, || async {
        admit(&env, &na, &widget_ref("w"))
            .await
            .err()
            .filter(|m| m.contains(&policy_a))
    })
    .await;

    let mutating = "kustomizations.openflux.dev";
    let validating = "kustomizations.validate.openflux.dev";
    let http_kind = format!("HttpSource.{HTTP_GROUP}");
    let widget_kind = format!("TestSource.{WIDGET_GROUP}");

    // References to the sources, rewritten by the mutating webhook.
    assert_admitted(
        "A refers to an HttpSource",
        admit(&env, &na, &http_ref("web")).await,
    );
    assert_denied(
        "A refers to a TestSource",
        admit(&env, &na, &widget_ref("w")).await,
        mutating,
        &policy_a,
        &widget_kind,
    );
    assert_admitted(
        "B refers to a TestSource",
        admit(&env, &nb, &widget_ref("w")).await,
    );
    assert_denied(
        "B refers to an HttpSource",
        admit(&env, &nb, &http_ref("web")).await,
        mutating,
        &policy_b,
        &http_kind,
    );

    // References that name the export directly, which only the validating
    // webhook sees: the same answers.
    for kind in ["ExternalArtifact", "OCIRepository"] {
        assert_admitted(
            &format!("A names an HttpSource export ({kind})"),
            admit(&env, &na, &export_ref(kind, &http_export("web"))).await,
        );
        assert_denied(
            &format!("A names a TestSource export ({kind})"),
            admit(&env, &na, &export_ref(kind, &widget_export("w"))).await,
            validating,
            &policy_a,
            &widget_kind,
        );
        assert_admitted(
            &format!("B names a TestSource export ({kind})"),
            admit(&env, &nb, &export_ref(kind, &widget_export("w"))).await,
        );
        assert_denied(
            &format!("B names an HttpSource export ({kind})"),
            admit(&env, &nb, &export_ref(kind, &http_export("web"))).await,
            validating,
            &policy_b,
            &http_kind,
        );
    }
    // The export openflux really made of a TestSource in A's namespace (a
    // policy restricts consumers, not producers) has the name the webhook
    // reads, and naming it is denied.
    let real = exported_widget(&env, &na, "real").await;
    assert_eq!(real["name"], json!(widget_export("real")), "{real}");
    assert_denied(
        "A names the export openflux made of its TestSource",
        admit(&env, &na, &real).await,
        validating,
        &policy_a,
        &widget_kind,
    );
    let mut cross = export_ref("ExternalArtifact", &widget_export("w"));
    cross["namespace"] = json!(nb);
    assert_denied(
        "A names B's TestSource export",
        admit(&env, &na, &cross).await,
        validating,
        &policy_a,
        &widget_kind,
    );

    // A source whose export's name is cut to fit (a 241-character name:
    // the cut lands on the dot after it) is judged like any other: by kind
    // and by the export's name, and by kind in a namespace openflux has no
    // Artifact of it in.
    let long = "l".repeat(241);
    let real_long = exported_widget(&env, &na, &long).await;
    let cut = openflux::names::identity::source_export_name(WIDGET_GROUP, "TestSource", &long);
    assert_eq!((real_long["name"].as_str(), cut.len()), (Some(&*cut), 253));
    assert_denied(
        "A refers to its long-named TestSource by kind",
        admit(&env, &na, &widget_ref(&long)).await,
        mutating,
        &policy_a,
        &widget_kind,
    );
    assert_denied(
        "A names its long-named TestSource's export",
        admit(&env, &na, &real_long).await,
        validating,
        &policy_a,
        &widget_kind,
    );
    let mut elsewhere = widget_ref(&long);
    elsewhere["namespace"] = json!(nb);
    match admit(&env, &na, &elsewhere).await {
        Ok(()) => panic!("A refers to a long-named TestSource of B by kind: admitted"),
        Err(message) => assert!(
            message.contains(&format!("admission webhook \"{mutating}\" denied"))
                && message.contains(&policy_a),
            "{message}"
        ),
    }
    let mut from_b = widget_ref(&long);
    from_b["namespace"] = json!(na);
    assert_admitted(
        "B refers to A's long-named TestSource",
        admit(&env, &nb, &from_b).await,
    );

    // Flux's own sources are not restricted, and a namespace no policy
    // selects keeps today's behaviour.
    assert_admitted(
        "A names a stock OCIRepository",
        admit(&env, &na, &export_ref("OCIRepository", "podinfo")).await,
    );
    for (what, r) in [
        ("an HttpSource", http_ref("web")),
        ("a TestSource", widget_ref("w")),
        (
            "an HttpSource export",
            export_ref("ExternalArtifact", &http_export("web")),
        ),
        (
            "a TestSource export",
            export_ref("OCIRepository", &widget_export("w")),
        ),
    ] {
        assert_admitted(
            &format!("the unselected namespace refers to {what}"),
            admit(&env, &no, &r).await,
        );
    }

    // A namespace's labels decide the next admission: B relabelled as
    // tenant A may use HttpSource and no longer its TestSource.
    label(&env, &nb, &tenant_a).await;
    wait_for("B judged as tenant A", TIMEOUT, || async {
        admit(&env, &nb, &http_ref("web")).await.ok()
    })
    .await;
    assert_denied(
        "B, relabelled, names a TestSource export",
        admit(
            &env,
            &nb,
            &export_ref("ExternalArtifact", &widget_export("w")),
        )
        .await,
        validating,
        &policy_a,
        &widget_kind,
    );

    // A policy's change decides the next admission: tenant A's policy
    // allows every kind of the made-up group too.
    policy(
        &env,
        &policy_a,
        &tenant_a,
        &[(HTTP_GROUP, "HttpSource"), (WIDGET_GROUP, "*")],
    )
    .await;
    wait_for("tenant A's widened policy in force", TIMEOUT, || async {
        admit(&env, &na, &widget_ref("w")).await.ok()
    })
    .await;
    assert_admitted(
        "A names a TestSource export under the widened policy",
        admit(
            &env,
            &na,
            &export_ref("ExternalArtifact", &widget_export("w")),
        )
        .await,
    );

    let (policies, _) = support::dynamic_api(&env.client, POLICY, "SourcePolicy", None)
        .await
        .expect("discovery");
    for name in [&policy_a, &policy_b] {
        policies
            .delete(name, &Default::default())
            .await
            .expect("deleting the SourcePolicy");
    }
    drop(webhook);
    drop(of);
    a.delete().await;
    b.delete().await;
    open.delete().await;
}

/// With openflux down (its webhook configurations point at an address
/// nothing listens on), the API server still admits every consumer whose
/// reference cannot name an export, and refuses the ones that may: the
/// validating configuration's `matchConditions` decide, run by the API
/// server itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_openflux_is_down_only_references_that_may_name_an_export_are_refused() {
    let env = cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["kustomizations.kustomize.toolkit.fluxcd.io"]).await;
    let ns = env.namespace("openflux-down").await;
    let n = ns.name().to_string();
    let nowhere = support::openflux::free_addr();
    let webhook = support::webhook::local_webhook(&env, "openflux-down", &n, nowhere).await;
    // The configuration takes effect shortly after it is written: wait
    // until a custom reference is refused for want of openflux.
    wait_for("the webhook configurations in force", TIMEOUT, || async {
        admit(
            &env,
            &n,
            &export_ref("ExternalArtifact", &http_export("web")),
        )
        .await
        .err()
        .filter(|m| m.contains("kustomizations.validate.openflux.dev"))
    })
    .await;
    for (what, r) in [
        ("a GitRepository", export_ref("GitRepository", "podinfo")),
        ("an OCIRepository", export_ref("OCIRepository", "podinfo")),
        (
            "an ExternalArtifact",
            export_ref("ExternalArtifact", "my-artifact"),
        ),
        (
            "a name with two dots",
            export_ref("OCIRepository", "app.v1.example"),
        ),
        (
            "a GitRepository named like an export",
            export_ref("GitRepository", &http_export("web")),
        ),
    ] {
        assert_admitted(&format!("openflux down, {what}"), admit(&env, &n, &r).await);
    }
    for (what, r, webhook_name) in [
        (
            "an HttpSource",
            http_ref("web"),
            "kustomizations.openflux.dev",
        ),
        (
            "an HttpSource export",
            export_ref("ExternalArtifact", &http_export("web")),
            "kustomizations.validate.openflux.dev",
        ),
        (
            "a shadow",
            export_ref("OCIRepository", &widget_export("w")),
            "kustomizations.validate.openflux.dev",
        ),
    ] {
        let message = admit(&env, &n, &r)
            .await
            .err()
            .unwrap_or_else(|| panic!("openflux down, {what}: admitted"));
        assert!(
            message.contains(&format!("failed calling webhook \"{webhook_name}\"")),
            "openflux down, {what}: {message}"
        );
    }
    drop(webhook);
    ns.delete().await;
}
