//! openflux upgraded in place from its previous release
//! (`OPENFLUX_PREVIOUS_RELEASE`, e2e/versions.env) by each path a release
//! is installed with: the previous release's bundle, made and published by
//! its own `make release` and `make publish`, installed as its
//! docs/install.md said (`kubectl apply -f install.yaml`, or `helm
//! install`), consumers of custom sources live on it, then this release's
//! bundle applied over it as this docs/install.md's "Upgrade" says, while
//! admissions keep coming. Counted from the client side: no failed
//! admission, no consumer left on a missing export, Artifacts and exports
//! unchanged; then the path's uninstall leaves nothing of openflux. The
//! version moves: before the upgrade every openflux Pod's `openflux
//! --version` names the previous release's version and commit and the
//! Deployment carries the version label (`app.kubernetes.io/version`) its
//! install.yaml gave it; after it, this release's version and commit, and
//! this release's version as the label.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::ResourceExt;
use openflux_testkit as support;
use serde_json::{json, Value};
use support::release::Bundle;
use support::{field, Cell, Env};

use super::load::Admissions;
use super::release;
use super::{all_available, ROLLOUT};

const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const ARTIFACT: &str = "openflux.dev/v1alpha1";
const GROUP: &str = "upgrade.producer.example";
const CONSUMERS: usize = 3;

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: {value:?}\n"
    )
}

/// The stored reference of Kustomization `name`, and the export it names'
/// `status.artifact` (None when that export does not exist).
async fn consumer_and_export(env: &Env, ns: &str, name: &str) -> (Value, Option<Value>) {
    let ks = env
        .find(KUSTOMIZE, "Kustomization", ns, name)
        .await
        .expect("a consumer");
    let reference = field(&ks, "/spec/sourceRef")
        .cloned()
        .unwrap_or(Value::Null);
    let kind = reference["kind"].as_str().unwrap_or_default().to_string();
    let api_version = reference["apiVersion"]
        .as_str()
        .unwrap_or("source.toolkit.fluxcd.io/v1")
        .to_string();
    let export_name = reference["name"].as_str().unwrap_or_default().to_string();
    let export = env.find(&api_version, &kind, ns, &export_name).await;
    let artifact = export.and_then(|e| field(&e, "/status/artifact").cloned());
    (reference, artifact)
}

/// What a consumer deploys: the reference, the export's artifact without
/// its timestamp and path, the Artifact's spec.
async fn snapshot(env: &Env, ns: &str) -> BTreeMap<String, (Value, Value, Value)> {
    let mut seen = BTreeMap::new();
    for i in 0..CONSUMERS {
        let (reference, artifact) = consumer_and_export(env, ns, &format!("k{i}")).await;
        let mut artifact = artifact.unwrap_or(Value::Null);
        if let Some(a) = artifact.as_object_mut() {
            // Its path names the export, whose name a release may change
            // (what is fetched is the URL, and the digest says what it is).
            a.remove("lastUpdateTime");
            a.remove("path");
        }
        let spec = env
            .find(ARTIFACT, "Artifact", ns, &format!("s{i}"))
            .await
            .and_then(|a| field(&a, "/spec").cloned())
            .unwrap_or(Value::Null);
        seen.insert(format!("k{i}"), (reference, artifact, spec));
    }
    seen
}

/// How a release is installed, upgraded and removed: the install block of
/// docs/install.md (the previous release's), its upgrade block (this
/// release's) and the path's uninstall.
#[derive(Clone, Copy)]
enum Path {
    Kubectl,
    Helm,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Kubectl => "kubectl",
            Path::Helm => "helm",
        }
    }

    /// Runs docs/install.md's block under `heading` of `bundle`'s tree
    /// with `bundle` (helm told that the cell's registry speaks plain HTTP).
    fn run(self, env: &Env, bundle: &Bundle, heading: &str) {
        let block = release::doc_block(bundle, heading, "sh");
        let script = match self {
            Path::Kubectl => block,
            Path::Helm => release::with_plain_http_helm(&block),
        };
        release::sh(env, bundle, &script);
    }

    fn install(self, env: &Env, previous: &Bundle) {
        let heading = match self {
            Path::Kubectl => "## kubectl",
            Path::Helm => "## Helm",
        };
        self.run(env, previous, heading);
    }

    fn upgrade(self, env: &Env, current: &Bundle) {
        let heading = match self {
            Path::Kubectl => "### Upgrade with kubectl",
            Path::Helm => "### Upgrade with Helm",
        };
        self.run(env, current, heading);
    }

    fn uninstall(self, env: &Env, current: &Bundle) {
        let path = match self {
            Path::Kubectl => "kubectl",
            Path::Helm => "Helm",
        };
        release::uninstall(env, current, path);
    }
}

/// The openflux image `bundle`'s install.yaml runs.
fn image_of(bundle: &Bundle) -> String {
    let path = bundle.dir.join("install.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let wanted = format!("{}/openflux@sha256:", bundle.registry);
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .find(|image| image.starts_with(&wanted))
        .unwrap_or_else(|| panic!("{} runs no {wanted}...", path.display()))
        .to_string()
}

/// The label `app.kubernetes.io/version` that `bundle`'s install.yaml
/// gives openflux's Deployment (releases before 0.2.0 gave none).
fn version_label_of(bundle: &Bundle) -> Option<String> {
    let path = bundle.dir.join("install.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let deployment = serde_yaml_ng::Deserializer::from_str(&text)
        .filter_map(|doc| serde::Deserialize::deserialize(doc).ok())
        .find(|o: &Value| o["kind"] == "Deployment" && o["metadata"]["name"] == "openflux")
        .unwrap_or_else(|| panic!("{} has no Deployment openflux", path.display()));
    deployment["metadata"]["labels"][VERSION_LABEL]
        .as_str()
        .map(str::to_string)
}

const VERSION_LABEL: &str = "app.kubernetes.io/version";

/// What the cluster says of the openflux it runs: the label
/// `app.kubernetes.io/version` of its Deployment, and `openflux --version`
/// as each of its live Pods answers it (`kubectl exec`), deduplicated.
async fn running_version(env: &Env, bundle: &Bundle) -> (Option<String>, Vec<String>) {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "openflux-system");
    let deployment = deployments
        .get("openflux")
        .await
        .expect("openflux's Deployment");
    let label = deployment.labels().get(VERSION_LABEL).cloned();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "openflux-system");
    let listed = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=openflux"))
        .await
        .expect("openflux's Pods");
    let mut versions: Vec<String> = listed
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let script = format!(
                "kubectl -n openflux-system exec {} -c openflux -- /openflux --version\n",
                p.name_any()
            );
            let out = tokio::task::block_in_place(|| release::sh(env, bundle, &script));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .collect();
    assert!(!versions.is_empty(), "no live openflux Pod");
    versions.sort();
    versions.dedup();
    (label, versions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_with_kubectl_from_the_previous_release_fails_no_admission_and_keeps_every_export(
) {
    upgrade_by(Path::Kubectl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_with_helm_from_the_previous_release_fails_no_admission_and_keeps_every_export() {
    upgrade_by(Path::Helm).await;
}

async fn upgrade_by(path: Path) {
    let env = support::cell(Cell::Nodes).await;
    let previous = tokio::task::block_in_place(|| support::release::previous_bundle(&env));
    let current_bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    let current = image_of(current_bundle);
    println!(
        "previous release {} {} ({}), this release {} ({current})",
        previous.version,
        previous.tree.display(),
        image_of(previous),
        current_bundle.version
    );
    assert_ne!(
        previous.version, current_bundle.version,
        "this release has the previous release's version: bump it (Cargo.toml, CHANGELOG.md)"
    );
    assert_eq!(
        version_label_of(current_bundle).as_deref(),
        Some(current_bundle.version.as_str()),
        "this release's install.yaml labels openflux's Deployment with its version"
    );
    tokio::task::block_in_place(|| release::verified(&env, current_bundle));
    tokio::task::block_in_place(|| release::from_nothing(&env, current_bundle));

    // The previous release, as its docs said.
    tokio::task::block_in_place(|| path.install(&env, previous));
    all_available(
        &env,
        "openflux-system",
        &["openflux", "openflux-http-source"],
    )
    .await;
    let (label, versions) = running_version(&env, previous).await;
    assert_eq!(
        versions,
        [format!(
            "openflux {} (commit {})",
            previous.version, previous.commit
        )],
        "before the upgrade openflux is the previous release"
    );
    assert_eq!(
        label,
        version_label_of(previous),
        "before the upgrade the Deployment has the previous release's label"
    );
    println!("before the upgrade: {versions:?}, {VERSION_LABEL}={label:?}");

    // Live consumers of a producer's own kind.
    support::install_test_source_crd(&env, GROUP).await;
    support::wait_established(&env, &[&format!("testsources.{GROUP}")]).await;
    let ns = env
        .namespace(&format!("nodes-upgrade-{}", path.name()))
        .await;
    let n = ns.name().to_string();
    let source_api = format!("{GROUP}/v1");
    for i in 0..CONSUMERS {
        let spec = support::openflux::publish(
            env.fixtures(),
            &n,
            &format!("s{i}"),
            "1",
            &[("app.yaml", &configmap(&format!("cm-{i}"), "before"))],
        );
        let source = env
            .apply(&json!({
                "apiVersion": source_api, "kind": "TestSource",
                "metadata": {"name": format!("s{i}"), "namespace": n},
                "spec": {"anything": "goes"}
            }))
            .await
            .expect("a custom source");
        env.apply(&json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": format!("s{i}"), "namespace": n, "ownerReferences": [{
                "apiVersion": source_api, "kind": "TestSource", "name": format!("s{i}"),
                "uid": source.uid().expect("a uid"), "controller": true
            }]},
            "spec": spec,
        }))
        .await
        .expect("the custom source's Artifact");
        env.apply(&json!({
            "apiVersion": KUSTOMIZE, "kind": "Kustomization",
            "metadata": {"name": format!("k{i}"), "namespace": n},
            "spec": {"interval": "10m", "path": "./", "prune": true, "targetNamespace": n,
                     "sourceRef": {"apiVersion": source_api, "kind": "TestSource", "name": format!("s{i}")}}
        }))
        .await
        .expect("a consumer (through the previous release's webhook)");
    }
    for i in 0..CONSUMERS {
        support::configmap_holds(&env, &n, &format!("cm-{i}"), "before", ROLLOUT).await;
    }
    let before = snapshot(&env, &n).await;
    for (consumer, (reference, artifact, _)) in &before {
        assert!(
            !artifact.is_null(),
            "{consumer} names {reference}, which has no artifact before the upgrade"
        );
    }

    // The upgrade: this release's bundle over the previous one, as
    // docs/install.md says, under admissions naming the custom source.
    let reference = json!({"apiVersion": source_api, "kind": "TestSource", "name": "s0"});
    let admissions = Admissions::naming(&env, &n, reference, 2, Duration::from_millis(100)).await;
    support::wait_for(
        "admissions answered before the upgrade",
        ROLLOUT,
        || async { (admissions.answered() >= 10).then_some(()) },
    )
    .await;
    let started = Instant::now();
    tokio::task::block_in_place(|| path.upgrade(&env, current_bundle));
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "openflux-system");
    support::wait_for("openflux rolled to this build", ROLLOUT, || async {
        let d = deployments.get("openflux").await.ok()?;
        let status = d.status.as_ref()?;
        let image = d
            .spec
            .as_ref()?
            .template
            .spec
            .as_ref()?
            .containers
            .first()?
            .image
            .clone()?;
        (image == current
            && status.observed_generation == d.metadata.generation
            && status.updated_replicas == status.replicas
            && status.ready_replicas == status.replicas
            && status.replicas == d.spec.as_ref()?.replicas)
            .then_some(())
    })
    .await;
    super::faults::settled(&env).await;
    let upgraded_in = started.elapsed();
    let tally = admissions.stop().await;
    let (label, versions) = running_version(&env, current_bundle).await;
    assert_eq!(
        versions,
        [format!(
            "openflux {} (commit {})",
            current_bundle.version, current_bundle.commit
        )],
        "after the upgrade openflux is this release"
    );
    assert_eq!(
        label.as_deref(),
        Some(current_bundle.version.as_str()),
        "after the upgrade the Deployment has this release's label"
    );
    println!("after the upgrade: {versions:?}, {VERSION_LABEL}={label:?}");

    let after = snapshot(&env, &n).await;
    println!(
        "upgrade with {} -> this release in {upgraded_in:?}: admissions {} answered, {} failed",
        path.name(),
        tally.answered,
        tally.failures.len()
    );
    tally.assert_none_failed("the upgrade");
    for (consumer, (reference, artifact, spec)) in &after {
        let (_, old_artifact, old_spec) = &before[consumer];
        assert!(
            !artifact.is_null(),
            "after the upgrade {consumer} names {reference}, which does not exist or has no artifact"
        );
        assert_eq!(
            artifact, old_artifact,
            "the artifact {consumer} deploys changed in the upgrade"
        );
        assert_eq!(
            spec, old_spec,
            "the Artifact of {consumer} changed in the upgrade"
        );
    }

    // Consumers the previous release pointed at an export of its naming
    // are moved to this build's names, and an export left behind goes once
    // nothing refers to it.
    for i in 0..CONSUMERS {
        let name =
            openflux::names::identity::source_export_name(GROUP, "TestSource", &format!("s{i}"));
        let (consumer, old) = (format!("k{i}"), before[&format!("k{i}")].0.clone());
        support::wait_for(
            &format!("{consumer} pointed at {name}"),
            ROLLOUT,
            || async {
                let (reference, artifact) = consumer_and_export(&env, &n, &consumer).await;
                (reference["name"] == name.as_str() && artifact.is_some()).then_some(())
            },
        )
        .await;
        if old["name"] != name.as_str() {
            let (kind, old_name) = (
                old["kind"].as_str().unwrap_or_default(),
                old["name"].as_str().unwrap_or_default(),
            );
            support::wait_for(&format!("{kind} {old_name} deleted"), ROLLOUT, || async {
                env.find(
                    old["apiVersion"]
                        .as_str()
                        .unwrap_or("source.toolkit.fluxcd.io/v1"),
                    kind,
                    &n,
                    old_name,
                )
                .await
                .is_none()
                .then_some(())
            })
            .await;
        }
    }

    // This build's controllers carry on: a new revision reaches its consumer.
    let spec = support::openflux::publish(
        env.fixtures(),
        &n,
        "s0",
        "2",
        &[("app.yaml", &configmap("cm-0", "after"))],
    );
    support::merge_patch(
        &env.client,
        ARTIFACT,
        "Artifact",
        &n,
        "s0",
        &json!({"spec": spec}),
    )
    .await
    .expect("a new revision of s0");
    support::configmap_holds(&env, &n, "cm-0", "after", ROLLOUT).await;

    // This build's validating webhook is in force: openflux published it
    // with its CA bundle, and a consumer naming the export directly is
    // judged by the tenant policy.
    validating_webhook_in_force(&env, &n, &before["k0"].0).await;
    ns.delete().await;
    tokio::task::block_in_place(|| {
        path.uninstall(&env, current_bundle);
        let left = release::left(&env, previous);
        assert!(
            left.is_empty(),
            "after the uninstall, objects of the previous release's install.yaml are left: {left:?}"
        );
    });
}

/// A server-side dry-run create of a Kustomization in `ns` naming
/// `source_ref`: the API server's message when it is refused.
async fn refusal(env: &Env, ns: &str, source_ref: &Value) -> Option<String> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "direct", "namespace": ns},
        "spec": {"interval": "10m", "prune": true, "path": "./", "sourceRef": source_ref}
    }))
    .expect("a Kustomization");
    let (api, _) = support::dynamic_api(&env.client, KUSTOMIZE, "Kustomization", Some(ns))
        .await
        .expect("discovery");
    let dry_run = PostParams {
        dry_run: true,
        field_manager: None,
    };
    match api.create(&dry_run, &object).await {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

async fn validating_webhook_in_force(env: &Env, ns: &str, export: &Value) {
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let config = support::wait_for(
        "openflux to publish its ValidatingWebhookConfiguration with its CA bundle",
        ROLLOUT,
        || async {
            let config = configs.get_opt("openflux").await.ok().flatten()?;
            let webhooks = config.webhooks.as_ref()?;
            let bundled = webhooks.iter().all(|w| {
                let bundle = w.client_config.ca_bundle.as_ref();
                bundle.is_some_and(|b| !b.0.is_empty())
            });
            (!webhooks.is_empty() && bundled).then_some(config)
        },
    )
    .await;
    for webhook in config.webhooks.iter().flatten() {
        let service = webhook.client_config.service.as_ref().expect("a Service");
        assert_eq!(
            (service.name.as_str(), service.port),
            ("openflux-webhook", Some(8443)),
            "{} calls the Service's validate port",
            webhook.name
        );
    }
    let policy = format!("upgrade-{ns}");
    env.apply(&json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "SourcePolicy",
        "metadata": {"name": policy},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "allowedKinds": [{"group": "other.producer.example", "kind": "Elsewhere"}]}
    }))
    .await
    .expect("a SourcePolicy");
    let denied = support::wait_for(
        "a direct reference to the export denied by the validating webhook",
        ROLLOUT,
        || async {
            refusal(env, ns, export).await.filter(|m| {
                m.contains("kustomizations.validate.openflux.dev") && m.contains(&policy)
            })
        },
    )
    .await;
    println!("direct reference after the upgrade: {denied}");
    let (policies, _) =
        support::dynamic_api(&env.client, "openflux.dev/v1alpha1", "SourcePolicy", None)
            .await
            .expect("the SourcePolicy API");
    policies
        .delete(&policy, &Default::default())
        .await
        .expect("deleting the SourcePolicy");
}
