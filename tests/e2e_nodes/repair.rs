//! A broken openflux repaired through Flux: openflux installed by the
//! guide's "Install with Flux from a clone" block, a tenant's Flux Kustomization of a
//! custom source that `dependsOn` it, then a release of openflux whose image
//! cannot start pushed and taken by the same OCIRepository. While it is
//! broken the tenant's new content is not applied (its dependency is not
//! Ready); moving the tag back repairs openflux through its own
//! Kustomization, and the tenant then applies what it held back.

use std::sync::atomic::Ordering;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use openflux_testkit as support;
use serde_json::{json, Value};
use support::{field, Cell, Env};

use super::{all_available, HTTP_SOURCE, KUSTOMIZE, ROLLOUT};

const OCI_REPOSITORY: &str = "source.toolkit.fluxcd.io/v1";

/// The Ready condition (status, reason) of the Flux Kustomization `name`.
async fn ready(env: &Env, ns: &str, name: &str) -> Option<(String, String)> {
    let ks = env.find(KUSTOMIZE, "Kustomization", ns, name).await?;
    let conditions = field(&ks, "/status/conditions")?.as_array()?.clone();
    let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
    Some((
        ready["status"].as_str()?.to_string(),
        ready["reason"].as_str()?.to_string(),
    ))
}

async fn merge(env: &Env, api_version: &str, kind: &str, ns: &str, name: &str, patch: Value) {
    let (api, _) = support::dynamic_api(&env.client, api_version, kind, Some(ns))
        .await
        .expect("discovery");
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|e| panic!("patching {kind} {ns}/{name}: {e}"));
}

async fn configmap_value(env: &Env, ns: &str) -> Option<String> {
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns);
    let cm = cms.get_opt("app-config").await.ok().flatten()?;
    cm.data?.get("value").cloned()
}

/// Packs this build's manifests pinning an openflux image that does not
/// exist and pushes them as `openflux-manifests:<tag>`.
fn push_broken_release(env: &Env, http_source_image: &str, tag: &str) {
    let registry = support::nodes::registry(env).to_string();
    let missing = format!("{registry}/openflux@sha256:{}", "0".repeat(64));
    let work = tempfile::tempdir().expect("a temp dir");
    let archive = work.path().join("broken.oci.tar");
    let root = support::workspace_root();
    let packed = std::process::Command::new(root.join("images/manifests"))
        .args([&missing, http_source_image])
        .env("ARTIFACT_OUT", &archive)
        .current_dir(&root)
        .output()
        .expect("running images/manifests");
    assert!(
        packed.status.success(),
        "images/manifests: {}",
        String::from_utf8_lossy(&packed.stderr)
    );
    let pushed = std::process::Command::new("skopeo")
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("docker://{registry}/openflux-manifests:{tag}"))
        .output()
        .expect("running skopeo");
    assert!(
        pushed.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&pushed.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_openflux_is_repaired_through_flux_while_its_dependents_wait() {
    let env = support::cell(Cell::Nodes).await;
    super::INSTALLED.store(false, Ordering::SeqCst);
    tokio::task::block_in_place(|| support::nodes::uninstall(&env));
    let out =
        tokio::task::block_in_place(|| support::nodes::install_with_flux_as_the_guide_says(&env));
    assert!(out.status.success(), "the install-with-Flux block failed");
    all_available(
        &env,
        "openflux-system",
        &["openflux", "openflux-http-source"],
    )
    .await;
    // A short health-check timeout, as docs/install.md advises, so the broken
    // revision's checks end within the test.
    merge(
        &env,
        KUSTOMIZE,
        "Kustomization",
        "flux-system",
        "openflux",
        json!({"spec": {"timeout": "1m"}}),
    )
    .await;
    let good_tag = env
        .find(OCI_REPOSITORY, "OCIRepository", "flux-system", "openflux")
        .await
        .and_then(|o| {
            field(&o, "/spec/ref/tag")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .expect("the OCIRepository openflux's tag");

    // A tenant: an HttpSource and a Flux Kustomization of it that waits for
    // openflux.
    let ns = env.namespace("nodes-repair").await;
    let n = ns.name().to_string();
    let fixtures = env.fixtures();
    let url = |value: &str| {
        fixtures
            .put_file(
                &format!("{n}/{value}/app.yaml"),
                support::configmap_yaml(value).as_bytes(),
            )
            .expect("serving the manifest")
    };
    env.apply(&json!({
        "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
        "metadata": {"name": "web", "namespace": n},
        "spec": {"url": url("before"), "interval": "1m"}
    }))
    .await
    .expect("the HttpSource");
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "tenant", "namespace": n},
        "spec": {
            "interval": "1m", "path": "./", "prune": true, "targetNamespace": n,
            "dependsOn": [{"name": "openflux", "namespace": "flux-system"}],
            "sourceRef": {"apiVersion": HTTP_SOURCE, "kind": "HttpSource", "name": "web"}
        }
    }))
    .await
    .expect("the tenant's Kustomization (through openflux's webhook)");
    support::wait_for("the tenant's content applied", ROLLOUT, || async {
        (configmap_value(&env, &n).await.as_deref() == Some("before")).then_some(())
    })
    .await;

    // Break openflux: a release whose image cannot be pulled.
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "openflux-system");
    let http_image = deployments
        .get("openflux-http-source")
        .await
        .ok()
        .and_then(|d| d.spec?.template.spec?.containers.into_iter().next()?.image)
        .expect("the HttpSource controller's image");
    tokio::task::block_in_place(|| push_broken_release(&env, &http_image, "broken"));
    merge(
        &env,
        OCI_REPOSITORY,
        "OCIRepository",
        "flux-system",
        "openflux",
        json!({"spec": {"ref": {"tag": "broken"}}}),
    )
    .await;
    support::wait_for("openflux's Kustomization not Ready", ROLLOUT, || async {
        let (status, reason) = ready(&env, "flux-system", "openflux").await?;
        (status == "False").then_some(reason)
    })
    .await;

    // The tenant's new content arrives while openflux is broken: held back.
    merge(
        &env,
        HTTP_SOURCE,
        "HttpSource",
        &n,
        "web",
        json!({"spec": {"url": url("after")}}),
    )
    .await;
    let held = support::wait_for(
        "the tenant held back by its dependency",
        ROLLOUT,
        || async {
            let (status, reason) = ready(&env, &n, "tenant").await?;
            (status == "False" && reason == "DependencyNotReady").then_some(reason)
        },
    )
    .await;
    assert_eq!(
        configmap_value(&env, &n).await.as_deref(),
        Some("before"),
        "the tenant applied new content while openflux was broken ({held})"
    );

    // Repair through the same OCIRepository and Kustomization.
    merge(
        &env,
        OCI_REPOSITORY,
        "OCIRepository",
        "flux-system",
        "openflux",
        json!({"spec": {"ref": {"tag": good_tag}}}),
    )
    .await;
    support::wait_for("openflux's Kustomization Ready again", ROLLOUT, || async {
        let (status, _) = ready(&env, "flux-system", "openflux").await?;
        (status == "True").then_some(())
    })
    .await;
    support::wait_for(
        "the tenant's held-back content applied",
        ROLLOUT,
        || async { (configmap_value(&env, &n).await.as_deref() == Some("after")).then_some(()) },
    )
    .await;
    ns.delete().await;
}
