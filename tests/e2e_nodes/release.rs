//! openflux installed from its release, as docs/install.md says: this tree
//! released (`make release`) and published to the cell's registry (`make
//! publish`, see [`support::release::published_bundle`]), then each of the
//! three install paths from nothing (`kubectl apply -f install.yaml`, `helm
//! install` from the OCI chart, Flux's `OCIRepository` with `verify` and
//! two Kustomizations), a custom source run through an unchanged
//! Kustomization on each, and each path's uninstall, after which none of
//! the objects install.yaml lists, nor the webhook configuration openflux
//! writes at run time, is left.

use std::process::{Command, Output, Stdio};

use openflux_testkit as support;
use support::release::Bundle;
use support::{field, Cell, Env};

use super::flux_install::ready_with_inventory;
use super::{custom_source_flows, ROLLOUT};

const INSTALL_DOC: &str = "docs/install.md";
const SOURCE: &str = "source.toolkit.fluxcd.io/v1";

/// The first `lang` block of `heading` in the docs/install.md of the tree
/// the bundle was released from, the version placeholder `X.Y.Z` replaced
/// by the bundle's.
pub(super) fn doc_block(bundle: &Bundle, heading: &str, lang: &str) -> String {
    let path = bundle.tree.join(INSTALL_DOC);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    support::nodes::block_of(INSTALL_DOC, &text, heading, lang)
        .unwrap_or_else(|e| panic!("{e}"))
        .replace("X.Y.Z", &bundle.version)
}

/// Runs `script` with bash (`-euo pipefail`) in the bundle's directory:
/// `kubectl` the cell's, `helm` the release's, `REGISTRY` the bundle's.
pub(super) fn sh(env: &Env, bundle: &Bundle, script: &str) -> Output {
    let kubectl = support::nodes::var(env, "OPENFLUX_E2E_KUBECTL");
    let dirs = [
        std::path::Path::new(kubectl)
            .parent()
            .expect("kubectl's dir"),
        bundle.helm.parent().expect("helm's dir"),
    ];
    let path = std::env::join_paths(dirs.iter().map(|d| d.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(&bundle.dir)
        .env(
            "KUBECONFIG",
            env.kubeconfig.as_ref().expect("the cell's kubeconfig"),
        )
        .env("REGISTRY", &bundle.registry)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "failed ({}):\n{script}\n----- stdout\n{}\n----- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// docs/install.md's step 3 of "Uninstall" for kubectl.
pub(super) const UNINSTALL_KUBECTL: &str =
    "kubectl delete -f install.yaml --ignore-not-found --wait=true --timeout=180s\n";

/// docs/install.md's step 3 of "Uninstall" for Helm.
pub(super) const UNINSTALL_HELM: &str =
    "helm uninstall openflux -n openflux-system --wait --timeout 180s\n\
     kubectl delete namespace openflux-system --ignore-not-found --wait=true --timeout=180s\n";

/// `block` with helm told that the cell's registry speaks plain HTTP, the
/// block itself run as written.
pub(super) fn with_plain_http_helm(block: &str) -> String {
    format!("helm() {{ command helm \"$@\" --plain-http; }}\n{block}")
}

/// What of openflux is on the cluster: every object of install.yaml that
/// exists, and the webhook configurations, which openflux also writes at
/// run time.
pub(super) fn left(env: &Env, bundle: &Bundle) -> Vec<String> {
    let out = sh(
        env,
        bundle,
        "kubectl get -f install.yaml --ignore-not-found -o name\n\
         kubectl get mutatingwebhookconfiguration,validatingwebhookconfiguration \
         --field-selector metadata.name=openflux -o name\n",
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// From nothing: the shared installation removed, nothing of openflux left.
pub(super) fn from_nothing(env: &Env, bundle: &Bundle) {
    super::INSTALLED.store(false, std::sync::atomic::Ordering::SeqCst);
    support::nodes::uninstall(env);
    let left = left(env, bundle);
    assert!(left.is_empty(), "before the install: {left:?}");
}

/// Uninstalled as docs/install.md's "Uninstall" says for the path whose
/// removal is `remove` (step 3): openflux stopped and its webhook
/// configurations removed, the path's objects removed, the validating
/// configuration deleted again; nothing is left.
pub(super) fn uninstall(env: &Env, bundle: &Bundle, stop: bool, remove: &str) {
    if stop {
        sh(
            env,
            bundle,
            "kubectl -n openflux-system scale deployment -l app.kubernetes.io/name=openflux --replicas=0\n\
             kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration openflux\n",
        );
    }
    sh(env, bundle, remove);
    // What is deleted in the background (the namespace, whose content goes
    // first) is gone before anything is counted as left.
    sh(
        env,
        bundle,
        "kubectl delete validatingwebhookconfiguration openflux --ignore-not-found\n\
         kubectl wait --for=delete namespace/openflux-system --timeout=180s\n",
    );
    let left = left(env, bundle);
    assert!(
        left.is_empty(),
        "after the uninstall ({remove:?}) these are left: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_with_kubectl_from_install_yaml_then_uninstalled_to_nothing() {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tokio::task::block_in_place(|| from_nothing(&env, bundle));
    // Each image install.yaml names is an index of both platforms; the
    // nodes pull the one of their own.
    let manifest = std::fs::read_to_string(bundle.dir.join("install.yaml")).expect("install.yaml");
    let images: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    assert!(images.len() >= 2, "install.yaml names {images:?}");
    for image in images {
        assert!(image.contains("@sha256:"), "{image} is not named by digest");
        let platforms = tokio::task::block_in_place(|| support::release::index_platforms(image));
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{image}");
    }
    let install = doc_block(bundle, "## kubectl", "sh");
    assert!(install.contains("install.yaml"), "{install}");
    tokio::task::block_in_place(|| sh(&env, bundle, &install));
    custom_source_flows(&env, "release-kubectl").await;
    tokio::task::block_in_place(|| uninstall(&env, bundle, true, UNINSTALL_KUBECTL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_with_helm_from_the_oci_chart_then_uninstalled_to_nothing() {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tokio::task::block_in_place(|| from_nothing(&env, bundle));
    let install = doc_block(bundle, "## Helm", "sh");
    assert!(
        install.contains("oci://$REGISTRY/charts/openflux"),
        "{install}"
    );
    let install = with_plain_http_helm(&install);
    tokio::task::block_in_place(|| sh(&env, bundle, &install));
    custom_source_flows(&env, "release-helm").await;
    tokio::task::block_in_place(|| uninstall(&env, bundle, true, UNINSTALL_HELM));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_by_flux_from_the_signed_manifests_then_uninstalled_to_nothing() {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tokio::task::block_in_place(|| from_nothing(&env, bundle));
    let objects = doc_block(bundle, "## Flux", "yaml")
        .replace("$REGISTRY", &bundle.registry)
        // The cell's registry speaks plain HTTP.
        .replace(
            &format!("  ref: {{tag: {}}}\n", bundle.version),
            &format!("  ref: {{tag: {}}}\n  insecure: true\n", bundle.version),
        );
    assert!(objects.contains("insecure: true"), "{objects}");
    assert!(objects.contains("provider: cosign"), "{objects}");
    // A key that did not sign the release first: the artifact is refused.
    tokio::task::block_in_place(|| {
        sh(
            &env,
            bundle,
            "other=\"$(mktemp)\"\n\
             openssl ecparam -name prime256v1 -genkey -noout | openssl ec -pubout >\"$other\" 2>/dev/null\n\
             kubectl -n flux-system create secret generic openflux-cosign-pub --from-file=cosign.pub=\"$other\"\n\
             rm -f \"$other\"\n",
        );
        sh(
            &env,
            bundle,
            &format!("kubectl apply -f - <<'EOF'\n{objects}EOF\n"),
        );
    });
    let refused = support::wait_for(
        "the OCIRepository refusing an artifact signed with another key",
        ROLLOUT,
        || async {
            let repo = env
                .find(SOURCE, "OCIRepository", "flux-system", "openflux")
                .await?;
            condition(&repo, "SourceVerified", "False")
        },
    )
    .await;
    println!("with another key: {refused}");
    // The release's key: verified, applied.
    tokio::task::block_in_place(|| {
        sh(
            &env,
            bundle,
            "kubectl -n flux-system delete secret openflux-cosign-pub\n\
             kubectl -n flux-system create secret generic openflux-cosign-pub --from-file=cosign.pub\n\
             kubectl -n flux-system annotate --overwrite ocirepository/openflux \
             reconcile.fluxcd.io/requestedAt=\"$(date +%s%N)\"\n",
        )
    });
    let verified = support::wait_for(
        "the OCIRepository verifying the release's signature",
        ROLLOUT,
        || async {
            let repo = env
                .find(SOURCE, "OCIRepository", "flux-system", "openflux")
                .await?;
            condition(&repo, "SourceVerified", "True")
        },
    )
    .await;
    println!("with the release's key: {verified}");
    ready_with_inventory(&env, "openflux").await;
    ready_with_inventory(&env, "openflux-http-source").await;
    custom_source_flows(&env, "release-flux").await;
    tokio::task::block_in_place(|| {
        uninstall(
            &env,
            bundle,
            false,
            "kubectl -n flux-system delete kustomizations.kustomize.toolkit.fluxcd.io openflux-http-source --wait=true --timeout=180s\n\
             kubectl -n flux-system delete kustomizations.kustomize.toolkit.fluxcd.io openflux --wait=true --timeout=180s\n\
             kubectl -n flux-system delete ocirepositories.source.toolkit.fluxcd.io openflux\n\
             kubectl -n flux-system delete secret openflux-cosign-pub\n",
        )
    });
}

/// The message of `object`'s condition `kind` when its status is `status`.
fn condition(object: &kube::api::DynamicObject, kind: &str, status: &str) -> Option<String> {
    field(object, "/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == status)
        .map(|c| c["message"].as_str().unwrap_or_default().to_string())
}
