//! openflux installed by Flux itself, from the OCI artifact
//! `make manifests-artifact` packs, as the contributors' guide's "Install with Flux from a clone"
//! says: an OCIRepository and two Flux Kustomizations (`wait: true`), the
//! second depending on the first.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use openflux_testkit as support;
use serde_json::Value;
use support::{field, Cell, Env};

use super::{custom_source_flows, ROLLOUT};

const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";

/// The Flux Kustomization `name` in flux-system: Ready, and its inventory.
pub(super) async fn ready_with_inventory(env: &Env, name: &str) -> Vec<String> {
    support::wait_for(
        &format!("the Flux Kustomization {name} Ready"),
        ROLLOUT,
        || async {
            let ks = env
                .find(KUSTOMIZE, "Kustomization", "flux-system", name)
                .await?;
            let ready = field(&ks, "/status/conditions")?
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if !ready {
                return None;
            }
            let entries = field(&ks, "/status/inventory/entries")?.as_array()?;
            Some(
                entries
                    .iter()
                    .filter_map(|e| e.get("id").and_then(Value::as_str).map(str::to_string))
                    .collect(),
            )
        },
    )
    .await
}

/// From nothing (openflux uninstalled), the guide's "Install with Flux from a clone"
/// block installs openflux and the HttpSource controller through Flux's
/// own Pods: both Flux Kustomizations become Ready with openflux's objects
/// in their inventories, and a custom source then flows into an unchanged
/// Kustomization through that installation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_by_flux_from_its_oci_artifact_openflux_serves_a_custom_source() {
    let env = support::cell(Cell::Nodes).await;
    super::INSTALLED.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::task::block_in_place(|| support::nodes::uninstall(&env));
    let out =
        tokio::task::block_in_place(|| support::nodes::install_with_flux_as_the_guide_says(&env));
    println!(
        "the guide's install-with-Flux block:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let openflux = ready_with_inventory(&env, "openflux").await;
    for id in [
        "openflux-system_openflux_apps_Deployment",
        "_openflux_admissionregistration.k8s.io_MutatingWebhookConfiguration",
        "_artifacts.openflux.dev_apiextensions.k8s.io_CustomResourceDefinition",
    ] {
        assert!(
            openflux.iter().any(|e| e == id),
            "the Flux Kustomization openflux does not hold {id}: {openflux:?}"
        );
    }
    let http_source = ready_with_inventory(&env, "openflux-http-source").await;
    assert!(
        http_source
            .iter()
            .any(|e| e == "openflux-system_openflux-http-source_apps_Deployment"),
        "the Flux Kustomization openflux-http-source does not hold the HttpSource controller: {http_source:?}"
    );
    // Flux applied what the artifact pins: images by digest from the cell's
    // registry.
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "openflux-system");
    let deployment = deployments
        .get("openflux")
        .await
        .expect("openflux's Deployment");
    let image = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .unwrap_or_default();
    let registry = support::nodes::registry(&env);
    assert!(
        image.starts_with(&format!("{registry}/openflux@sha256:")),
        "openflux's image as installed by Flux: {image}"
    );
    let labels = deployment.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("kustomize.toolkit.fluxcd.io/name")
            .map(String::as_str),
        Some("openflux"),
        "openflux's Deployment is managed by the Flux Kustomization openflux: {labels:?}"
    );
    let kind = custom_source_flows(&env, "nodes-by-flux").await;
    assert_eq!(
        kind, "OCIRepository",
        "a shadow with `flux install`'s defaults"
    );
}
