//! openflux upgraded in place: the previous release
//! (`OPENFLUX_PREVIOUS_RELEASE`, e2e/versions.env) installed from its own
//! manifests as its README said, consumers of custom sources live on it,
//! then this build's manifests and image applied over it while admissions
//! keep coming. Counted from the client side: no failed admission, no
//! consumer left on a missing export, Artifacts and exports unchanged.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use kube::ResourceExt;
use openflux_testkit as support;
use serde_json::{json, Value};
use support::{field, Cell, Env};

use super::load::Admissions;
use super::overlay;
use super::{all_available, ROLLOUT};

const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const ARTIFACT: &str = "openflux.dev/v1alpha1";
const GROUP: &str = "upgrade.producer.example";
const CONSUMERS: usize = 3;

fn kubectl(env: &Env, args: &[&str]) {
    let out = env.run_kubectl(args, None);
    assert!(
        out.status.success(),
        "kubectl {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

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

/// A serving certificate made by the previous release's `openflux certs`,
/// in the Secret its Deployment mounts.
fn make_certs(env: &Env, previous: &support::release::Previous, work: &std::path::Path) {
    let tls = work.join("webhook-tls");
    let certs = std::process::Command::new(&previous.binary)
        .args(["certs", "--out-dir"])
        .arg(&tls)
        .args(["--dns-name", "openflux-webhook.openflux-system.svc"])
        .output()
        .expect("running the previous release's openflux certs");
    assert!(
        certs.status.success(),
        "openflux certs: {}",
        String::from_utf8_lossy(&certs.stderr)
    );
    let file = |name: &str| format!("--from-file={}", tls.join(name).display());
    kubectl(
        env,
        &[
            "-n",
            "openflux-system",
            "create",
            "secret",
            "generic",
            "openflux-webhook-tls",
            &file("ca.crt"),
            &file("tls.crt"),
            &file("tls.key"),
        ],
    );
}

async fn configmap_holds(env: &Env, ns: &str, name: &str, value: &str) {
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns);
    support::wait_for(
        &format!("ConfigMap {name} = {value:?}"),
        ROLLOUT,
        || async {
            let cm = cms.get_opt(name).await.ok().flatten()?;
            (cm.data.unwrap_or_default().get("value").map(String::as_str) == Some(value))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_from_the_previous_release_fails_no_admission_and_keeps_every_export() {
    let env = support::cell(Cell::Nodes).await;
    super::INSTALLED.store(false, Ordering::SeqCst);
    tokio::task::block_in_place(|| support::nodes::uninstall(&env));
    let current = tokio::task::block_in_place(|| support::release::current_image(&env));
    let previous = tokio::task::block_in_place(|| support::release::previous(&env));
    println!(
        "previous release {} ({}), current build {current}",
        previous.commit, previous.image
    );

    // The previous release, as its README said: its namespace, a serving
    // certificate made by `openflux certs` in a Secret when its Deployment
    // mounts one (releases that keep their certificates themselves need
    // nothing), then the manifests with its image.
    let work = tempfile::tempdir().expect("a temp dir");
    kubectl(
        &env,
        &[
            "apply",
            "-f",
            &previous
                .tree
                .join("manifests/namespace.yaml")
                .display()
                .to_string(),
        ],
    );
    let old_deployment = std::fs::read_to_string(previous.tree.join("manifests/deployment.yaml"))
        .expect("the previous release's Deployment");
    if !old_deployment.contains("--webhook-cert-secret") {
        make_certs(&env, &previous, work.path());
    }
    let old_overlay = work.path().join("previous");
    overlay::write(
        &old_overlay,
        &previous.tree.join("manifests"),
        &previous.image,
        "",
    );
    kubectl(&env, &["apply", "-k", &old_overlay.display().to_string()]);
    all_available(&env, "openflux-system", &["openflux"]).await;

    // Live consumers of a producer's own kind.
    support::install_test_source_crd(&env, GROUP).await;
    support::wait_established(&env, &[&format!("testsources.{GROUP}")]).await;
    let ns = env.namespace("nodes-upgrade").await;
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
        configmap_holds(&env, &n, &format!("cm-{i}"), "before").await;
    }
    let before = snapshot(&env, &n).await;
    for (consumer, (reference, artifact, _)) in &before {
        assert!(
            !artifact.is_null(),
            "{consumer} names {reference}, which has no artifact before the upgrade"
        );
    }

    // The upgrade: this build's manifests and image over the previous ones,
    // under admissions naming the custom source.
    let reference = json!({"apiVersion": source_api, "kind": "TestSource", "name": "s0"});
    let admissions = Admissions::naming(&env, &n, reference, 2, Duration::from_millis(100)).await;
    support::wait_for(
        "admissions answered before the upgrade",
        ROLLOUT,
        || async { (admissions.answered() >= 10).then_some(()) },
    )
    .await;
    let new_overlay = work.path().join("current");
    overlay::write(
        &new_overlay,
        &support::workspace_root().join("manifests"),
        &current,
        "",
    );
    let started = Instant::now();
    kubectl(&env, &["apply", "-k", &new_overlay.display().to_string()]);
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

    let after = snapshot(&env, &n).await;
    println!(
        "upgrade {} -> this build in {upgraded_in:?}: admissions {} answered, {} failed",
        &previous.commit[..12],
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
    configmap_holds(&env, &n, "cm-0", "after").await;

    // This build's validating webhook is in force: openflux published it
    // with its CA bundle, and a consumer naming the export directly is
    // judged by the tenant policy.
    validating_webhook_in_force(&env, &n, &before["k0"].0).await;
    ns.delete().await;
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
