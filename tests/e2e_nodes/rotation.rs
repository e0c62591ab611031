//! Certificates with nothing prepared, rotated under load with three
//! replicas as Pods: this build's manifests installed with three replicas
//! and short validities (nothing made by hand: the leader makes the CA and
//! the serving certificate in a Secret), admissions through the API server
//! while the CA is replaced. Counted from the client side: no failed
//! admission; every Pod ends serving a certificate of the new CA alone.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use openflux_testkit as support;
use serde_json::json;
use support::{Cell, Env};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::load::{self, Admissions, WEBHOOK_HOST};
use super::{all_available, overlay, ROLLOUT};

const GROUP: &str = "rotation.producer.example";
const SECRET: &str = "openflux-webhook-tls";
const REPLICAS: usize = 3;
/// The serving certificate is renewed after about 27 s, the CA after about
/// 80 s: long enough for the install and the producer before the CA is
/// replaced, short enough for a test.
const CERT_VALIDITY: &str = "40s";
const CA_VALIDITY: &str = "120s";
/// Bound on the rotation, from the load's start to the old CA pruned.
const ROTATION: Duration = Duration::from_secs(240);

/// The CA certificates (PEM, one each) of the Secret's bundle.
async fn secret_cas(secrets: &Api<Secret>) -> Vec<String> {
    let secret = secrets.get_opt(SECRET).await.ok().flatten();
    let bundle = secret
        .and_then(|s| s.data)
        .and_then(|d| d.get("ca.crt").cloned())
        .unwrap_or_default();
    pem::parse_many(&bundle.0)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| pem::encode(&p))
        .collect()
}

/// Whether every openflux Pod serves a certificate for the webhook's
/// Service name that `ca` alone verifies.
async fn every_pod_serves_from(env: &Env, ca: &str) -> bool {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "openflux-system");
    let Ok(list) = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=openflux"))
        .await
    else {
        return false;
    };
    let tls = TlsConnector::from(load::tls_trusting(ca.as_bytes()));
    let mut serving = 0;
    for pod in &list {
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let Ok(tcp) = TcpStream::connect((ip.as_str(), 9443)).await else {
            return false;
        };
        let name = rustls::pki_types::ServerName::try_from(WEBHOOK_HOST)
            .expect("a DNS name")
            .to_owned();
        if tls.connect(name, tcp).await.is_err() {
            return false;
        }
        serving += 1;
    }
    serving == REPLICAS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_as_pods_rotate_their_ca_under_admissions_without_a_failure() {
    let env = support::cell(Cell::Nodes).await;
    super::INSTALLED.store(false, Ordering::SeqCst);
    tokio::task::block_in_place(|| support::nodes::uninstall(&env));
    let image = tokio::task::block_in_place(|| support::release::current_image(&env));

    // Nothing prepared: this build's manifests, three replicas, short
    // validities.
    let work = tempfile::tempdir().expect("a temp dir");
    let patch = format!(
        "patches:\n  - target: {{kind: Deployment, name: openflux}}\n    patch: |-\n\
         \x20     - {{op: replace, path: /spec/replicas, value: {REPLICAS}}}\n\
         \x20     - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --webhook-cert-validity={CERT_VALIDITY}}}\n\
         \x20     - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --webhook-ca-validity={CA_VALIDITY}}}\n"
    );
    overlay::write(
        work.path(),
        &support::workspace_root().join("manifests"),
        &image,
        &patch,
    );
    let out = env.run_kubectl(&["apply", "-k", &work.path().display().to_string()], None);
    assert!(
        out.status.success(),
        "kubectl apply -k: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    all_available(&env, "openflux-system", &["openflux"]).await;

    // A producer's own kind with an exported Artifact: what admissions name.
    support::install_test_source_crd(&env, GROUP).await;
    support::wait_established(&env, &[&format!("testsources.{GROUP}")]).await;
    let ns = env.namespace("nodes-rotation").await;
    let n = ns.name().to_string();
    let source_api = format!("{GROUP}/v1");
    let spec = support::openflux::publish(
        env.fixtures(),
        &n,
        "s",
        "1",
        &[(
            "app.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rotated\n",
        )],
    );
    let source = env
        .apply(&json!({
            "apiVersion": source_api, "kind": "TestSource",
            "metadata": {"name": "s", "namespace": n}, "spec": {"anything": "goes"}
        }))
        .await
        .expect("a custom source");
    env.apply(&json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
        "metadata": {"name": "s", "namespace": n, "ownerReferences": [{
            "apiVersion": source_api, "kind": "TestSource", "name": "s",
            "uid": source.uid().expect("a uid"), "controller": true
        }]},
        "spec": spec,
    }))
    .await
    .expect("the custom source's Artifact");

    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "openflux-system");
    let reference = json!({"apiVersion": source_api, "kind": "TestSource", "name": "s"});
    let admissions = Admissions::naming(&env, &n, reference, 2, Duration::from_millis(100)).await;
    let started = Instant::now();
    support::wait_for("admissions answered", ROLLOUT, || async {
        (admissions.answered() >= 10).then_some(())
    })
    .await;
    let first = secret_cas(&secrets).await;
    assert_eq!(
        first.len(),
        1,
        "one CA in the Secret openflux made, before its rotation"
    );
    let first = first[0].clone();

    // A new CA signs what every Pod serves, then the old one leaves.
    let new_ca = support::wait_for(
        "a new CA to sign what every Pod serves",
        ROTATION,
        || async {
            let cas = secret_cas(&secrets).await;
            let signer = cas.first().filter(|ca| **ca != first)?.clone();
            every_pod_serves_from(&env, &signer).await.then_some(signer)
        },
    )
    .await;
    let rotated_in = started.elapsed();
    support::wait_for("the old CA to leave the Secret", ROTATION, || async {
        (secret_cas(&secrets).await == vec![new_ca.clone()]).then_some(())
    })
    .await;
    let after = admissions.answered();
    support::wait_for("admissions after the rotation", ROLLOUT, || async {
        (admissions.answered() >= after + 20).then_some(())
    })
    .await;
    let tally = admissions.stop().await;
    println!(
        "CA rotation with {REPLICAS} Pods: new CA served by every Pod {rotated_in:?} after the load started; admissions {} answered, {} failed",
        tally.answered,
        tally.failures.len()
    );
    tally.assert_none_failed("the rotation");

    // Both configurations trust the new CA.
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let mut bundles: Vec<(String, Vec<u8>)> = Vec::new();
    let m = mutating
        .get("openflux")
        .await
        .expect("the mutating configuration");
    for w in m.webhooks.unwrap_or_default() {
        bundles.push((
            w.name,
            w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default(),
        ));
    }
    let v = validating
        .get("openflux")
        .await
        .expect("the validating configuration");
    for w in v.webhooks.unwrap_or_default() {
        bundles.push((
            w.name,
            w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default(),
        ));
    }
    let new_der = pem::parse(&new_ca).expect("the new CA").into_contents();
    for (name, bundle) in bundles {
        let trusted: Vec<Vec<u8>> = pem::parse_many(&bundle)
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.into_contents())
            .collect();
        assert!(
            trusted.contains(&new_der),
            "{name} does not trust the new CA"
        );
    }
    ns.delete().await;
}
