//! Uninstalling keeps the users' data and leaves nothing that can refuse a
//! write, on each install path of the release (docs/install.md,
//! "Uninstall"): this tree's bundle installed from nothing, an HttpSource
//! consumed by a Kustomization openflux rewrote, a SourcePolicy; then the
//! path's "Uninstall with ..." block, run as written. Afterwards the CRDs
//! are all that is left of openflux (no webhook configuration, the one
//! openflux wrote at run time included, no admission policy), every
//! HttpSource, Artifact, export and SourcePolicy is the same object as
//! before, the consumer is still `Ready` at its revision, and it can be
//! edited. Installed again by the same path, openflux takes them up: the
//! same objects, the consumer reconciles at the same revision.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use openflux_testkit as support;
use serde_json::{json, Value};
use support::release::Bundle;
use support::{field, Cell, Env};

use super::flux_install::ready_with_inventory;
use super::release::{self, doc_block, sh, with_plain_http_helm};
use super::{all_available, ANNOTATION, HTTP_SOURCE, KUSTOMIZE, ROLLOUT};

const ARTIFACT: &str = "openflux.dev/v1alpha1";
const SOURCE: &str = "source.toolkit.fluxcd.io/v1";

/// An install path of docs/install.md, named as its "Uninstall with ..."
/// section names it.
#[derive(Clone, Copy)]
enum Path {
    Kubectl,
    Helm,
    Flux,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Kubectl => "kubectl",
            Path::Helm => "Helm",
            Path::Flux => "Flux",
        }
    }

    /// Installs the bundle by this path's block of docs/install.md (helm
    /// and Flux told that the cell's registry speaks plain HTTP) and waits
    /// until openflux and the HttpSource controller are available.
    async fn install(self, env: &Env, bundle: &Bundle) {
        tokio::task::block_in_place(|| match self {
            Path::Kubectl => {
                sh(env, bundle, &doc_block(bundle, "## kubectl", "sh"));
            }
            Path::Helm => {
                let block = doc_block(bundle, "## Helm", "sh");
                sh(env, bundle, &with_plain_http_helm(&block));
            }
            Path::Flux => {
                let objects = doc_block(bundle, "## Flux", "yaml")
                    .replace("$REGISTRY", &bundle.registry)
                    .replace(
                        &format!("  ref: {{tag: {}}}\n", bundle.version),
                        &format!("  ref: {{tag: {}}}\n  insecure: true\n", bundle.version),
                    );
                assert!(objects.contains("insecure: true"), "{objects}");
                sh(
                    env,
                    bundle,
                    &format!(
                        "kubectl -n flux-system create secret generic openflux-cosign-pub --from-file=cosign.pub\n\
                         kubectl apply -f - <<'EOF'\n{objects}EOF\n"
                    ),
                );
            }
        });
        if let Path::Flux = self {
            ready_with_inventory(env, "openflux").await;
            ready_with_inventory(env, "openflux-http-source").await;
        }
        all_available(
            env,
            "openflux-system",
            &["openflux", "openflux-http-source"],
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_keeps_every_custom_resource_and_helm_install_takes_them_up() {
    kept_through(Path::Helm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_of_install_yaml_keeps_every_custom_resource_and_a_new_apply_takes_them_up()
{
    kept_through(Path::Kubectl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flux_pruning_openflux_keeps_every_custom_resource_and_a_new_apply_takes_them_up() {
    kept_through(Path::Flux).await;
}

/// The users' data: what must be the same object after the uninstall and
/// after the reinstall, `kind namespace/name` to uid.
type Objects = BTreeMap<String, String>;

async fn kept_through(path: Path) {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tokio::task::block_in_place(|| release::from_nothing(&env, bundle));
    path.install(&env, bundle).await;
    owned_by_openfluxs_cluster_role(&env).await;

    // The users' data: an HttpSource, its Artifact and export, a
    // Kustomization openflux rewrote to the export, a SourcePolicy letting
    // the namespace deploy from HttpSources.
    let ns = env
        .namespace(&format!("nodes-kept-{}", path.name().to_lowercase()))
        .await;
    let n = ns.name().to_string();
    let policy = format!("kept-{n}");
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "SourcePolicy",
        "metadata": {"name": policy},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}},
                 "allowedKinds": [{"group": "sources.openflux.dev", "kind": "HttpSource"}]}
    }))
    .await
    .expect("a SourcePolicy");
    let value = format!("kept through the uninstall in {n}");
    let url = env
        .fixtures()
        .put_file(
            &format!("{n}/app.yaml"),
            support::configmap_yaml(&value).as_bytes(),
        )
        .expect("serving the manifest");
    env.apply(&json!({
        "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
        "metadata": {"name": "web", "namespace": n},
        "spec": {"url": url, "interval": "1h"}
    }))
    .await
    .expect("applying the HttpSource");
    // Reconciled only when asked (or after a failure, soon): nothing runs
    // it while openflux is uninstalled.
    let consumer = env
        .apply(&json!({
            "apiVersion": KUSTOMIZE, "kind": "Kustomization",
            "metadata": {"name": "web", "namespace": n},
            "spec": {
                "interval": "1h", "retryInterval": "15s", "path": "./", "prune": true,
                "targetNamespace": n,
                "sourceRef": {"apiVersion": HTTP_SOURCE, "kind": "HttpSource", "name": "web"}
            }
        }))
        .await
        .expect("applying the Kustomization (through openflux's webhook)");
    assert!(
        consumer
            .annotations()
            .get(ANNOTATION)
            .is_some_and(|a| a.contains("HttpSource")),
        "the webhook rewrote the reference: {:?}",
        consumer.annotations()
    );
    support::configmap_holds(&env, &n, "app-config", &value, ROLLOUT).await;
    let (reference, revision) = ready_at(&env, &n, "installed", None).await;
    let before = objects(&env, &n, &policy, &reference).await;
    println!(
        "{n}: consumer Ready at {revision}, on {reference}; the data: {}",
        before.keys().cloned().collect::<Vec<_>>().join(", ")
    );

    // Uninstalled as docs/install.md says: the CRDs are all that is left.
    tokio::task::block_in_place(|| release::uninstall_keeping_the_crds(&env, bundle, path.name()));
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let managed = configs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=openflux"))
        .await
        .expect("listing validating webhook configurations");
    assert!(
        managed.items.is_empty(),
        "a validating webhook configuration of openflux's outlived it: {:?}",
        managed
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        objects(&env, &n, &policy, &reference).await,
        before,
        "the uninstall by {} changed the users' data",
        path.name()
    );
    ready_at(&env, &n, "uninstalled", Some((&reference, &revision))).await;
    // Nothing refuses a write of the consumer openflux rewrote: its spec
    // (a server-side dry run, so that it is not reconciled while its
    // source's controller is gone) and its labels.
    let (api, _) = support::dynamic_api(&env.client, KUSTOMIZE, "Kustomization", Some(&n))
        .await
        .expect("the Kustomization API");
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    api.patch(
        "web",
        &dry_run,
        &Patch::Merge(json!({"spec": {"interval": "2h"}})),
    )
    .await
    .expect("editing the rewritten Kustomization's spec with openflux uninstalled");
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"e2e.openflux.dev/edited": "uninstalled"}}})),
    )
    .await
    .expect("editing the rewritten Kustomization with openflux uninstalled");
    println!(
        "{n}: uninstalled by {}: only the CRDs left, the data kept, the consumer Ready at {revision} and editable",
        path.name()
    );

    // Installed again by the same path: the same objects, taken up.
    path.install(&env, bundle).await;
    owned_by_openfluxs_cluster_role(&env).await;
    assert_eq!(
        objects(&env, &n, &policy, &reference).await,
        before,
        "the reinstall by {} changed the users' data",
        path.name()
    );
    ready_at(&env, &n, "reinstalled", Some((&reference, &revision))).await;
    // Live again: the HttpSource fetches, the consumer applies the same
    // revision when asked.
    reconciled(&env, HTTP_SOURCE, "HttpSource", &n).await;
    reconciled(&env, KUSTOMIZE, "Kustomization", &n).await;
    ready_at(&env, &n, "reconciled", Some((&reference, &revision))).await;
    support::configmap_holds(&env, &n, "app-config", &value, ROLLOUT).await;
    println!(
        "{n}: installed again by {}: the same objects, the consumer reconciled at {revision}",
        path.name()
    );

    ns.delete().await;
    env.delete_object(ARTIFACT, "SourcePolicy", "", &policy)
        .await;
    tokio::task::block_in_place(|| release::uninstall(&env, bundle, path.name()));
}

/// openflux's ValidatingWebhookConfiguration, published with its CA
/// bundles, is owned by openflux's ClusterRole (by uid) and nothing else,
/// so that it goes with it.
async fn owned_by_openfluxs_cluster_role(env: &Env) {
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let uid = roles
        .get("openflux")
        .await
        .expect("openflux's ClusterRole")
        .uid()
        .expect("a uid");
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let owners = support::wait_for(
        "openflux to publish its ValidatingWebhookConfiguration with its CA bundle",
        ROLLOUT,
        || async {
            let config = configs.get_opt("openflux").await.ok().flatten()?;
            let webhooks = config.webhooks.as_ref()?;
            let bundled = webhooks.iter().all(|w| {
                let bundle = w.client_config.ca_bundle.as_ref();
                bundle.is_some_and(|b| !b.0.is_empty())
            });
            (!webhooks.is_empty() && bundled).then(|| config.owner_references().to_vec())
        },
    )
    .await;
    let owners: Vec<(&str, &str, &str, &str)> = owners
        .iter()
        .map(|o| {
            (
                o.api_version.as_str(),
                o.kind.as_str(),
                o.name.as_str(),
                o.uid.as_str(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [(
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "openflux",
            uid.as_str()
        )],
        "the validating webhook configuration's owners"
    );
}

/// Waits until the Kustomization `web` of `ns` is Ready and applied;
/// returns its source reference and applied revision, which must be
/// `expected` when given.
async fn ready_at(
    env: &Env,
    ns: &str,
    when: &str,
    expected: Option<(&Value, &str)>,
) -> (Value, String) {
    let (reference, revision) = support::wait_for(
        &format!("the Kustomization web of {ns} Ready ({when})"),
        ROLLOUT,
        || async {
            let ks = env.find(KUSTOMIZE, "Kustomization", ns, "web").await?;
            if !support::is_ready(&ks) {
                return None;
            }
            let revision = field(&ks, "/status/lastAppliedRevision")?.as_str()?;
            let reference = field(&ks, "/spec/sourceRef")?.clone();
            Some((reference, revision.to_string()))
        },
    )
    .await;
    if let Some((reference_then, revision_then)) = expected {
        assert_eq!(
            (&reference, revision.as_str()),
            (reference_then, revision_then),
            "the consumer's source and revision ({when})"
        );
    }
    (reference, revision)
}

/// The users' objects in `ns` and the SourcePolicy `policy`, by uid: the
/// HttpSource, its Artifacts, the export the consumer names (and the
/// revision it holds), the consumer and the SourcePolicy.
async fn objects(env: &Env, ns: &str, policy: &str, reference: &Value) -> Objects {
    let mut seen = Objects::new();
    let mut uid = |what: String, object: Option<kube::api::DynamicObject>| {
        let object = object.unwrap_or_else(|| panic!("{what} is gone"));
        seen.insert(what, object.uid().expect("a uid"));
        object
    };
    uid(
        format!("HttpSource {ns}/web"),
        env.find(HTTP_SOURCE, "HttpSource", ns, "web").await,
    );
    uid(
        format!("Kustomization {ns}/web"),
        env.find(KUSTOMIZE, "Kustomization", ns, "web").await,
    );
    uid(
        format!("SourcePolicy {policy}"),
        env.find(ARTIFACT, "SourcePolicy", "", policy).await,
    );
    let kind = reference["kind"].as_str().expect("the export's kind");
    let name = reference["name"].as_str().expect("the export's name");
    let export = uid(
        format!("{kind} {ns}/{name}"),
        env.find(SOURCE, kind, ns, name).await,
    );
    let exported = field(&export, "/status/artifact/revision")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("the export {kind} {ns}/{name} holds no artifact"))
        .to_string();
    seen.insert(format!("{kind} {ns}/{name} revision"), exported);
    let (artifacts, _) = support::dynamic_api(&env.client, ARTIFACT, "Artifact", Some(ns))
        .await
        .expect("the Artifact API");
    let list = artifacts
        .list(&ListParams::default())
        .await
        .expect("listing Artifacts");
    let mut owned = 0;
    for artifact in list.items {
        if artifact
            .owner_references()
            .iter()
            .any(|o| o.kind == "HttpSource")
        {
            owned += 1;
            seen.insert(
                format!("Artifact {ns}/{}", artifact.name_any()),
                artifact.uid().expect("a uid"),
            );
        }
    }
    assert!(owned > 0, "no Artifact of the HttpSource in {ns}");
    seen
}

/// Asks the object `web` of `ns` to reconcile and waits until it has
/// (`status.lastHandledReconcileAt`) and is Ready.
async fn reconciled(env: &Env, api_version: &str, kind: &str, ns: &str) {
    let token = format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    support::merge_patch(
        &env.client,
        api_version,
        kind,
        ns,
        "web",
        &json!({"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": token}}}),
    )
    .await
    .unwrap_or_else(|e| panic!("asking {kind} {ns}/web to reconcile: {e:#}"));
    support::wait_for(
        &format!("{kind} {ns}/web to reconcile when asked ({token})"),
        ROLLOUT,
        || async {
            let object = env.find(api_version, kind, ns, "web").await?;
            let handled = field(&object, "/status/lastHandledReconcileAt")?.as_str()?;
            (handled == token && support::is_ready(&object)).then_some(())
        },
    )
    .await;
}
