//! End to end across the Flux matrix: one scenario on every control plane of
//! [`Cell::ALL`] — the tests' own (whatever feature gates it runs), the
//! current Flux line with `ExternalArtifact=true`, and the Flux 2.7 line
//! with Flux's default flags. A custom source with an openflux Artifact
//! served by the fixtures is consumed by an unchanged Kustomization
//! (`spec.sourceRef`) and an unchanged HelmRelease (`spec.chartRef` to a
//! packaged chart); both must become Ready and apply the content.
//!
//! Which kind openflux rewrites the references to is its own decision per
//! cluster and consumer: the test prints it (run with `--nocapture` to see
//! it) and checks what any choice must satisfy, not the choice itself.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject};
use kube::ResourceExt;
use openflux_testkit as support;
use serde_json::{json, Value};
use support::openflux::{publish, Openflux};
use support::webhook::Webhook;
use support::{condition, field, ready_condition, Cell, Env, TIMEOUT};

const ARTIFACT: &str = "openflux.dev/v1alpha1";
const SOURCE_GROUP: &str = "source.toolkit.fluxcd.io/";
const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const HELM: &str = "helm.toolkit.fluxcd.io/v2";
const TEST_GROUP: &str = "e2e.openflux.dev";
const TEST_SOURCE: &str = "e2e.openflux.dev/v1";
const ANNOTATION: &str = "openflux.dev/source-ref";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tests_control_plane() {
    scenario(Cell::Main).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_line_with_external_artifact_gate() {
    scenario(Cell::CurrentExternalArtifact).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flux_2_7_with_default_flags() {
    scenario(Cell::Flux27Default).await;
}

/// One consumer's outcome: what its reference was rewritten to, or why it
/// did not work.
type Outcome = Result<String, String>;

async fn scenario(cell: Cell) {
    let env = support::cell(cell).await;
    let label = format!(
        "cell {cell} (Flux line {}, feature gates '{}')",
        env.flux_line().unwrap_or("unknown"),
        env.feature_gates().unwrap_or("unknown")
    );
    let (ns, n, _of, _webhook) = set_up(&env, &format!("matrix-{cell}")).await;

    let (kustomization, helm_release) =
        tokio::join!(kustomization(&env, &n, cell), helm_release(&env, &n, cell));
    let outcomes = [
        ("Kustomization", kustomization),
        ("HelmRelease", helm_release),
    ];
    for (consumer, outcome) in &outcomes {
        match outcome {
            Ok(chosen) => println!("{label}: {consumer} {chosen}"),
            Err(why) => println!("{label}: {consumer} FAILED: {why}"),
        }
    }
    let failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(consumer, outcome)| {
            outcome
                .as_ref()
                .err()
                .map(|why| format!("{consumer}: {why}"))
        })
        .collect();
    assert!(failures.is_empty(), "{label}:\n  {}", failures.join("\n  "));
    ns.delete().await;
}

/// Turning kustomize-controller's and helm-controller's ExternalArtifact
/// gate off and on again moves the consumers openflux rewrote between the
/// shadow and the ExternalArtifact, with no action on them and without a
/// reconciliation failing for the gate; what they pointed at before goes
/// once they have moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_the_gate_off_and_on_moves_the_consumers() {
    gate_round_trip(
        Cell::CurrentExternalArtifact,
        &[
            ("", "OCIRepository"),
            ("ExternalArtifact=true", "ExternalArtifact"),
        ],
    )
    .await;
}

/// The same on the oldest Flux line proven, which starts with the gate off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_the_gate_on_and_off_moves_the_consumers_on_flux_2_7() {
    gate_round_trip(
        Cell::Flux27Default,
        &[
            ("ExternalArtifact=true", "ExternalArtifact"),
            ("", "OCIRepository"),
        ],
    )
    .await;
}

/// Consumers created in `cell` with its own gates, then each `(gates,
/// kind)` in turn: the gates set, both consumers moved to `kind` and Ready.
async fn gate_round_trip(cell: Cell, steps: &[(&str, &str)]) {
    let env = support::cell(cell).await;
    let (ns, n, _of, _webhook) = set_up(&env, "gates").await;
    let (ks, hr) = tokio::join!(kustomization(&env, &n, cell), helm_release(&env, &n, cell));
    // Where the steps end is where the cell starts.
    let start = steps.last().map_or("", |s| s.1);
    for outcome in [&ks, &hr] {
        let chosen = outcome
            .as_ref()
            .expect("both consumers Ready with the cell's own gates");
        assert!(chosen.contains(&format!(" {start}/")), "{chosen}");
    }
    for &(gates, kind) in steps {
        support::set_feature_gates(&env, gates).await;
        for (api_version, consumer, pointer) in [
            (KUSTOMIZE, "Kustomization", "/spec/sourceRef/kind"),
            (HELM, "HelmRelease", "/spec/chartRef/kind"),
        ] {
            let what = format!("{consumer} {n}/web on {kind} with gates '{gates}', Ready");
            poll(&what, || async {
                let Some(o) = env.find(api_version, consumer, &n, "web").await else {
                    return Progress::Waiting("not found".into());
                };
                let ready = ready_condition(&o);
                if let Some((_, _, message)) = &ready {
                    if message.contains("feature gate is disabled") {
                        return Progress::Failed(format!("refused for the gate: {message}"));
                    }
                }
                let now = field(&o, pointer)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let observed = field(&o, "/status/observedGeneration").and_then(Value::as_i64);
                let done = now == kind
                    && observed == o.metadata.generation
                    && ready.as_ref().is_some_and(|r| r.0 == "True");
                match done {
                    true => Progress::Done(()),
                    false => Progress::Waiting(format!("on {now}, ready {ready:?}")),
                }
            })
            .await
            .unwrap_or_else(|why| panic!("{what}: {why}"));
        }
        // What they pointed at before goes once nothing refers to it.
        let old = if kind == "OCIRepository" {
            "ExternalArtifact"
        } else {
            "OCIRepository"
        };
        poll(&format!("the {old} export to go"), || async {
            let left = env
                .find(
                    "source.toolkit.fluxcd.io/v1",
                    old,
                    &n,
                    &openflux::names::identity::source_export_name(
                        "e2e.openflux.dev",
                        "TestSource",
                        "web",
                    ),
                )
                .await;
            match left {
                None => Progress::Done(()),
                Some(_) => Progress::Waiting("still there".into()),
            }
        })
        .await
        .unwrap_or_else(|why| panic!("{why}"));
    }
    ns.delete().await;
}

/// An unchanged Kustomization whose sourceRef names the custom source.
async fn kustomization(env: &Env, ns: &str, cell: Cell) -> Outcome {
    let value = format!("kustomization-in-{cell}");
    let fx = env.fixtures();
    let spec = publish(
        fx,
        ns,
        "web",
        "v1",
        &[("configmap.yaml", &support::configmap_yaml(&value))],
    );
    custom_source(env, ns, "web", &spec).await?;
    let original = json!({"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web"});
    let stored = env
        .apply(&json!({
            "apiVersion": KUSTOMIZE, "kind": "Kustomization",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"interval": "10m", "retryInterval": "5s", "prune": true, "path": "./",
                     "targetNamespace": ns, "sourceRef": original}
        }))
        .await
        .map_err(|e| format!("creating it: {e:#}"))?;
    let chosen = rewritten(&stored, "/spec/sourceRef", &original)?;
    consumed(env, ns, KUSTOMIZE, "Kustomization", &chosen, &spec).await?;
    configmap(env, ns, "app-config", &value).await?;
    Ok(format!("sourceRef -> {chosen}"))
}

/// An unchanged HelmRelease whose chartRef names a custom source that
/// publishes a packaged chart.
async fn helm_release(env: &Env, ns: &str, cell: Cell) -> Outcome {
    let value = format!("helm-release-in-{cell}");
    let fx = env.fixtures();
    // helm-controller takes the chart version from the artifact revision.
    let spec = publish(
        fx,
        ns,
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
    custom_source(env, ns, "chart", &spec).await?;
    let original = json!({"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "chart"});
    let stored = env
        .apply(&json!({
            "apiVersion": HELM, "kind": "HelmRelease",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"interval": "10m", "chartRef": original, "values": {"value": value}}
        }))
        .await
        .map_err(|e| format!("creating it: {e:#}"))?;
    let chosen = rewritten(&stored, "/spec/chartRef", &original)?;
    consumed(env, ns, HELM, "HelmRelease", &chosen, &spec).await?;
    configmap(env, ns, "web-hello", &value).await?;
    Ok(format!("chartRef -> {chosen}"))
}

/// The reference a consumer was stored with: a Flux source kind (any
/// openflux chooses), the original kept in the annotation.
struct Chosen {
    api_version: String,
    kind: String,
    name: String,
}

impl std::fmt::Display for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.api_version, self.kind, self.name)
    }
}

fn rewritten(stored: &DynamicObject, pointer: &str, original: &Value) -> Result<Chosen, String> {
    let reference = field(stored, pointer).cloned().unwrap_or(Value::Null);
    let text = |key: &str| reference[key].as_str().unwrap_or_default().to_string();
    let chosen = Chosen {
        api_version: text("apiVersion"),
        kind: text("kind"),
        name: text("name"),
    };
    if !chosen.api_version.starts_with(SOURCE_GROUP)
        || chosen.kind.is_empty()
        || chosen.kind == "TestSource"
        || chosen.name.is_empty()
    {
        return Err(format!(
            "{pointer} was not rewritten to a Flux source: stored {reference}"
        ));
    }
    let kept = stored
        .annotations()
        .get(ANNOTATION)
        .and_then(|a| serde_json::from_str::<Value>(a).ok());
    if kept.as_ref() != Some(original) {
        return Err(format!(
            "annotation {ANNOTATION} is {kept:?}, not the original reference {original}"
        ));
    }
    Ok(chosen)
}

/// Waits until the exported object carries the published artifact, asks
/// the consumer to reconcile now (it may have backed off while the export
/// was missing), then until the consumer is Ready. A consumer that stalls
/// fails at once with its message.
async fn consumed(
    env: &Env,
    ns: &str,
    api_version: &str,
    kind: &str,
    chosen: &Chosen,
    spec: &Value,
) -> Result<(), String> {
    let digest = spec["digest"].as_str().unwrap_or_default();
    let exported = poll(&format!("{chosen} to carry digest {digest}"), || async {
        let Some(export) = env
            .find(&chosen.api_version, &chosen.kind, ns, &chosen.name)
            .await
        else {
            return Progress::Waiting("it does not exist".into());
        };
        match field(&export, "/status/artifact/digest").and_then(Value::as_str) {
            Some(d) if d == digest => Progress::Done(()),
            other => Progress::Waiting(format!("status.artifact.digest is {other:?}")),
        }
    })
    .await;
    if let Err(e) = exported {
        return Err(format!("{e}; {}", artifact_status(env, ns).await));
    }
    support::request_reconcile(&env.client, api_version, kind, ns, "web")
        .await
        .map_err(|e| format!("{e:#}"))?;
    poll(&format!("{kind} {ns}/web to be Ready"), || async {
        let Some(obj) = env.find(api_version, kind, ns, "web").await else {
            return Progress::Waiting("it does not exist".into());
        };
        if let Some((_, reason, message)) =
            condition(&obj, "Stalled").filter(|(status, _, _)| status == "True")
        {
            return Progress::Failed(format!("Stalled=True ({reason}): {message}"));
        }
        match ready_condition(&obj) {
            Some((status, _, _)) if status == "True" => Progress::Done(()),
            Some((status, reason, message)) => {
                Progress::Waiting(format!("Ready={status} ({reason}): {message}"))
            }
            None => Progress::Waiting("no Ready condition yet".into()),
        }
    })
    .await
    .map_err(|e| format!("{e} (its reference: {chosen})"))
}

/// The Ready condition of the Artifacts in `ns`, for failure messages.
async fn artifact_status(env: &Env, ns: &str) -> String {
    let Ok((api, _)) = support::dynamic_api(&env.client, ARTIFACT, "Artifact", Some(ns)).await
    else {
        return "the Artifact API is not served".into();
    };
    let Ok(list) = api.list(&Default::default()).await else {
        return "listing the Artifacts failed".into();
    };
    let states: Vec<String> = list
        .items
        .iter()
        .map(|a| match ready_condition(a) {
            Some((status, reason, message)) => {
                format!(
                    "Artifact {}: Ready={status} ({reason}): {message}",
                    a.name_any()
                )
            }
            None => format!("Artifact {}: no Ready condition", a.name_any()),
        })
        .collect();
    states.join("; ")
}

/// What one look at the cluster found.
enum Progress<T> {
    Done(T),
    /// Not yet: what was seen.
    Waiting(String),
    /// Will not happen: why.
    Failed(String),
}

/// Polls `check` every 250 ms, at most [`TIMEOUT`]: its value, or why not
/// (the last thing seen when the bound is reached).
async fn poll<T, F, Fut>(what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Progress<T>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Progress::Done(value) => return Ok(value),
            Progress::Failed(why) => return Err(format!("waiting for {what}: {why}")),
            Progress::Waiting(seen) if start.elapsed() >= TIMEOUT => {
                return Err(format!(
                    "timed out after {TIMEOUT:?} waiting for {what}; last seen: {seen}"
                ))
            }
            Progress::Waiting(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Waits until ConfigMap `name` holds `value` under `data.value`.
async fn configmap(env: &Env, ns: &str, name: &str, value: &str) -> Result<(), String> {
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns);
    poll(
        &format!("ConfigMap {ns}/{name} to hold {value:?}"),
        || async {
            match cms.get_opt(name).await {
                Ok(Some(cm)) => match cm.data.as_ref().and_then(|d| d.get("value")) {
                    Some(v) if v == value => Progress::Done(()),
                    other => Progress::Waiting(format!("data.value is {other:?}")),
                },
                Ok(None) => Progress::Waiting("it does not exist".into()),
                Err(e) => Progress::Waiting(format!("reading it: {e}")),
            }
        },
    )
    .await
}

/// A custom source `name` and an Artifact (also `name`) it owns, with `spec`.
async fn custom_source(env: &Env, ns: &str, name: &str, spec: &Value) -> Result<(), String> {
    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"anything": "goes"}
        }))
        .await
        .map_err(|e| format!("creating the custom source: {e:#}"))?;
    let uid = source.uid().ok_or("the custom source has no uid")?;
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [{
            "apiVersion": TEST_SOURCE, "kind": "TestSource", "name": name,
            "uid": uid, "controller": true
        }]},
        "spec": spec,
    }))
    .await
    .map_err(|e| format!("writing the Artifact: {e:#}"))?;
    Ok(())
}

/// The CRDs, a fresh namespace (and its name), and openflux with its
/// webhook serving it.
async fn set_up(env: &Env, prefix: &str) -> (support::TestNamespace, String, Openflux, Webhook) {
    support::install_artifact_crd(env).await;
    support::install_test_source_crd(env, TEST_GROUP).await;
    support::wait_established(
        env,
        &["artifacts.openflux.dev", "testsources.e2e.openflux.dev"],
    )
    .await;
    let ns = env.namespace(prefix).await;
    let n = ns.name().to_string();
    let (of, webhook) = start(env, &n).await;
    (ns, n, of, webhook)
}

/// Starts openflux for namespace `ns` with its webhook.
async fn start(env: &Env, ns: &str) -> (Openflux, Webhook) {
    support::webhook::openflux_with_webhook(env, ns, &[]).await
}
