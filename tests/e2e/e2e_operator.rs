//! End to end: flux-operator's ResourceSetInputProvider of type
//! `ExternalArtifact` reads a custom source through openflux's export, and
//! the producer's declared inputs reach the export's
//! `status.exportedInputs` where the ExternalArtifact API has that field
//! (Flux 2.10's), decided from the CRD the API server serves.
//!
//! flux-operator (the version pinned in e2e/versions.env, built with Go
//! 1.27) runs as a process beside the local control plane with the stock
//! Flux 2.9 controllers, whose feature gates stay as the control plane has
//! them: the export flux-operator reads exists whatever they say. Its own
//! binary: the test changes cluster-wide things (flux-operator's CRDs, the
//! ExternalArtifact CRD) and puts them back at its end.

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::core::DynamicObject;
use openflux_testkit as support;
use serde_json::{json, Value};
use support::openflux::publish;
use support::operator::{flux_2_10_crds, yaml_documents, FluxOperator};
use support::webhook::openflux_with_webhook;
use support::writers;
use support::{cluster, field, ready_condition, wait_for, Env, TIMEOUT};

const ARTIFACT: &str = "openflux.dev/v1alpha1";
const SOURCE: &str = "source.toolkit.fluxcd.io/v1";
const OPERATOR: &str = "fluxcd.controlplane.io/v1";
const TEST_GROUP: &str = "operator.e2e.openflux.dev";
const EXTERNAL_ARTIFACT_CRD: &str = "source.toolkit.fluxcd.io_externalartifacts.yaml";

/// The ExternalArtifact openflux exported Artifact `ns`/`name` as, once it
/// satisfies `ok`.
async fn external_artifact(
    env: &Env,
    ns: &str,
    name: &str,
    ok: impl Fn(&DynamicObject) -> bool,
) -> DynamicObject {
    let (api, _) = support::dynamic_api(&env.client, SOURCE, "ExternalArtifact", Some(ns))
        .await
        .expect("the ExternalArtifact API");
    let selector = format!("openflux.dev/artifact={name}");
    wait_for(
        &format!("an ExternalArtifact exported for Artifact {ns}/{name}"),
        TIMEOUT,
        || async {
            let list = api
                .list(&kube::api::ListParams::default().labels(&selector))
                .await
                .ok()?;
            list.items.into_iter().find(|o| ok(o))
        },
    )
    .await
}

/// The Artifact's `Ready` message once `ok` holds for it.
async fn artifact_message(env: &Env, ns: &str, name: &str, ok: impl Fn(&str) -> bool) -> String {
    wait_for(
        &format!("Artifact {ns}/{name}'s Ready message"),
        TIMEOUT,
        || async {
            let artifact = env.find(ARTIFACT, "Artifact", ns, name).await?;
            let (status, _, message) = ready_condition(&artifact)?;
            (status == "True" && ok(&message)).then_some(message)
        },
    )
    .await
}

/// Applies the ExternalArtifact CRD of `dir` (a Flux release's CRDs).
async fn apply_external_artifact_crd(env: &Env, dir: &Path) {
    for crd in yaml_documents(&dir.join(EXTERNAL_ARTIFACT_CRD)) {
        env.apply(&crd).await.unwrap_or_else(|e| {
            panic!(
                "applying the ExternalArtifact CRD of {}: {e:#}",
                dir.display()
            )
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_set_reads_a_custom_source_and_its_inputs_follow_the_api() {
    let env = cluster().await;
    support::install_artifact_crd(&env).await;
    support::install_test_source_crd(&env, TEST_GROUP).await;
    let names = [
        "artifacts.openflux.dev".to_string(),
        format!("testsources.{TEST_GROUP}"),
    ];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    support::wait_established(&env, &names).await;
    println!(
        "Flux line {}, feature gates '{}'",
        env.flux_line().unwrap_or("unknown"),
        env.feature_gates().unwrap_or("unknown")
    );
    let ns = env.namespace("operator").await;
    let n = ns.name().to_string();
    let operator = FluxOperator::start(&env, &n).await;
    // Whatever happens, the control plane is left as it was: Flux 2.9's
    // ExternalArtifact API, no flux-operator.
    let before = env.run_kubectl(
        &[
            "get",
            "crd",
            "externalartifacts.source.toolkit.fluxcd.io",
            "-o",
            "json",
        ],
        None,
    );
    assert!(before.status.success(), "reading the ExternalArtifact CRD");
    let (crds, binding) = operator.cluster_objects();
    let _restore = Restore {
        env: &env,
        ns: n.clone(),
        before: serde_json::from_slice(&before.stdout).expect("the CRD as JSON"),
        crds,
        binding,
    };
    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;

    // A producer's Artifact for a custom source, with inputs of every JSON
    // shape.
    let inputs = json!({"tier": "frontend", "replicas": 3, "regions": ["eu-1", "us-2"],
                        "database": {"engine": "postgres", "tls": true}});
    let uid = writers::test_source(&env, TEST_GROUP, &n, "web").await;
    let v1 = publish(env.fixtures(), &n, "web", "v1", &[("a.yaml", "a: 1\n")]);
    let mut spec = v1.clone();
    spec["exportedInputs"] = inputs.clone();
    env.apply(&writers::owned_artifact(
        TEST_GROUP, &n, "web", "web", &uid, &spec,
    ))
    .await
    .expect("writing the Artifact");

    // flux-operator is installed: an ExternalArtifact is exported whatever
    // the gates say, beside what the consumers with references get.
    let revision = |o: &DynamicObject| field(o, "/status/artifact/revision").cloned();
    let export = external_artifact(&env, &n, "web", |o| {
        revision(o) == Some(v1["revision"].clone())
    })
    .await;
    let export_name = export.metadata.name.clone().expect("a name");
    // Flux 2.9's ExternalArtifact API has no status.exportedInputs: none is
    // written, and the Artifact says why.
    assert!(
        field(&export, "/status/exportedInputs").is_none(),
        "{:?}",
        export.data
    );
    let message = artifact_message(&env, &n, "web", |m| m.contains("exportedInputs")).await;
    assert!(message.contains("no status.exportedInputs"), "{message}");
    assert!(message.contains("ResourceSetInputProvider"), "{message}");

    // A ResourceSetInputProvider selecting the export by openflux's label,
    // and a ResourceSet templating from what it reads.
    env.apply(&json!({
        "apiVersion": OPERATOR, "kind": "ResourceSetInputProvider",
        "metadata": {"name": "web", "namespace": n},
        "spec": {"type": "ExternalArtifact", "selectors": [{"matchLabels": {"openflux.dev/artifact": "web"}}]}
    }))
    .await
    .expect("creating the ResourceSetInputProvider");
    env.apply(&json!({
        "apiVersion": OPERATOR, "kind": "ResourceSet",
        "metadata": {"name": "web", "namespace": n},
        "spec": {
            "inputsFrom": [{"apiVersion": OPERATOR, "kind": "ResourceSetInputProvider", "name": "web"}],
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "from-<< inputs.id >>", "namespace": n},
                "data": {"export": "<< inputs.name >>", "revision": "<< inputs.revision >>"}}]
        }
    }))
    .await
    .expect("creating the ResourceSet");
    let provider_inputs = |revision: Value| {
        let env = &env;
        let n = &n;
        let export_name = &export_name;
        async move {
            wait_for(
                &format!("the ResourceSetInputProvider to export revision {revision}"),
                TIMEOUT,
                || async {
                    let rsip = env
                        .find(OPERATOR, "ResourceSetInputProvider", n, "web")
                        .await?;
                    let list = field(&rsip, "/status/exportedInputs")?.as_array()?.clone();
                    let found = list
                        .iter()
                        .find(|i| i["name"] == json!(export_name))?
                        .clone();
                    (found["revision"] == revision && found["namespace"] == json!(n))
                        .then_some(found)
                },
            )
            .await
        }
    };
    let read = provider_inputs(v1["revision"].clone()).await;
    assert_eq!(
        read["openflux.dev/artifact"], "web",
        "labels are inputs: {read}"
    );
    let configmap = |revision: Value| {
        let env = &env;
        let n = &n;
        let export_name = &export_name;
        async move {
            let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), n);
            wait_for(
                &format!("the ResourceSet's ConfigMap at revision {revision}"),
                TIMEOUT,
                || async {
                    let list = cms.list(&Default::default()).await.ok()?;
                    let data = list
                        .items
                        .into_iter()
                        .find(|c| {
                            c.metadata
                                .name
                                .as_deref()
                                .is_some_and(|m| m.starts_with("from-"))
                        })?
                        .data?;
                    (Some(&json!(data.get("revision")?)) == Some(&revision)
                        && data.get("export")? == export_name)
                        .then_some(())
                },
            )
            .await
        }
    };
    configmap(v1["revision"].clone()).await;

    // A new revision of the custom source reaches the ResourceSet.
    let v2 = publish(env.fixtures(), &n, "web", "v2", &[("a.yaml", "a: 2\n")]);
    let mut spec = v2.clone();
    spec["exportedInputs"] = inputs.clone();
    env.apply(&writers::owned_artifact(
        TEST_GROUP, &n, "web", "web", &uid, &spec,
    ))
    .await
    .expect("updating the Artifact");
    provider_inputs(v2["revision"].clone()).await;
    configmap(v2["revision"].clone()).await;

    // Flux 2.10's ExternalArtifact API: openflux sees the field in the CRD
    // and writes the declared inputs, as written.
    apply_external_artifact_crd(&env, &flux_2_10_crds().await).await;
    let export = external_artifact(&env, &n, "web", |o| {
        field(o, "/status/exportedInputs") == Some(&inputs)
    })
    .await;
    assert_eq!(revision(&export), Some(v2["revision"].clone()));
    let message = artifact_message(&env, &n, "web", |m| !m.contains("exportedInputs")).await;
    println!("Artifact {n}/web: {message}");

    // flux-operator's objects go while it runs, so it removes its
    // finalizers from them.
    for kind in ["ResourceSet", "ResourceSetInputProvider"] {
        env.delete_object(OPERATOR, kind, &n, "web").await;
        wait_for(&format!("{kind} {n}/web to be gone"), TIMEOUT, || async {
            env.find(OPERATOR, kind, &n, "web")
                .await
                .is_none()
                .then_some(())
        })
        .await;
    }
    println!("flux-operator's log:\n{}", operator.log_tail(15));
    operator.stop().await;
    ns.delete().await;
}

/// Puts the ExternalArtifact CRD back as it was read (without its
/// server-set fields) and removes flux-operator's CRDs and binding, when
/// the test ends, passed or not.
struct Restore<'a> {
    env: &'a Env,
    ns: String,
    before: Value,
    crds: Vec<String>,
    binding: String,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let mut crd = self.before.clone();
        if let Some(meta) = crd["metadata"].as_object_mut() {
            for key in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "managedFields",
            ] {
                meta.remove(key);
            }
        }
        if let Some(obj) = crd.as_object_mut() {
            obj.remove("status");
        }
        let out = self.env.run_kubectl(
            &["replace", "-f", "-"],
            Some(&serde_json::to_string(&crd).unwrap_or_default()),
        );
        if !out.status.success() {
            eprintln!(
                "restoring the ExternalArtifact CRD: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Left behind by a failure, with flux-operator stopped: without
        // their finalizers, they (and so the CRDs) can go.
        for kind in ["resourcesets", "resourcesetinputproviders"] {
            let list = self
                .env
                .run_kubectl(&["get", kind, "-n", &self.ns, "-o", "name"], None);
            for name in String::from_utf8_lossy(&list.stdout).lines() {
                self.env.run_kubectl(
                    &[
                        "patch",
                        name,
                        "-n",
                        &self.ns,
                        "--type=merge",
                        "-p",
                        r#"{"metadata":{"finalizers":null}}"#,
                    ],
                    None,
                );
            }
        }
        let mut args = vec!["delete", "--wait=false", "--ignore-not-found", "crd"];
        args.extend(self.crds.iter().map(String::as_str));
        self.env.run_kubectl(&args, None);
        self.env.run_kubectl(
            &[
                "delete",
                "--ignore-not-found",
                "clusterrolebinding",
                &self.binding,
            ],
            None,
        );
    }
}
