//! End to end: the container images of `make images`.
//!
//! Each test builds the archives when they are missing or stale (through
//! `images/build`, as `make images` does), reads them back with every digest
//! checked, unpacks the layers into a root file system and runs the image's
//! entry point in it with `chroot`, as the image's user, so only the files
//! of the image (and the ones a Pod would mount) are used: openflux serves
//! its webhook over TLS to the API server and exports a custom source, the
//! HttpSource controller fetches over HTTPS with the image's CA roots plus a
//! mounted CA. Two modules need no image, no root and no cluster (the
//! pull-request workflow runs them): `dockerfile::` checks that the
//! Dockerfile builds from what its context holds, `workflows::` the release
//! and pull-request workflows.

use openflux_testkit as support;

mod archive;
mod dockerfile;
mod fixtures;
#[path = "../common/https.rs"]
mod https;
mod rooted;
mod workflows;

use std::process::Command;

use archive::{archives, Image};
use dockerfile::dockerfile_stage;
use fixtures::{download, kubeconfig, openflux_kubeconfig, serve_body, webhook_configuration};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::Api;
use kube::ResourceExt;
use openflux::certs::{self, Authority, DEFAULT_CA_VALIDITY};
use rooted::{require_root, Rooted};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::openflux::{free_addr, http_get, tarball};
use support::{cluster, condition, field, ready_condition, wait_for, TIMEOUT};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const TEST_SOURCE: &str = "e2e.openflux.dev/v1";

/// The image's config says what the Dockerfile's stage says.
fn assert_like_dockerfile(image: &Image, stage: &str) {
    let expected = dockerfile_stage(stage);
    assert_eq!(image.field("User"), expected.user, "User of {stage}");
    assert_eq!(
        image.entrypoint(),
        expected.entrypoint,
        "Entrypoint of {stage}"
    );
    assert_eq!(image.exposed_ports(), expected.ports, "ports of {stage}");
    assert_eq!(image.labels(), expected.labels, "labels of {stage}");
}

/// The `images:` entry of a kustomization names the Deployment's image and
/// rewrites it to the reference the archive is tagged with.
fn assert_kustomize_entry(dir: &str, deployment: &str, reference: &str) {
    let root = support::workspace_root().join(dir);
    let read = |name: &str| -> Value {
        let text = std::fs::read_to_string(root.join(name)).expect("reading a manifest");
        serde_yaml_ng::from_str(&text).expect("manifest YAML")
    };
    let deployment = read(deployment);
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("the container image");
    let kustomization = read("kustomization.yaml");
    let entries = kustomization["images"]
        .as_array()
        .expect("an images: entry");
    let entry = entries
        .iter()
        .find(|e| e["name"] == image)
        .unwrap_or_else(|| panic!("no images: entry in {dir} names the Deployment's {image:?}"));
    let rewritten = format!(
        "{}:{}",
        entry["newName"].as_str().unwrap_or(image),
        entry["newTag"].as_str().expect("newTag")
    );
    assert_eq!(
        rewritten, reference,
        "{dir}: the images: entry and the archive"
    );
}

#[test]
fn archives_are_reproducible_and_match_the_dockerfile_and_the_manifests() {
    let dir = archives();
    let openflux = Image::unpack(&dir.join("openflux.oci.tar"));
    assert_eq!(openflux.reference, format!("openflux:{VERSION}"));
    assert_like_dockerfile(&openflux, "openflux");
    assert_kustomize_entry("manifests", "deployment.yaml", &openflux.reference);
    assert!(
        !openflux.rootfs.join("etc/ssl").exists(),
        "openflux needs no CA roots"
    );

    let http = Image::unpack(&dir.join("openflux-http-source.oci.tar"));
    assert_eq!(http.reference, format!("openflux-http-source:{VERSION}"));
    assert_like_dockerfile(&http, "http-source");
    assert_kustomize_entry("manifests/http-source", "deployment.yaml", &http.reference);
    let roots = std::fs::read(http.rootfs.join("etc/ssl/certs/ca-certificates.crt"))
        .expect("the CA roots in the HttpSource image");
    let count = certs::parse_certs(&roots).expect("CA roots PEM").len();
    assert!(count > 50, "only {count} CA roots");

    for image in [&openflux, &http] {
        let passwd = std::fs::read_to_string(image.rootfs.join("etc/passwd")).expect("passwd");
        let (uid, _) = image.user();
        assert!(passwd.contains(&format!(":{uid}:{uid}:")), "{passwd}");
    }

    // A second build of the same binaries gives the same bytes.
    let again = tempfile::tempdir().expect("temp dir");
    let status = Command::new(support::workspace_root().join("images/build"))
        .arg("--no-cargo")
        .env("CARGO_TARGET_DIR", dir.parent().expect("target dir"))
        .env("IMAGES_OUT", again.path())
        .env_remove("SOURCE_DATE_EPOCH")
        .status()
        .expect("running images/build");
    assert!(status.success(), "images/build --no-cargo: {status}");
    for name in ["openflux.oci.tar", "openflux-http-source.oci.tar"] {
        let first = std::fs::read(dir.join(name)).expect("first archive");
        let second = std::fs::read(again.path().join(name)).expect("second archive");
        assert!(first == second, "{name} differs between two builds");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_image_serves_the_webhook_and_exports_a_custom_source() {
    require_root();
    let image = Image::unpack(&archives().join("openflux.oci.tar"));
    let env = cluster().await;
    support::install_artifact_crd(&env).await;
    support::install_test_source_crd(&env, "e2e.openflux.dev").await;
    support::wait_established(
        &env,
        &["artifacts.openflux.dev", "testsources.e2e.openflux.dev"],
    )
    .await;
    let ns = env.namespace("image-openflux").await;
    let n = ns.name().to_string();

    let (webhook_addr, metrics, health) = (free_addr(), free_addr(), free_addr());
    let webhook = webhook_configuration(&env, &n, webhook_addr).await;
    let kubeconfig = image.mount_file("/etc/openflux/kubeconfig", &openflux_kubeconfig(&env));
    let args = [
        "run".to_string(),
        format!("--kubeconfig={kubeconfig}"),
        format!("--webhook-addr={webhook_addr}"),
        format!("--webhook-configuration={}", webhook.name),
        format!("--metrics-addr={metrics}"),
        format!("--health-addr={health}"),
        "--watch-all-namespaces=false".to_string(),
    ];
    let mut openflux = Rooted::start(&image, "openflux", &args, &[("RUNTIME_NAMESPACE", &n)]);
    openflux.wait_ready(health).await;

    // openflux wrote its CA into the webhook configuration.
    let configs: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    wait_for(
        "the CA bundle in the webhook configuration",
        TIMEOUT,
        || async {
            let config = configs.get_opt(&webhook.name).await.ok().flatten()?;
            config
                .webhooks?
                .iter()
                .all(|w| w.client_config.ca_bundle.is_some())
                .then_some(())
        },
    )
    .await;

    // A custom source with an Artifact: exported.
    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": "web", "namespace": n}, "spec": {}
        }))
        .await
        .expect("creating the custom source");
    let (bytes, digest) = tarball(&[("configmap.yaml", &support::configmap_yaml("image"))]);
    env.apply(&json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
        "metadata": {"name": "web", "namespace": n, "ownerReferences": [{
            "apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web",
            "uid": source.uid().expect("uid"), "controller": true
        }]},
        "spec": {"url": "http://127.0.0.1:9/web.tar.gz", "revision": format!("v1@{digest}"),
                 "digest": digest, "size": bytes.len()}
    }))
    .await
    .expect("writing the Artifact");
    // An ExternalArtifact or a shadow OCIRepository, as Flux's flags allow.
    let (_, export) = support::exports::wait_export(&env, &n, "web", |e| {
        ready_condition(e).is_some_and(|c| c.0 == "True")
    })
    .await;

    // The API server sends the Kustomization to the webhook over TLS; the
    // custom reference is rewritten to the export.
    let stored = env
        .apply(&json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "web", "namespace": n},
            "spec": {"interval": "10m", "prune": true, "path": "./", "targetNamespace": n,
                     "sourceRef": {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web"}}
        }))
        .await
        .expect("creating the Kustomization");
    assert_eq!(
        field(&stored, "/spec/sourceRef"),
        Some(&support::exports::reference_to(&export))
    );
    let (_, text) = http_get(metrics, "/metrics").await.expect("metrics");
    assert!(
        text.lines()
            .any(|l| l.starts_with("openflux_admission_requests_total")
                && l.contains("outcome=\"rewritten\"")),
        "no rewrite counted:\n{text}"
    );
    let status = openflux.stop().expect("openflux stopped");
    assert!(status.success(), "openflux exited with {status} on SIGTERM");
    ns.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_source_image_fetches_over_https_with_a_mounted_ca() {
    require_root();
    let image = Image::unpack(&archives().join("openflux-http-source.oci.tar"));
    let ca = Authority::generate(DEFAULT_CA_VALIDITY).expect("a test CA");
    let (content, _) = tarball(&[("configmap.yaml", &support::configmap_yaml("https"))]);
    let server = serve_body(&ca, content).await;

    let env = cluster().await;
    support::install_artifact_crd(&env).await;
    env.apply_yaml(include_str!("../../manifests/http-source/crd.yaml"))
        .await
        .expect("installing the HttpSource CRD");
    support::wait_established(
        &env,
        &["artifacts.openflux.dev", "httpsources.sources.openflux.dev"],
    )
    .await;
    let ns = env.namespace("image-http-source").await;
    let n = ns.name().to_string();
    env.apply(&json!({
        "apiVersion": "sources.openflux.dev/v1alpha1", "kind": "HttpSource",
        "metadata": {"name": "app", "namespace": n},
        "spec": {"url": format!("https://127.0.0.1:{}/app.tar.gz", server.addr.port()),
                 "interval": "1m", "timeout": "10s"}
    }))
    .await
    .expect("creating the HttpSource");

    let kubeconfig = image.mount_file("/etc/openflux-http-source/kubeconfig", &kubeconfig(&env));
    let data = image.mount_dir("/data");
    let storage = free_addr();
    let start = |extra_env: &[(&str, &str)]| {
        let (metrics, health) = (free_addr(), free_addr());
        let args = [
            format!("--kubeconfig={kubeconfig}"),
            "--watch-all-namespaces=false".to_string(),
            format!("--storage-path={data}"),
            format!("--storage-addr={storage}"),
            format!("--storage-adv-addr={storage}"),
            // The test's HTTPS server is on loopback, refused by default.
            "--allow-network=127.0.0.1/32".to_string(),
            format!("--metrics-addr={metrics}"),
            format!("--health-addr={health}"),
        ];
        let mut env_vars = vec![("RUNTIME_NAMESPACE", n.as_str())];
        env_vars.extend_from_slice(extra_env);
        (
            Rooted::start(&image, "openflux-http-source", &args, &env_vars),
            health,
        )
    };
    let hs_ready = || async {
        let hs = env
            .find("sources.openflux.dev/v1alpha1", "HttpSource", &n, "app")
            .await?;
        condition(&hs, "Ready").map(|c| (c, hs))
    };

    // The image's CA roots alone do not trust the test CA.
    let (mut controller, health) = start(&[]);
    controller.wait_ready(health).await;
    let message = wait_for("the fetch to fail on the unknown CA", TIMEOUT, || async {
        let ((status, _, message), _) = hs_ready().await?;
        (status == "False" && message.contains("GET https://")).then_some(message)
    })
    .await;
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    controller.stop();

    // The test CA mounted beside the image's roots, the operator's way.
    let ca_dir = image.mount_configmap(
        "/etc/openflux-http-source/ca",
        &[("ca.crt", ca.cert_pem.as_bytes())],
    );
    let dirs = format!("/etc/ssl/certs:{ca_dir}");
    let (mut controller, health) = start(&[("SSL_CERT_DIR", &dirs)]);
    controller.wait_ready(health).await;
    let hs = wait_for("the HttpSource to be Ready", TIMEOUT, || async {
        let ((status, _, _), hs) = hs_ready().await?;
        (status == "True").then_some(hs)
    })
    .await;
    let url = field(&hs, "/status/artifact/url")
        .and_then(Value::as_str)
        .expect("artifact url");
    let digest = field(&hs, "/status/artifact/digest")
        .and_then(Value::as_str)
        .expect("artifact digest");
    let artifact = download(url).await;
    assert_eq!(
        format!("sha256:{}", hex::encode(Sha256::digest(&artifact))),
        digest
    );
    let listing = tempfile::tempdir().expect("temp dir");
    let file = listing.path().join("artifact.tar.gz");
    std::fs::write(&file, &artifact).expect("writing the artifact");
    let out = Command::new("tar")
        .arg("-tzf")
        .arg(&file)
        .output()
        .expect("tar");
    assert!(String::from_utf8_lossy(&out.stdout).contains("configmap.yaml"));

    // Every directory of SSL_CERT_DIR, the image's own included, was read.
    let log = controller.log_text();
    assert!(!log.contains("Error loading CA root certificate"), "{log}");
    assert!(!log.contains("CA root certificates were ignored"), "{log}");
    let status = controller.stop().expect("the controller stopped");
    assert!(
        status.success(),
        "the controller exited with {status} on SIGTERM"
    );
    drop(server);
    ns.delete().await;
}
