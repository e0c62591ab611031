//! flux-operator beside the test control plane, and Flux 2.10's source API.
//!
//! Both need Go 1.27, which only `e2e/cluster flux-operator` and
//! `e2e/cluster flux-2.10-crds` use (see e2e/lib/build.sh): the first builds
//! flux-operator (the pin in e2e/versions.env) once and prints where its
//! binary and CRDs are; the second copies the CRDs of Flux 2.10's
//! source-controller out of their module. A test that asks for them on a
//! machine that cannot build them fails with the go command's answer.
//!
//! [`FluxOperator::start`] runs the operator as a process, as its own
//! install runs it: a ServiceAccount bound to `cluster-admin` (the test
//! admin impersonates it, so the API server authorizes every request as
//! that ServiceAccount), leader election off, its web UI off, every
//! listener on loopback.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Deserialize as _;
use serde_json::{json, Value};

use crate::openflux::{free_addr, http_get, stop_child, tail};
use crate::{cluster_script, unique_name, wait_established, wait_for, Env};

/// Runs `e2e/cluster ARG` (blocking; a first build takes tens of minutes)
/// and returns the directory it prints.
fn script_dir(arg: &str) -> PathBuf {
    let script = cluster_script();
    let out = Command::new(&script)
        .arg(arg)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {} {arg}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} {arg} failed ({}); its output above says why",
        script.display(),
        out.status
    );
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = PathBuf::from(dir.lines().last().unwrap_or_default());
    assert!(
        dir.is_dir(),
        "{} {arg} printed no directory",
        script.display()
    );
    dir
}

/// The directory of Flux 2.10's source CRDs (source-controller's
/// `config/crd/bases`).
pub async fn flux_2_10_crds() -> PathBuf {
    tokio::task::spawn_blocking(|| script_dir("flux-2.10-crds"))
        .await
        .expect("copying Flux 2.10's CRDs")
}

/// The YAML documents of `path`, as JSON.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("a CRD file is YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// A running flux-operator.
pub struct FluxOperator {
    child: Option<Child>,
    log: PathBuf,
    binding: String,
    crds: Vec<String>,
    admin: kube::Client,
}

impl FluxOperator {
    /// Builds (or reuses) flux-operator, installs its CRDs, and runs it as
    /// ServiceAccount `flux-operator` of `ns` (also its runtime namespace),
    /// until it reports ready.
    pub async fn start(env: &Env, ns: &str) -> Self {
        let dir = tokio::task::spawn_blocking(|| script_dir("flux-operator"))
            .await
            .expect("building flux-operator");
        let mut names = Vec::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("crds"))
            .expect("flux-operator's crds/")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for file in &files {
            for crd in yaml_documents(file) {
                names.push(
                    crd["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
                env.apply(&crd)
                    .await
                    .unwrap_or_else(|e| panic!("installing {}: {e:#}", file.display()));
            }
        }
        let crds = names.clone();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        wait_established(env, &names).await;

        // flux-operator's own install binds its ServiceAccount to
        // cluster-admin; so does this one.
        let binding = unique_name("flux-operator");
        env.apply(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "flux-operator", "namespace": ns}}))
            .await
            .expect("creating flux-operator's ServiceAccount");
        env.apply(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "flux-operator", "namespace": ns}]}))
            .await
            .expect("binding flux-operator's ServiceAccount");
        let kubeconfig = impersonating_kubeconfig(env, ns, "flux-operator");

        let metrics = free_addr();
        let health = free_addr();
        let storage = std::env::temp_dir().join(unique_name("flux-operator-storage"));
        std::fs::create_dir_all(&storage).expect("creating flux-operator's storage dir");
        let log = std::env::temp_dir().join(format!("{}.log", unique_name("flux-operator")));
        let out = std::fs::File::create(&log).expect("creating flux-operator's log file");
        let err = out.try_clone().expect("cloning the log file handle");
        let child = Command::new(dir.join("flux-operator"))
            .arg(format!("--metrics-addr={metrics}"))
            .arg(format!("--health-addr={health}"))
            .arg("--web-server-port=0")
            .arg("--enable-leader-election=false")
            .arg(format!("--storage-path={}", storage.display()))
            .arg("--log-level=debug")
            .env("KUBECONFIG", &kubeconfig)
            .env("RUNTIME_NAMESPACE", ns)
            // Its release build turns FIPS 140-3 mode on (GOFIPS140); it
            // refuses to run without it.
            .env("GODEBUG", "fips140=on")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting flux-operator");
        let mut operator = FluxOperator {
            child: Some(child),
            log,
            binding,
            crds,
            admin: env.client.clone(),
        };
        let what = format!("flux-operator to be ready on {health}");
        wait_for(&what, Duration::from_secs(120), || {
            let exited = operator
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            let log = operator.log.clone();
            async move {
                if let Some(status) = exited {
                    panic!("flux-operator exited early ({status}):\n{}", tail(&log, 40));
                }
                match http_get(health, "/readyz").await {
                    Some((200, _)) => Some(()),
                    _ => None,
                }
            }
        })
        .await;
        operator
    }

    /// The names of the CRDs it installed, and of its ClusterRoleBinding.
    pub fn cluster_objects(&self) -> (Vec<String>, String) {
        (self.crds.clone(), self.binding.clone())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Stops it and removes its ClusterRoleBinding and its CRDs, so the
    /// control plane is as before for the tests after (its ServiceAccount
    /// goes with the test's namespace).
    pub async fn stop(mut self) {
        if let Some(child) = self.child.take() {
            stop_child(child);
        }
        let api: kube::Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> =
            kube::Api::all(self.admin.clone());
        let _ = api.delete(&self.binding, &Default::default()).await;
        let crds: kube::Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = kube::Api::all(self.admin.clone());
        for name in &self.crds {
            let _ = crds.delete(name, &Default::default()).await;
        }
    }
}

impl Drop for FluxOperator {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_child(child);
        }
    }
}

/// A kubeconfig file with the test admin's credentials that impersonates
/// ServiceAccount `name` of `ns` (with the groups its token would carry):
/// the API server authorizes every request as that ServiceAccount.
fn impersonating_kubeconfig(env: &Env, ns: &str, name: &str) -> PathBuf {
    let source = env
        .kubeconfig
        .clone()
        .expect("the local control plane's kubeconfig");
    let text = std::fs::read_to_string(&source)
        .unwrap_or_else(|e| panic!("reading {}: {e}", source.display()));
    let mut config: Value = serde_yaml_ng::from_str(&text).expect("a kubeconfig is YAML");
    for user in config["users"].as_array_mut().into_iter().flatten() {
        user["user"]["as"] = json!(format!("system:serviceaccount:{ns}:{name}"));
        user["user"]["as-groups"] = json!([
            "system:serviceaccounts",
            format!("system:serviceaccounts:{ns}"),
            "system:authenticated"
        ]);
    }
    let path = std::env::temp_dir().join(format!("{}.kubeconfig", unique_name(name)));
    std::fs::write(
        &path,
        serde_yaml_ng::to_string(&config).expect("kubeconfig YAML"),
    )
    .expect("writing the kubeconfig");
    path
}
