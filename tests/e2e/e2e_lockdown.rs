//! End to end: a tenant under Flux's multi-tenancy lockdown uses a custom
//! source. The lockdown cell (`e2e/lib/cells.sh`) runs the current Flux
//! line with the flags of the lockdown: kustomize-controller and
//! helm-controller with `--no-cross-namespace-refs=true
//! --default-service-account=default`, so every Kustomization that names
//! no ServiceAccount is applied as its namespace's ServiceAccount
//! `default`.
//!
//! The platform team gives each tenant a GitRepository and a Kustomization
//! in the tenant's namespace. The tenant's repository holds an HttpSource
//! and a Kustomization consuming it. A tenant whose `default` ServiceAccount
//! is bound to Kubernetes' `admin` role in its namespace gets both applied
//! (through the aggregated roles of `manifests/roles.yaml` and
//! `manifests/http-source/roles.yaml`), the HttpSource controller fetches
//! the content, openflux exports it, and the consumer becomes Ready with the
//! HttpSource's content. A tenant bound to `view` only is refused, and the
//! refusal names the ServiceAccount kustomize-controller acted as.

use openflux_testkit as support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use kube::api::Api;
use serde::Deserialize as _;
use serde_json::{json, Value};
use support::openflux::{free_addr, http_get, tail, tarball};
use support::{field, ready_condition, wait_for, Cell, Env, TIMEOUT};

const HTTP_SOURCE: &str = "sources.openflux.dev/v1alpha1";
const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const GIT: &str = "source.toolkit.fluxcd.io/v1";
const EDIT_ROLES: &str = include_str!("../../manifests/roles.yaml");
const HTTP_SOURCE_ROLES: &str = include_str!("../../manifests/http-source/roles.yaml");
const HTTP_SOURCE_CRD: &str = include_str!("../../manifests/http-source/crd.yaml");
const HTTP_SOURCE_RBAC: &str = include_str!("../../manifests/http-source/rbac.yaml");
/// The HttpSource controller's ServiceAccount in the shipped RBAC.
const HTTP_SOURCE_USER: &str = "system:serviceaccount:openflux-system:openflux-http-source";

/// A running `openflux-http-source` acting as its shipped ServiceAccount,
/// stopped on drop (its log tail printed when the test fails).
struct HttpSourceController {
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for HttpSourceController {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- openflux-http-source log ----\n{}",
                tail(&self.log, 40)
            );
        }
        if let Some(child) = self.child.take() {
            support::openflux::stop_child(child);
        }
    }
}

/// The shipped RBAC of the HttpSource controller (its leader election Role
/// also in `ns`, where it runs) and a kubeconfig acting as its
/// ServiceAccount; the controller started for namespace `ns`, fetching
/// from loopback (the fixtures).
async fn http_source_controller(env: &Env, ns: &str) -> HttpSourceController {
    for doc in serde_yaml_ng::Deserializer::from_str(HTTP_SOURCE_RBAC) {
        let mut value = Value::deserialize(doc).expect("manifests/http-source/rbac.yaml");
        if value.is_null() {
            continue;
        }
        env.apply(&value).await.expect("the HttpSource RBAC");
        if matches!(value["kind"].as_str(), Some("Role" | "RoleBinding")) {
            value["metadata"]["namespace"] = json!(ns);
            env.apply(&value).await.expect("the leader election Role");
        }
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    let kubeconfig = acting_kubeconfig(env, HTTP_SOURCE_USER, dir.path());
    let (metrics, health, storage) = (free_addr(), free_addr(), free_addr());
    let log = std::env::temp_dir().join(format!(
        "{}.log",
        support::unique_name("lockdown-http-source")
    ));
    let out = std::fs::File::create(&log).expect("the log file");
    let err = out.try_clone().expect("the log file handle");
    let child = Command::new(support::workspace_bin("openflux-http-source"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--watch-all-namespaces=false")
        .arg(format!("--namespace={ns}"))
        .arg(format!(
            "--storage-path={}",
            dir.path().join("storage").display()
        ))
        .arg(format!("--storage-addr={storage}"))
        .arg(format!("--storage-adv-addr={storage}"))
        .arg(format!("--metrics-addr={metrics}"))
        .arg(format!("--health-addr={health}"))
        .arg("--allow-network=127.0.0.1/32")
        .env("POD_NAME", "lockdown-http-source")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("starting openflux-http-source");
    let mut controller = HttpSourceController {
        child: Some(child),
        log,
        _dir: dir,
    };
    ready(&mut controller, health).await;
    controller
}

async fn ready(controller: &mut HttpSourceController, health: SocketAddr) {
    wait_for("openflux-http-source to be ready", TIMEOUT, || {
        let exited = controller
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        let log = controller.log.clone();
        async move {
            if let Some(status) = exited {
                panic!(
                    "openflux-http-source exited ({status}):\n{}",
                    tail(&log, 40)
                );
            }
            matches!(http_get(health, "/readyz").await, Some((200, _))).then_some(())
        }
    })
    .await;
}

/// The cluster administrator's kubeconfig of `env`, acting as `user` (the
/// API server adds a ServiceAccount's groups).
fn acting_kubeconfig(env: &Env, user: &str, dir: &Path) -> PathBuf {
    let source = env.kubeconfig.clone().expect("the cell's kubeconfig");
    let text = std::fs::read_to_string(&source).expect("reading the kubeconfig");
    let mut config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("kubeconfig YAML");
    for entry in config
        .get_mut("users")
        .and_then(|u| u.as_sequence_mut())
        .expect("users in the kubeconfig")
    {
        if let Some(auth) = entry.get_mut("user").and_then(|u| u.as_mapping_mut()) {
            auth.insert("as".into(), user.into());
        }
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).expect("YAML")).expect("writing");
    path
}

/// The cell really runs the lockdown: the Deployment describing
/// kustomize-controller carries its flags.
async fn assert_lockdown(env: &Env) {
    let deployment = env
        .get(
            "apps/v1",
            "Deployment",
            Some("flux-system"),
            "kustomize-controller",
        )
        .await
        .expect("reading kustomize-controller's Deployment")
        .expect("kustomize-controller's Deployment");
    let args = deployment.data["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    for flag in [
        "--no-cross-namespace-refs=true",
        "--default-service-account=default",
    ] {
        assert!(
            args.as_array().is_some_and(|a| a.contains(&json!(flag))),
            "kustomize-controller runs without {flag}: {args}"
        );
    }
}

/// The CRDs and the shipped roles, aggregated into `admin`.
async fn install(env: &Env) {
    support::install_artifact_crd(env).await;
    env.apply_yaml(HTTP_SOURCE_CRD)
        .await
        .expect("installing the HttpSource CRD");
    support::wait_established(
        env,
        &["artifacts.openflux.dev", "httpsources.sources.openflux.dev"],
    )
    .await;
    env.apply_yaml(EDIT_ROLES)
        .await
        .expect("manifests/roles.yaml");
    env.apply_yaml(HTTP_SOURCE_ROLES)
        .await
        .expect("manifests/http-source/roles.yaml");
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(env.client.clone());
    wait_for(
        "HttpSources and Flux's kinds in ClusterRole admin",
        TIMEOUT,
        || async {
            let rules = roles.get("admin").await.ok()?.rules?;
            let has = |group: &str, resource: &str| {
                rules.iter().any(|r| {
                    r.api_groups.iter().flatten().any(|g| g == group)
                        && r.resources
                            .iter()
                            .flatten()
                            .any(|x| x == resource || x == "*")
                        && r.verbs.iter().any(|v| v == "create")
                })
            };
            (has("sources.openflux.dev", "httpsources")
                && has("kustomize.toolkit.fluxcd.io", "kustomizations"))
            .then_some(())
        },
    )
    .await;
}

/// Binds the ServiceAccount `default` of `ns` (the one the lockdown
/// impersonates) to the ClusterRole `role` in `ns`.
async fn bind_default(env: &Env, ns: &str, role: &str) {
    env.apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": format!("tenant-{role}"), "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
    }))
    .await
    .expect("binding the tenant's ServiceAccount");
}

/// What the platform team gives a tenant: a GitRepository of the tenant's
/// repository and a Kustomization applying it, in the tenant's namespace,
/// naming no ServiceAccount (the lockdown's default applies).
async fn onboard(env: &Env, ns: &str, repo_url: &str) {
    env.apply(&json!({
        "apiVersion": GIT, "kind": "GitRepository",
        "metadata": {"name": "tenant", "namespace": ns},
        "spec": {"url": repo_url, "interval": "10m", "ref": {"branch": "main"}}
    }))
    .await
    .expect("the tenant's GitRepository");
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "tenant", "namespace": ns},
        "spec": {"interval": "10m", "retryInterval": "5s", "prune": true, "path": "./",
                 "targetNamespace": ns,
                 "sourceRef": {"kind": "GitRepository", "name": "tenant"}}
    }))
    .await
    .expect("the tenant's Kustomization");
}

/// The tenant's repository: an HttpSource `name` fetching `url` and a
/// Kustomization of the same name deploying it into the tenant's namespace
/// `ns` (as the tenant's ServiceAccount: an object without a namespace
/// would be refused at the cluster scope).
fn tenant_repository(ns: &str, name: &str, url: &str) -> Vec<(String, String)> {
    vec![
        (
            "source.yaml".into(),
            format!(
                "apiVersion: {HTTP_SOURCE}\nkind: HttpSource\nmetadata:\n  name: {name}\nspec:\n  url: {url}\n  interval: 10m\n"
            ),
        ),
        (
            "consumer.yaml".into(),
            format!(
                "apiVersion: {KUSTOMIZE}\nkind: Kustomization\nmetadata:\n  name: {name}\nspec:\n  interval: 10m\n  retryInterval: 5s\n  prune: true\n  path: ./\n  targetNamespace: {ns}\n  sourceRef:\n    apiVersion: {HTTP_SOURCE}\n    kind: HttpSource\n    name: {name}\n"
            ),
        ),
    ]
}

/// Waits until Kustomization `name` is Ready for its current generation.
async fn applied(env: &Env, ns: &str, name: &str) {
    wait_for(
        &format!("Kustomization {ns}/{name} to be Ready"),
        TIMEOUT,
        || async {
            let k = env.find(KUSTOMIZE, "Kustomization", ns, name).await?;
            let ready = ready_condition(&k)?;
            let observed = field(&k, "/status/observedGeneration").and_then(Value::as_i64);
            (ready.0 == "True" && observed == k.metadata.generation).then_some(())
        },
    )
    .await
}

/// The message of Kustomization `name` once it is Ready=False because the
/// API server refused what it applies.
async fn refused(env: &Env, ns: &str, name: &str) -> String {
    wait_for(
        &format!("Kustomization {ns}/{name} to be refused"),
        TIMEOUT,
        || async {
            let k = env.find(KUSTOMIZE, "Kustomization", ns, name).await?;
            let (status, _, message) = ready_condition(&k)?;
            (status == "False" && message.contains("Forbidden")).then_some(message)
        },
    )
    .await
}

/// A tenant bound to `admin` applies an HttpSource and a consumer of it
/// under the lockdown, and the consumer deploys the HttpSource's content;
/// a tenant bound to `view` is refused as its ServiceAccount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_down_tenant_deploys_from_an_http_source_and_a_viewer_cannot() {
    let env = support::cell(Cell::Lockdown).await;
    assert_lockdown(&env).await;
    install(&env).await;
    let tenant = env.namespace("tenant").await;
    let t = tenant.name().to_string();
    let viewer = env.namespace("viewer").await;
    let v = viewer.name().to_string();
    bind_default(&env, &t, "admin").await;
    bind_default(&env, &v, "view").await;
    let (_of, _webhook) =
        support::webhook::openflux_with_webhook(&env, &t, &["--no-cross-namespace-refs"]).await;
    let _controller = http_source_controller(&env, &t).await;

    // The content the HttpSource fetches, and the tenants' repositories.
    let value = format!("deployed-for-{t}");
    let (bytes, _) = tarball(&[("configmap.yaml", &support::configmap_yaml(&value))]);
    let fx = env.fixtures();
    let url = fx
        .put_file(&format!("lockdown/{t}/app.tar.gz"), &bytes)
        .expect("publishing the content");
    for (ns, name) in [(&t, "app"), (&v, "app")] {
        let files = tenant_repository(ns, name, &url);
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        let (repo, _) = fx
            .create_repo(&support::unique_name(ns), &files)
            .expect("the tenant's repository");
        onboard(&env, ns, &repo.url).await;
    }

    // The admin tenant: both objects applied as its ServiceAccount, the
    // consumer rewritten by openflux and Ready with the content.
    applied(&env, &t, "tenant").await;
    let consumer = env
        .find(KUSTOMIZE, "Kustomization", &t, "app")
        .await
        .expect("the tenant's consumer");
    let reference = field(&consumer, "/spec/sourceRef")
        .cloned()
        .unwrap_or_default();
    assert!(
        matches!(
            reference["kind"].as_str(),
            Some("ExternalArtifact" | "OCIRepository")
        ) && reference["name"]
            == openflux::names::identity::source_export_name(
                "sources.openflux.dev",
                "HttpSource",
                "app"
            ),
        "the consumer was not pointed at the HttpSource's export: {reference}"
    );
    applied(&env, &t, "app").await;
    support::configmap_holds(&env, &t, "app-config", &value, TIMEOUT).await;

    // The viewer tenant: refused, as the ServiceAccount the lockdown
    // impersonates; nothing of its repository exists.
    let message = refused(&env, &v, "tenant").await;
    // kustomize-controller names the first object refused, whichever of
    // the two that is.
    assert!(
        message.contains(&format!("system:serviceaccount:{v}:default"))
            && (message.contains("HttpSource/") || message.contains("Kustomization/")),
        "the refusal does not name the tenant's ServiceAccount and object: {message}"
    );
    assert!(env
        .find(HTTP_SOURCE, "HttpSource", &v, "app")
        .await
        .is_none());
    assert!(env
        .find(KUSTOMIZE, "Kustomization", &v, "app")
        .await
        .is_none());
    tenant.delete().await;
    viewer.delete().await;
}
