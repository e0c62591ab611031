//! A producer's own source kind (a group and kind made up here, in no
//! manifest of openflux) publishing a packaged chart, consumed by an
//! unchanged HelmRelease that the helm-controller Pod installs.

use kube::ResourceExt;
use openflux_testkit as support;
use serde_json::{json, Value};
use support::field;

use super::{all_available, installed, ANNOTATION, ROLLOUT};

pub(super) const HELM: &str = "helm.toolkit.fluxcd.io/v2";
const ARTIFACT: &str = "openflux.dev/v1alpha1";
const GROUP: &str = "charts.producer.example";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_source_flows_into_an_unchanged_helm_release_applied_by_flux_pods() {
    let env = installed().await;
    all_available(&env, "openflux-system", &["openflux"]).await;
    support::install_test_source_crd(&env, GROUP).await;
    support::wait_established(&env, &[&format!("testsources.{GROUP}")]).await;
    let ns = env.namespace("nodes-helm").await;
    let n = ns.name().to_string();
    let value = format!("installed by the helm-controller Pod in {n}");
    // helm-controller takes the chart's version from the artifact revision.
    let spec = support::openflux::publish(
        env.fixtures(),
        &n,
        "chart",
        "0.1.0",
        &[
            ("hello/Chart.yaml", "apiVersion: v2\nname: hello\nversion: 0.1.0\n"),
            ("hello/values.yaml", "value: default\n"),
            (
                "hello/templates/configmap.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-hello\ndata:\n  value: {{ .Values.value | quote }}\n",
            ),
        ],
    );
    let source_api = format!("{GROUP}/v1");
    let source = env
        .apply(&json!({
            "apiVersion": source_api, "kind": "TestSource",
            "metadata": {"name": "chart", "namespace": n},
            "spec": {"anything": "goes"}
        }))
        .await
        .expect("creating the custom source");
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": "chart", "namespace": n, "ownerReferences": [{
            "apiVersion": source_api, "kind": "TestSource", "name": "chart",
            "uid": source.uid().expect("a uid"), "controller": true
        }]},
        "spec": spec,
    }))
    .await
    .expect("writing the custom source's Artifact");
    let stored = env
        .apply(&json!({
            "apiVersion": HELM, "kind": "HelmRelease",
            "metadata": {"name": "web", "namespace": n},
            "spec": {"interval": "10m",
                     "chartRef": {"apiVersion": source_api, "kind": "TestSource", "name": "chart"},
                     "values": {"value": value}}
        }))
        .await
        .expect("applying the HelmRelease (through openflux's webhook)");
    let kept = stored
        .annotations()
        .get(ANNOTATION)
        .cloned()
        .unwrap_or_default();
    assert!(
        kept.contains("TestSource"),
        "the webhook rewrote the chartRef and kept it in {ANNOTATION}: {kept:?}"
    );
    let kind = field(&stored, "/spec/chartRef/kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    assert!(
        ["OCIRepository", "ExternalArtifact"].contains(&kind.as_str()),
        "the chartRef names an export: {kind}"
    );
    // The chart's ConfigMap, installed by helm-controller.
    support::configmap_holds(&env, &n, "web-hello", &value, ROLLOUT).await;
    println!("{n}: HelmRelease rewritten to {kind}, chart installed");
    ns.delete().await;
}
