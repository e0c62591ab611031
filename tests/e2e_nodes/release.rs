//! openflux installed from its release, as docs/install.md says: this tree
//! released (`make release`) and published to the cell's registry (`make
//! publish`, see [`support::release::published_bundle`]), verified as
//! docs/install.md's "Verify the release" says (SHA256SUMS.sig with
//! cosign.pub, `sha256sum -c`, `cosign verify` of each artifact in the
//! registry; the tests' own key, of the kind of the project's, stands in
//! for it), then each of the three install paths from nothing (`kubectl
//! apply -f install.yaml`, `helm install` from the OCI chart, Flux's
//! `OCIRepository` with `verify` and two Kustomizations), a custom source
//! run through an unchanged Kustomization on each, and each path's
//! uninstall, after which none of the objects install.yaml lists, nor the
//! webhook configuration openflux writes at run time, is left. A bundle
//! whose checksums, files, signature or key were changed fails that
//! verification.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use base64::Engine as _;
use openflux_testkit as support;
use sha2::Digest as _;
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

/// The cosign `make release` built (from its Go module), once.
fn cosign() -> &'static Path {
    static COSIGN: OnceLock<PathBuf> = OnceLock::new();
    COSIGN.get_or_init(support::release::cosign)
}

/// Runs `script` with bash (`-euo pipefail`) in `dir`: `kubectl` the
/// cell's, `helm` and `cosign` the release's, `REGISTRY` the bundle's.
fn bash_in(env: &Env, bundle: &Bundle, dir: &Path, script: &str) -> Output {
    let kubectl = support::nodes::var(env, "OPENFLUX_E2E_KUBECTL");
    let dirs = [
        Path::new(kubectl).parent().expect("kubectl's dir"),
        bundle.helm.parent().expect("helm's dir"),
        cosign().parent().expect("cosign's dir"),
    ];
    let path = std::env::join_paths(dirs.iter().map(|d| d.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env(
            "KUBECONFIG",
            env.kubeconfig.as_ref().expect("the cell's kubeconfig"),
        )
        .env("REGISTRY", &bundle.registry)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .expect("running bash")
}

/// Runs `script` with bash (`-euo pipefail`) in the bundle's directory:
/// `kubectl` the cell's, `helm` and `cosign` the release's, `REGISTRY` the
/// bundle's. It must succeed.
pub(super) fn sh(env: &Env, bundle: &Bundle, script: &str) -> Output {
    let out = bash_in(env, bundle, &bundle.dir, script);
    assert!(
        out.status.success(),
        "failed ({}):\n{script}\n----- stdout\n{}\n----- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// docs/install.md's block that verifies the release's files.
const VERIFY_FILES: &str = "### Verify the files";
/// docs/install.md's block that verifies the artifacts in the registry.
const VERIFY_ARTIFACTS: &str = "### Verify the images, the chart and the manifests artifact";

/// The DER prefix of an ECDSA P-256 public key (SubjectPublicKeyInfo:
/// id-ecPublicKey, prime256v1, then the 65-byte uncompressed point): the
/// kind of key `cosign generate-key-pair` makes.
const P256_SPKI: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00, 0x04,
];

/// The DER of the PEM public key at `path`, which must be an ECDSA P-256
/// key, as the project's cosign.pub is.
fn p256_key(path: &Path) -> Vec<u8> {
    let pem =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let body: String = pem
        .lines()
        .skip_while(|l| *l != "-----BEGIN PUBLIC KEY-----")
        .skip(1)
        .take_while(|l| *l != "-----END PUBLIC KEY-----")
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap_or_else(|e| panic!("{} is not a PEM public key: {e}", path.display()));
    assert!(
        der.len() == 91 && der.starts_with(P256_SPKI),
        "{} is not an ECDSA P-256 public key, the kind cosign.pub is",
        path.display()
    );
    der
}

/// The tests' own key, which signed `bundle` in the project's key's stead:
/// of the same kind as the project's cosign.pub, not that key, and the one
/// the bundle ships as its cosign.pub.
fn tests_key(bundle: &Bundle) -> Vec<u8> {
    let test_key = bundle
        .test_key
        .as_ref()
        .expect("the bundle is a test build signed with the tests' key");
    let project = p256_key(&support::workspace_root().join("cosign.pub"));
    let key = p256_key(test_key);
    assert_ne!(
        key, project,
        "a test build is not signed with the project's key"
    );
    assert_eq!(
        p256_key(&bundle.dir.join("cosign.pub")),
        key,
        "the bundle's cosign.pub is the key that signed it"
    );
    key
}

/// `block` with cosign told that the cell's registry speaks plain HTTP
/// (`cosign verify` only; `verify-blob` reads no registry).
fn with_plain_http_cosign(block: &str) -> String {
    format!(
        "cosign() {{ if [ \"$1\" = verify ]; then command cosign \"$@\" --allow-http-registry --allow-insecure-registry; else command cosign \"$@\"; fi; }}\n{block}"
    )
}

/// The release verified as docs/install.md's "Verify the release" says,
/// before anything of it is installed, with the tests' key (of the kind
/// of the project's) as cosign.pub: SHA256SUMS.sig, every file against
/// SHA256SUMS, then each image, the chart and the manifests artifact in
/// the registry.
pub(super) fn verified(env: &Env, bundle: &Bundle) {
    tests_key(bundle);
    let files = doc_block(bundle, VERIFY_FILES, "sh");
    assert!(
        files.contains("--key cosign.pub") && files.contains("SHA256SUMS.sig"),
        "{files}"
    );
    let out = sh(env, bundle, &files);
    let checked = String::from_utf8_lossy(&out.stdout);
    for file in ["install.yaml", &format!("openflux-{}.tgz", bundle.version)] {
        assert!(
            checked.contains(&format!("{file}: OK")),
            "{file} is checked against SHA256SUMS: {checked}"
        );
    }
    let artifacts = doc_block(bundle, VERIFY_ARTIFACTS, "sh");
    assert!(artifacts.contains("--key cosign.pub"), "{artifacts}");
    sh(env, bundle, &with_plain_http_cosign(&artifacts));
    println!(
        "{}: verified with the tests' key (SHA256SUMS.sig, sha256sum -c, cosign verify of each artifact)",
        bundle.dir.display()
    );
}

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

/// What an uninstall keeps of openflux, as `kubectl get -o name` names
/// it: its CRDs, and with them the custom resources.
pub(super) const KEPT: [&str; 3] = [
    "customresourcedefinition.apiextensions.k8s.io/artifacts.openflux.dev",
    "customresourcedefinition.apiextensions.k8s.io/httpsources.sources.openflux.dev",
    "customresourcedefinition.apiextensions.k8s.io/sourcepolicies.openflux.dev",
];

/// Waits (blocking) until what of openflux is left ([`left`]) is `wanted`:
/// what is deleted in the background (the namespace, whose content goes
/// first; the validating configuration openflux wrote, which the garbage
/// collector deletes once its owner, openflux's ClusterRole, is gone) is
/// gone before anything is counted. Panics with what is left.
pub(super) fn left_becomes(env: &Env, bundle: &Bundle, wanted: &[&str], after: &str) {
    sh(
        env,
        bundle,
        "kubectl wait --for=delete namespace/openflux-system --timeout=180s\n",
    );
    let deadline = std::time::Instant::now() + ROLLOUT;
    loop {
        let left = left(env, bundle);
        if left == wanted {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{ROLLOUT:?} after {after}, these are left: {left:?} (wanted {wanted:?})"
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
}

/// docs/install.md's "Uninstall with `path`" block (`kubectl`, `Helm`,
/// `Flux`), run as written: nothing of openflux is left but its CRDs, no
/// webhook configuration, no admission policy.
pub(super) fn uninstall_keeping_the_crds(env: &Env, bundle: &Bundle, path: &str) {
    let heading = format!("### Uninstall with {path}");
    let block = doc_block(bundle, &heading, "sh");
    sh(env, bundle, &block);
    left_becomes(env, bundle, &KEPT, &heading);
}

/// Uninstalled to nothing as docs/install.md's "Uninstall" says for
/// `path`: its "Uninstall with `path`" block, then "Delete the custom
/// resources too"; nothing of openflux is left.
pub(super) fn uninstall(env: &Env, bundle: &Bundle, path: &str) {
    uninstall_keeping_the_crds(env, bundle, path);
    let heading = "### Delete the custom resources too";
    let block = doc_block(bundle, heading, "sh");
    assert!(block.contains("kubectl delete crd"), "{block}");
    sh(env, bundle, &block);
    left_becomes(env, bundle, &[], heading);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_with_kubectl_from_install_yaml_then_uninstalled_to_nothing() {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tokio::task::block_in_place(|| verified(&env, bundle));
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
    tokio::task::block_in_place(|| uninstall(&env, bundle, "kubectl"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_with_helm_from_the_oci_chart_then_uninstalled_to_nothing() {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tokio::task::block_in_place(|| verified(&env, bundle));
    tokio::task::block_in_place(|| from_nothing(&env, bundle));
    let install = doc_block(bundle, "## Helm", "sh");
    assert!(
        install.contains("oci://$REGISTRY/charts/openflux"),
        "{install}"
    );
    let install = with_plain_http_helm(&install);
    tokio::task::block_in_place(|| sh(&env, bundle, &install));
    // The namespace the documented commands make holds Pods to the
    // restricted Pod Security level, as install.yaml's does.
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(env.client.clone());
    let labels = namespaces
        .get("openflux-system")
        .await
        .expect("the namespace openflux-system")
        .metadata
        .labels
        .unwrap_or_default();
    for label in [
        "pod-security.kubernetes.io/enforce",
        "pod-security.kubernetes.io/warn",
    ] {
        assert_eq!(
            labels.get(label).map(String::as_str),
            Some("restricted"),
            "{label} on openflux-system: {labels:?}"
        );
    }
    custom_source_flows(&env, "release-helm").await;
    non_default_values_run_as_set(&env, bundle).await;
    tokio::task::block_in_place(|| {
        uninstall(&env, bundle, "Helm");
        sh(
            &env,
            bundle,
            &format!(
                "kubectl delete crd podmonitors.monitoring.coreos.com\n\
                 kubectl delete namespace {OTHER_FLUX_NAMESPACE}\n"
            ),
        );
    });
}

/// The Flux namespace the non-default values name: not flux-system.
const OTHER_FLUX_NAMESPACE: &str = "gitops-system";

/// A stand-in for the Prometheus Operator's PodMonitor CRD (the cell runs
/// no Prometheus Operator): the kind, served, with any spec.
const PODMONITOR_CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: podmonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PodMonitor, listKind: PodMonitorList, plural: podmonitors, singular: podmonitor}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
";

/// The installed release upgraded with values an operator sets beside the
/// defaults (three replicas, another Flux namespace, extraArgs that
/// override the shipped `--log-level`, the PodMonitor on): the chart
/// accepts them, openflux's Pods run with them and become ready, the
/// PodMonitor selects every openflux Pod on a port they declare. Leaves
/// the release installed, with these values, for its uninstall.
async fn non_default_values_run_as_set(env: &Env, bundle: &Bundle) {
    let values = format!(
        "openflux:\n  replicas: 3\n  extraArgs: [--log-level=debug]\n\
         fluxNamespace: {OTHER_FLUX_NAMESPACE}\npodMonitor:\n  enabled: true\n"
    );
    tokio::task::block_in_place(|| {
        sh(
            env,
            bundle,
            &with_plain_http_helm(&format!(
                "kubectl apply -f - <<'EOF'\n{PODMONITOR_CRD}EOF\n\
                 kubectl wait --for=condition=Established --timeout=60s crd/podmonitors.monitoring.coreos.com\n\
                 kubectl create namespace {OTHER_FLUX_NAMESPACE}\n\
                 values=\"$(mktemp)\"\n\
                 cat >\"$values\" <<'EOF'\n{values}EOF\n\
                 helm upgrade openflux oci://$REGISTRY/charts/openflux --version {version} \\\n\
                   --namespace openflux-system --reuse-values -f \"$values\"\n\
                 rm -f \"$values\"\n",
                version = bundle.version
            )),
        )
    });
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(env.client.clone(), "openflux-system");
    support::wait_for(
        "openflux's Deployment rolled out with 3 ready replicas",
        ROLLOUT,
        || async {
            let d = deployments.get("openflux").await.ok()?;
            let status = d.status.as_ref()?;
            let generation = d.metadata.generation?;
            (status.observed_generation == Some(generation)
                && d.spec.as_ref()?.replicas == Some(3)
                && status.replicas == Some(3)
                && status.updated_replicas == Some(3)
                && status.ready_replicas == Some(3))
            .then_some(())
        },
    )
    .await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(env.client.clone(), "openflux-system");
    let running: Vec<_> = pods
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/name=openflux"))
        .await
        .expect("listing openflux's Pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert_eq!(running.len(), 3, "openflux's Pods");
    let mut ports = Vec::new();
    for pod in &running {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let container = &pod.spec.as_ref().expect("a Pod's spec").containers[0];
        let args = container.args.clone().unwrap_or_default();
        let last_level = args.iter().rev().find(|a| a.starts_with("--log-level="));
        assert_eq!(
            last_level.map(String::as_str),
            Some("--log-level=debug"),
            "{name}: the last --log-level is extraArgs': {args:?}"
        );
        assert!(
            args.iter()
                .any(|a| a == &format!("--flux-namespace={OTHER_FLUX_NAMESPACE}")),
            "{name}: runs for the Flux namespace {OTHER_FLUX_NAMESPACE}: {args:?}"
        );
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        assert!(ready, "{name} is ready");
        ports.extend(
            container
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.name.clone()),
        );
    }
    let monitor = env
        .find(
            "monitoring.coreos.com/v1",
            "PodMonitor",
            "openflux-system",
            "openflux",
        )
        .await
        .expect("the PodMonitor the values turned on");
    let spec = &monitor.data["spec"];
    let selected = spec["selector"]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| {
            e["key"] == "app.kubernetes.io/name"
                && e["operator"] == "In"
                && e["values"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v == "openflux"))
        });
    assert!(selected, "the PodMonitor selects openflux's Pods: {spec}");
    let endpoints: Vec<&str> = spec["podMetricsEndpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["port"].as_str())
        .collect();
    assert!(
        endpoints.iter().any(|p| ports.iter().any(|q| q == p)),
        "the PodMonitor scrapes a port openflux's Pods declare: {endpoints:?} of {ports:?}"
    );
    println!(
        "helm upgrade with non-default values: 3 ready Pods, --log-level=debug last, \
         --flux-namespace={OTHER_FLUX_NAMESPACE}, PodMonitor on ports {endpoints:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_by_flux_from_the_signed_manifests_then_uninstalled_to_nothing() {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tokio::task::block_in_place(|| verified(&env, bundle));
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
    tokio::task::block_in_place(|| uninstall(&env, bundle, "Flux"));
}

/// The release's verification refuses what was changed after it was
/// signed: docs/install.md's block, run on copies of the bundle's files
/// (the tests' key as cosign.pub), passes as released and fails when
/// SHA256SUMS was changed (even to match a changed install.yaml), when
/// install.yaml was changed under an intact SHA256SUMS, when SHA256SUMS.sig
/// is another key's signature, and when cosign.pub is the project's key,
/// which did not sign this test build; the registry's block fails with
/// another key too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_changed_after_it_was_signed_fails_its_verification() {
    let env = support::cell(Cell::Nodes).await;
    let bundle = tokio::task::block_in_place(|| support::release::published_bundle(&env));
    tests_key(bundle);
    let files = doc_block(bundle, VERIFY_FILES, "sh");
    let chart = format!("openflux-{}.tgz", bundle.version);
    let copied = [
        "install.yaml",
        chart.as_str(),
        "SHA256SUMS",
        "SHA256SUMS.sig",
        "cosign.pub",
    ];
    // A fresh copy of the files a user downloads, changed by `change`;
    // the block's result there.
    let verify_copy = |what: &str, change: &dyn Fn(&Path)| -> Output {
        let dir = tempfile::tempdir().expect("a temp dir");
        for name in copied {
            std::fs::copy(bundle.dir.join(name), dir.path().join(name))
                .unwrap_or_else(|e| panic!("copying {name}: {e}"));
        }
        change(dir.path());
        let out = tokio::task::block_in_place(|| bash_in(&env, bundle, dir.path(), &files));
        println!(
            "{what}: {} ({})",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| !l.starts_with("WARNING"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        out
    };
    let refused = |what: &str, out: &Output, said: &str| {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success(),
            "{what}: the verification passed:\n{text}"
        );
        assert!(
            text.contains(said),
            "{what}: refused, but not for {said:?}:\n{text}"
        );
    };
    let out = verify_copy("as released", &|_| {});
    assert!(
        out.status.success(),
        "the released files fail their verification:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // install.yaml changed, and SHA256SUMS changed to match it: only the
    // signature can tell.
    let changed_sums = |dir: &Path| {
        let install = dir.join("install.yaml");
        let mut text = std::fs::read_to_string(&install).expect("install.yaml");
        text.push_str(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: planted, namespace: default}\n",
        );
        std::fs::write(&install, &text).expect("writing install.yaml");
        let sum = hex::encode(sha2::Sha256::digest(text.as_bytes()));
        let sums = dir.join("SHA256SUMS");
        let lines: String = std::fs::read_to_string(&sums)
            .expect("SHA256SUMS")
            .lines()
            .map(|l| match l.split_once("  ") {
                Some((_, "install.yaml")) => format!("{sum}  install.yaml\n"),
                _ => format!("{l}\n"),
            })
            .collect();
        std::fs::write(&sums, lines).expect("writing SHA256SUMS");
    };
    let out = verify_copy(
        "SHA256SUMS changed to match a changed install.yaml",
        &changed_sums,
    );
    refused("SHA256SUMS changed", &out, "invalid signature");

    // install.yaml changed, SHA256SUMS as signed.
    let out = verify_copy("install.yaml changed", &|dir| {
        let install = dir.join("install.yaml");
        let text = std::fs::read_to_string(&install).expect("install.yaml");
        std::fs::write(&install, text.replacen("replicas: 2", "replicas: 1", 1))
            .expect("writing install.yaml");
    });
    refused("install.yaml changed", &out, "install.yaml: FAILED");

    // SHA256SUMS signed by another key.
    let out = verify_copy("SHA256SUMS.sig made with another key", &|dir| {
        let keys = tempfile::tempdir().expect("a temp dir");
        let status = Command::new(cosign())
            .arg("generate-key-pair")
            .current_dir(keys.path())
            .env("COSIGN_PASSWORD", "")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("cosign generate-key-pair");
        assert!(status.success(), "cosign generate-key-pair: {status}");
        let status = Command::new(cosign())
            .args(["sign-blob", "--yes", "--tlog-upload=false", "--key"])
            .arg(keys.path().join("cosign.key"))
            .arg("--output-signature")
            .arg(dir.join("SHA256SUMS.sig"))
            .arg(dir.join("SHA256SUMS"))
            .env("COSIGN_PASSWORD", "")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("cosign sign-blob");
        assert!(status.success(), "cosign sign-blob: {status}");
    });
    refused("another key's signature", &out, "invalid signature");

    // The project's key: it did not sign this test build.
    let project = support::workspace_root().join("cosign.pub");
    let out = verify_copy("verified with the project's cosign.pub", &|dir| {
        std::fs::copy(&project, dir.join("cosign.pub")).expect("copying cosign.pub");
    });
    refused(
        "the project's key on a test build",
        &out,
        "invalid signature",
    );

    // The artifacts in the registry, checked with a key that did not sign
    // them.
    let artifacts = with_plain_http_cosign(&doc_block(bundle, VERIFY_ARTIFACTS, "sh"));
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::copy(&project, dir.path().join("cosign.pub")).expect("copying cosign.pub");
    let out = tokio::task::block_in_place(|| bash_in(&env, bundle, dir.path(), &artifacts));
    assert!(
        !out.status.success(),
        "the registry's artifacts verify with a key that did not sign them:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The message of `object`'s condition `kind` when its status is `status`.
fn condition(object: &kube::api::DynamicObject, kind: &str, status: &str) -> Option<String> {
    field(object, "/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == status)
        .map(|c| c["message"].as_str().unwrap_or_default().to_string())
}
