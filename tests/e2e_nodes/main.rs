//! openflux installed the way users install it, on real nodes: the nodes
//! cell (`e2e/cluster cell nodes up`: two kubelets with containerd and
//! runc, kube-proxy, CoreDNS, a local registry) runs Flux as Pods laid out
//! as `flux install` lays it out; openflux and the HttpSource controller are
//! installed by the "Install from a clone" block of CONTRIBUTING.md, run word
//! for word (`support::nodes::install_as_the_guide_says`), their images pulled from the
//! cell's registry.
//!
//! The tests share one installation (made by the first test that needs it)
//! and hold the cell one after another. `make test` runs them with the
//! rest, `make test-nodes` alone; they fail, never skip, when the cell
//! cannot start. Faults at the level of Pods are in `faults.rs`, the load
//! that counts them from the client side in `load.rs`.

// Reading exports as the failover scenario does.
#[path = "../chaos/failover.rs"]
mod failover;
mod faults;
mod flux_install;
mod generated_chart;
mod helm;
mod load;
mod overlay;
mod release;
mod repair;
mod rotation;
mod uninstall;
mod upgrade;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use openflux_testkit as support;
use serde_json::{json, Value};
use support::{field, Cell, Env};

const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const HTTP_SOURCE: &str = "sources.openflux.dev/v1alpha1";
const GENERATOR: &str = "source.extensions.fluxcd.io/v1beta1";
const ANNOTATION: &str = "openflux.dev/source-ref";
const FLUX_DEPLOYMENTS: [&str; 4] = [
    "source-controller",
    "kustomize-controller",
    "helm-controller",
    "notification-controller",
];
/// Images, pulls and rollouts on two small nodes take longer than the
/// usual bound.
const ROLLOUT: Duration = Duration::from_secs(300);
/// How long a node's kube-proxy may take to route a Service to new
/// endpoints.
const ROUTED: Duration = Duration::from_secs(60);

/// Whether this process installed openflux as the guide says and nothing
/// replaced that installation since (the tests installing it otherwise
/// clear it).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The nodes cell, with openflux installed as the guide says (once per
/// test process, and again when another process holding the cell in
/// between removed it: the benchmarks' pods section, which `make test`
/// runs beside these tests, installs its own and removes it).
async fn installed() -> Env {
    let env = support::cell(Cell::Nodes).await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), "openflux-system");
    let present = deployments
        .get_opt("openflux")
        .await
        .expect("reading openflux's Deployment")
        .is_some();
    if !(INSTALLED.load(Ordering::SeqCst) && present) {
        // A cell reused from an earlier run may have an older installation,
        // by kubectl or by Flux.
        tokio::task::block_in_place(|| support::nodes::uninstall(&env));
        // Blocking on purpose: the block builds images and waits for rollouts.
        let out = tokio::task::block_in_place(|| support::nodes::install_as_the_guide_says(&env));
        println!(
            "the guide's install block:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        INSTALLED.store(true, Ordering::SeqCst);
    }
    env
}

/// Every Deployment named is Available.
async fn all_available(env: &Env, ns: &str, names: &[&str]) {
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), ns);
    support::wait_for(
        &format!("Deployments {names:?} in {ns} Available"),
        ROLLOUT,
        || {
            let api = api.clone();
            async move {
                for name in names {
                    let d = api.get_opt(name).await.ok().flatten()?;
                    if !support::is_available(&d) {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flux_runs_as_pods_laid_out_as_flux_install_lays_it_out() {
    let env = support::cell(Cell::Nodes).await;
    all_available(&env, "flux-system", &FLUX_DEPLOYMENTS).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "flux-system");
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=flux"))
        .await
        .expect("listing Flux's Pods");
    for name in FLUX_DEPLOYMENTS {
        let pod = list
            .items
            .iter()
            .find(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app"))
                    .is_some_and(|a| a == name)
            })
            .unwrap_or_else(|| panic!("no Pod of {name} in flux-system"));
        let spec = pod.spec.as_ref().expect("a Pod spec");
        let image = spec.containers[0].image.clone().unwrap_or_default();
        assert!(
            image.starts_with(&format!("ghcr.io/fluxcd/{name}:")),
            "{name} runs {image}: `flux install` names ghcr.io/fluxcd/{name}"
        );
        assert!(
            spec.node_name
                .as_deref()
                .is_some_and(|n| n.starts_with("node-")),
            "{name} is not on a node: {:?}",
            spec.node_name
        );
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some(name),
            "{name}'s service account"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_source_flows_into_an_unchanged_kustomization_applied_by_flux_pods() {
    let env = installed().await;
    let kind = custom_source_flows(&env, "nodes-flow").await;
    assert_eq!(
        kind, "OCIRepository",
        "with `flux install`'s defaults (the ExternalArtifact gate off) openflux exports a shadow OCIRepository"
    );
}

/// `flux install --components-extra=source-watcher` turns the
/// ExternalArtifact gate on: openflux sees it in Flux's Deployments and
/// exports an ExternalArtifact, which the kustomize-controller Pod applies.
/// Custom sources feed ArtifactGenerators whose generated artifacts a
/// Kustomization and a HelmRelease consume. Flux goes back to `flux
/// install`'s shape afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_source_watcher_the_custom_source_flows_as_an_external_artifact() {
    let env = installed().await;
    tokio::task::block_in_place(|| support::nodes::flux_install("source-watcher"));
    let mut all = FLUX_DEPLOYMENTS.to_vec();
    all.push("source-watcher");
    all_available(&env, "flux-system", &all).await;
    let kind = custom_source_flows(&env, "nodes-watcher").await;
    custom_source_feeds_an_artifact_generator(&env, "nodes-generator").await;
    generated_chart::custom_sources_feed_a_generated_chart(&env, "nodes-chart").await;
    tokio::task::block_in_place(|| support::nodes::flux_install("default"));
    assert_eq!(
        kind, "ExternalArtifact",
        "with source-watcher (the gate on) openflux exports an ExternalArtifact"
    );
}

/// An HttpSource serving a ConfigMap and an unchanged Kustomization naming
/// it, in a namespace of their own: the webhook rewrites the reference,
/// the kustomize-controller Pod applies the ConfigMap. Returns the kind the
/// reference was rewritten to once the content is applied.
async fn custom_source_flows(env: &Env, prefix: &str) -> String {
    all_available(
        env,
        "openflux-system",
        &["openflux", "openflux-http-source"],
    )
    .await;
    let ns = env.namespace(prefix).await;
    let n = ns.name().to_string();
    let value = format!("applied by the kustomize-controller Pod in {n}");
    let url = env
        .fixtures()
        .put_file(
            &format!("{n}/app.yaml"),
            support::configmap_yaml(&value).as_bytes(),
        )
        .expect("serving the manifest");
    env.apply(&json!({
        "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
        "metadata": {"name": "web", "namespace": n},
        "spec": {"url": url, "interval": "1m"}
    }))
    .await
    .expect("applying the HttpSource");
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "web", "namespace": n},
        "spec": {
            "interval": "1m", "path": "./", "prune": true, "targetNamespace": n,
            "sourceRef": {"apiVersion": HTTP_SOURCE, "kind": "HttpSource", "name": "web"}
        }
    }))
    .await
    .expect("applying the Kustomization (through openflux's webhook)");
    let ks = env
        .find(KUSTOMIZE, "Kustomization", &n, "web")
        .await
        .expect("the Kustomization");
    let kept = ks
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .cloned()
        .unwrap_or_default();
    assert!(
        kept.contains("HttpSource"),
        "the webhook (called at the Pods' addresses) rewrote the reference and kept it in {ANNOTATION}: {kept:?}"
    );
    support::configmap_holds(env, &n, "app-config", &value, ROLLOUT).await;
    let ks = env
        .find(KUSTOMIZE, "Kustomization", &n, "web")
        .await
        .expect("the Kustomization");
    let kind = field(&ks, "/spec/sourceRef/kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    println!("{n}: Kustomization rewritten to {kind}, ConfigMap applied");
    ns.delete().await;
    kind
}

/// An HttpSource named in an unchanged ArtifactGenerator, by kind and name
/// as source-watcher's schema takes them: openflux points the entry at the
/// source's export (a name source-watcher's schema accepts), source-watcher
/// generates an ExternalArtifact from the source's content, and the
/// kustomize-controller Pod applies what was generated. New content under
/// the source reaches the generated artifact and the cluster.
async fn custom_source_feeds_an_artifact_generator(env: &Env, prefix: &str) {
    let ns = env.namespace(prefix).await;
    let n = ns.name().to_string();
    let serve = |value: &str| {
        env.fixtures()
            .put_file(
                &format!("{n}/app.yaml"),
                support::configmap_yaml(value).as_bytes(),
            )
            .expect("serving the manifest")
    };
    let url = serve("generated from the first content");
    env.apply(&json!({
        "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
        "metadata": {"name": "web", "namespace": n},
        "spec": {"url": url, "interval": "10m"}
    }))
    .await
    .expect("applying the HttpSource");
    env.apply(&json!({
        "apiVersion": GENERATOR, "kind": "ArtifactGenerator",
        "metadata": {"name": "gen", "namespace": n},
        "spec": {
            "sources": [{"alias": "web", "kind": "HttpSource", "name": "web"}],
            "artifacts": [{"name": "generated", "copy": [{"from": "@web/**", "to": "@artifact/"}]}]
        }
    }))
    .await
    .expect(
        "applying the ArtifactGenerator (through openflux's webhook, then source-watcher's schema)",
    );
    let generator = env
        .find(GENERATOR, "ArtifactGenerator", &n, "gen")
        .await
        .expect("the ArtifactGenerator");
    let entry = field(&generator, "/spec/sources/0")
        .cloned()
        .unwrap_or_default();
    let export =
        openflux::names::identity::source_export_name("sources.openflux.dev", "HttpSource", "web");
    assert_eq!(
        entry,
        json!({"alias": "web", "kind": "ExternalArtifact", "name": export}),
        "the entry points at the HttpSource's export"
    );
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "generated", "namespace": n},
        "spec": {
            "interval": "10m", "path": "./", "prune": true, "targetNamespace": n,
            "sourceRef": {"kind": "ExternalArtifact", "name": "generated"}
        }
    }))
    .await
    .expect("applying the Kustomization of the generated artifact");
    let applied = |value| support::configmap_holds(env, &n, "app-config", value, ROLLOUT);
    applied("generated from the first content").await;
    serve("generated from new content");
    support::request_reconcile(&env.client, HTTP_SOURCE, "HttpSource", &n, "web")
        .await
        .expect("asking the HttpSource to fetch again");
    applied("generated from new content").await;
    println!("{n}: ArtifactGenerator fed by an HttpSource, both contents applied");
    ns.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_answers_through_its_service_cluster_ip() {
    let env = installed().await;
    all_available(&env, "openflux-system", &["openflux"]).await;
    let services: Api<Service> = Api::namespaced(env.client.clone(), "openflux-system");
    let ip = services
        .get("openflux-webhook")
        .await
        .expect("the webhook Service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP");
    // The CA the API server trusts for the webhook.
    let ca = load::webhook_ca(&env);
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca_path = dir.path().join("ca.crt");
    std::fs::write(&ca_path, &ca).expect("writing ca.crt");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "e2e-nodes-cluster-ip",
            "kind": {"group": "kustomize.toolkit.fluxcd.io", "version": "v1", "kind": "Kustomization"},
            "resource": {"group": "kustomize.toolkit.fluxcd.io", "version": "v1", "resource": "kustomizations"},
            "operation": "CREATE", "namespace": "default", "name": "web",
            "userInfo": {"username": "e2e"},
            "dryRun": true,
            "object": {
                "apiVersion": KUSTOMIZE, "kind": "Kustomization",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"interval": "1m", "path": "./", "prune": true,
                          "sourceRef": {"apiVersion": HTTP_SOURCE, "kind": "HttpSource", "name": "web"}}
            }
        }
    })
    .to_string();
    let host = "openflux-webhook.openflux-system.svc";
    for (node, _) in support::nodes::node_netns(&env) {
        let post = || {
            support::nodes::in_node(
                &env,
                &node,
                "curl",
                &[
                    "-sS",
                    "--max-time",
                    "10",
                    "--cacert",
                    ca_path.to_str().expect("a UTF-8 path"),
                    "--resolve",
                    &format!("{host}:443:{ip}"),
                    "-H",
                    "Content-Type: application/json",
                    "--data-binary",
                    &review,
                    &format!("https://{host}/mutate"),
                ],
            )
        };
        // The Deployment is Available before each node's kube-proxy has
        // written the Service's rules for its new endpoints: until then a
        // connection to the ClusterIP is refused. Retried, bounded.
        let deadline = std::time::Instant::now() + ROUTED;
        let out = loop {
            let out = post();
            if out.status.success() || std::time::Instant::now() >= deadline {
                break out;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "POST https://{host}/mutate at the ClusterIP {ip} from {node} (through kube-proxy), for {ROUTED:?}: {}{}",
            body,
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| {
            panic!("the webhook's answer from {node} is not JSON ({e}): {body}")
        });
        assert_eq!(
            answer.pointer("/response/uid").and_then(Value::as_str),
            Some("e2e-nodes-cluster-ip"),
            "{body}"
        );
        assert_eq!(
            answer.pointer("/response/allowed").and_then(Value::as_bool),
            Some(true),
            "{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_runs_as_non_root_with_a_read_only_root_file_system() {
    let env = installed().await;
    all_available(
        &env,
        "openflux-system",
        &["openflux", "openflux-http-source"],
    )
    .await;
    // The processes themselves, on the nodes (their cgroups are the nodes').
    for binary in ["openflux", "openflux-http-source"] {
        let pids = support::nodes::node_processes(binary);
        assert!(!pids.is_empty(), "no {binary} process runs on the nodes");
        for pid in pids {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>();
            assert!(
                !uid.is_empty() && uid.iter().all(|u| *u == "65532"),
                "{binary} (pid {pid}) runs as uids {uid:?}, not 65532"
            );
            let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
                .unwrap_or_else(|e| panic!("/proc/{pid}/mountinfo: {e}"));
            let root = mounts
                .lines()
                .find(|l| l.split_whitespace().nth(4) == Some("/"))
                .unwrap_or_else(|| panic!("{binary} (pid {pid}) has no root mount"));
            let options = root.split_whitespace().nth(5).unwrap_or_default();
            assert!(
                options.split(',').any(|o| o == "ro"),
                "{binary} (pid {pid}) has a writable root file system: {root}"
            );
        }
    }
}

/// One node is lost (its link goes down, its kubelet, containers and
/// containerd are killed): admissions keep being answered, by the replica
/// on the other node once the lost one's endpoint is gone. Prints how long
/// admissions failed and how many (docs/reliability.md); the node comes
/// back at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_node_is_lost_the_other_replica_answers_admissions() {
    use kube::api::{DynamicObject, PostParams};
    use std::time::Instant;

    let env = installed().await;
    all_available(&env, "openflux-system", &["openflux"]).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "openflux-system");
    let replicas = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=openflux"))
        .await
        .expect("listing openflux's Pods");
    let mut nodes: Vec<String> = replicas
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(
        nodes.len(),
        2,
        "openflux's two replicas should run on two nodes (preferred anti-affinity): {nodes:?}"
    );
    let lost = nodes[1].clone();
    let number = lost.trim_start_matches("node-").to_string();
    let ns = env.namespace("nodes-lost").await;
    let n = ns.name().to_string();
    let (api, _) = support::dynamic_api(&env.client, KUSTOMIZE, "Kustomization", Some(&n))
        .await
        .expect("the Kustomization API");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let admit = |i: usize| {
        let api = api.clone();
        let dry_run = dry_run.clone();
        let n = n.clone();
        async move {
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": KUSTOMIZE, "kind": "Kustomization",
                "metadata": {"name": format!("web-{i}"), "namespace": n},
                "spec": {"interval": "1m", "path": "./", "prune": true,
                          "sourceRef": {"apiVersion": HTTP_SOURCE, "kind": "HttpSource", "name": "web"}}
            }))
            .expect("a Kustomization");
            api.create(&dry_run, &obj).await.map(|_| ())
        }
    };
    // Both replicas answer before.
    for i in 0..10 {
        admit(i).await.expect("admission before the node is lost");
    }
    tokio::task::block_in_place(|| support::nodes::stop_node(&number));
    let stopped = Instant::now();
    let (mut total, mut failed, mut streak) = (0usize, 0usize, 0usize);
    let (mut first_failure, mut last_failure) = (None, None);
    let bound = Duration::from_secs(240);
    while streak < 40 {
        assert!(
            stopped.elapsed() < bound,
            "admissions still failed {:?} after {lost} was lost ({failed} of {total} failed, last: {last_failure:?})",
            bound
        );
        total += 1;
        let started = stopped.elapsed();
        match admit(total + 10).await {
            Ok(()) => streak += 1,
            Err(e) => {
                failed += 1;
                streak = 0;
                first_failure.get_or_insert(started);
                last_failure = Some(stopped.elapsed());
                if failed <= 3 {
                    println!("admission failed {started:?} after the loss: {e}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{lost} lost: {failed} of {total} admissions failed, the first {first_failure:?} and the last {last_failure:?} after the loss; then 40 in a row answered by the other replica"
    );
    tokio::task::block_in_place(|| support::nodes::start_node(&number));
    all_available(
        &env,
        "openflux-system",
        &["openflux", "openflux-http-source"],
    )
    .await;
    ns.delete().await;
}
