//! Proves the matrix cells and the Flux Deployments of the local control
//! plane: every cell runs its line and gates, its Deployments in
//! flux-system describe the running controllers (labels, `manager`
//! container, exact `--feature-gates`, a complete rollout), and
//! `set_feature_gates` really restarts kustomize-controller with other gates
//! (Flux itself says so) while the Deployments follow; the next `cell`
//! restores a cell's own gates.

use openflux_testkit as support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};
use serde_json::json;
use support::{condition, ready_condition, set_feature_gates, wait_for, Cell, Env, TIMEOUT};

/// The Flux Deployments: name -> (manager args, image, rolled out).
async fn deployments(env: &Env) -> Vec<(String, Vec<String>, String, bool)> {
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), "flux-system");
    let list = api
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=flux"))
        .await
        .expect("listing the Deployments in flux-system");
    let mut found = Vec::new();
    for d in list.items {
        let name = d.metadata.name.clone().unwrap_or_default();
        let labels = d.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("app.kubernetes.io/component"), Some(&name));
        assert_eq!(
            labels.get("app.kubernetes.io/instance").map(String::as_str),
            Some("flux-system")
        );
        let spec = d.spec.as_ref().expect("a Deployment spec");
        assert_eq!(spec.replicas, Some(1), "{name}");
        let pod = spec.template.spec.as_ref().expect("a pod template");
        let manager = pod
            .containers
            .iter()
            .find(|c| c.name == "manager")
            .unwrap_or_else(|| panic!("{name}: no container named manager"));
        let status = d.status.clone().unwrap_or_default();
        let rolled_out = status.observed_generation == d.metadata.generation
            && status.updated_replicas == Some(1)
            && status.available_replicas == Some(1);
        found.push((
            name,
            manager.args.clone().unwrap_or_default(),
            manager.image.clone().unwrap_or_default(),
            rolled_out,
        ));
    }
    found.sort();
    found
}

/// Checks the Deployments against the controllers a line runs and the
/// gates kustomize-controller and helm-controller should have.
async fn assert_deployments(env: &Env, controllers: &[&str], gates: &str) {
    let found = deployments(env).await;
    let names: Vec<&str> = found.iter().map(|(n, ..)| n.as_str()).collect();
    let mut want = controllers.to_vec();
    want.sort();
    assert_eq!(names, want, "{}: Flux Deployments", env.cell);
    for (name, args, image, rolled_out) in &found {
        assert!(
            image.starts_with(&format!("fluxcd/{name}:v")),
            "{name}: image {image}"
        );
        assert!(rolled_out, "{}: {name} is not rolled out", env.cell);
        let flags: Vec<&String> = args
            .iter()
            .filter(|a| a.starts_with("--feature-gates"))
            .collect();
        let expected = match name.as_str() {
            "kustomize-controller" | "helm-controller" if !gates.is_empty() => {
                vec![format!("--feature-gates={gates}")]
            }
            _ => vec![],
        };
        assert_eq!(
            flags,
            expected.iter().collect::<Vec<_>>(),
            "{name}: {args:?}"
        );
    }
}

/// What kustomize-controller says about a reference to an ExternalArtifact:
/// whether it refuses it because the gate is off.
async fn gate_refused(env: &Env, ns: &str, name: &str) -> bool {
    env.apply(&json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"interval": "10m", "retryInterval": "5s", "prune": true, "path": "./",
                 "sourceRef": {"kind": "ExternalArtifact", "name": "absent"}}
    }))
    .await
    .expect("creating a Kustomization");
    wait_for(
        &format!("kustomize-controller to judge Kustomization {ns}/{name}"),
        TIMEOUT,
        || async {
            let ks = env
                .find("kustomize.toolkit.fluxcd.io/v1", "Kustomization", ns, name)
                .await?;
            let (status, _, message) = ready_condition(&ks)?;
            if status != "False" {
                return None;
            }
            if message.contains("ExternalArtifact feature gate is disabled") {
                assert_eq!(
                    condition(&ks, "Stalled").map(|c| c.0).as_deref(),
                    Some("True")
                );
                Some(true)
            } else {
                message.contains("not found").then_some(false)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_feature_gates_restarts_the_controllers_and_updates_the_deployments() {
    let all = [
        "notification-controller",
        "source-controller",
        "kustomize-controller",
        "helm-controller",
        "source-watcher",
    ];
    let env = support::cell(Cell::CurrentExternalArtifact).await;
    assert_eq!(env.feature_gates(), Some("ExternalArtifact=true"));
    assert_deployments(&env, &all, "ExternalArtifact=true").await;
    let ns = env.namespace("cells-gates").await;
    assert!(!gate_refused(&env, ns.name(), "on").await, "the gate is on");

    set_feature_gates(&env, "").await;
    assert_deployments(&env, &all, "").await;
    assert!(
        gate_refused(&env, ns.name(), "off").await,
        "the gate is off"
    );
    ns.delete().await;
    drop(env);

    // The next test on this cell gets the cell's own gates back.
    let env = support::cell(Cell::CurrentExternalArtifact).await;
    assert_eq!(env.feature_gates(), Some("ExternalArtifact=true"));
    assert_deployments(&env, &all, "ExternalArtifact=true").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flux_2_7_cell_runs_its_line_with_flux_defaults() {
    let env = support::cell(Cell::Flux27Default).await;
    assert_eq!(env.flux_line(), Some("2.7"));
    assert_eq!(env.feature_gates(), Some(""));
    assert!(
        env.fixtures().watcher_storage_addr.is_none(),
        "2.7 has no source-watcher"
    );
    assert_deployments(
        &env,
        &[
            "source-controller",
            "kustomize-controller",
            "helm-controller",
        ],
        "",
    )
    .await;
    let ns = env.namespace("cells-27").await;
    assert!(
        gate_refused(&env, ns.name(), "off").await,
        "the gate is off"
    );
    ns.delete().await;
}
