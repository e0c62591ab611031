//! The openflux test kit: the local control plane, fixtures and helpers shared by the end-to-end tests and the benchmarks (`use openflux_testkit as support;`).
//!
//! [`cluster`] gives every test a client for a Kubernetes API server with the
//! stock Flux controllers: by default the local control plane of
//! `e2e/cluster` (started once per test process and shared by all test
//! binaries), or, when `KUBECONFIG` is set, that cluster as it is.
//!
//! Tests that need the loopback fixtures (Git server, static file server)
//! take them from [`Env::fixtures`]. A test never skips: on a cluster that
//! was not started by `e2e/cluster` and without the `OPENFLUX_E2E_*`
//! fixture variables, it fails with a message naming the missing variables;
//! a control plane that cannot start fails it with the component that did
//! not come up.
//!
//! Waits are always bounded ([`wait_for`]); nothing sleeps to synchronize.
#![allow(dead_code)]

pub mod fixtures;
pub mod openflux;
pub mod webhook;

pub use fixtures::{Fixtures, GitRepo, FIXTURE_VARIABLES};

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context as _};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{pinned_kind, Scope};
use kube::{Client, Config};

/// Field manager used by [`apply`].
pub const FIELD_MANAGER: &str = "openflux-e2e";

/// Default bound for waits on reconciliations in the tests.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// Label set on every namespace created by [`Env::namespace`].
pub const TEST_LABEL: &str = "e2e.openflux.dev/test";

/// What a test gets from [`cluster`].
pub struct Env {
    /// A client for this test's tokio runtime (build one per test).
    pub client: Client,
    /// The client configuration (to build more clients, e.g. in `Drop`).
    pub config: Config,
    /// The kubeconfig file in use (local control plane only).
    pub kubeconfig: Option<PathBuf>,
    /// True when the cluster is the local control plane started by `e2e/cluster`.
    pub local: bool,
    /// The loopback fixtures, or why there are none (see [`Env::fixtures`]).
    fixtures: Result<Fixtures, String>,
    /// Every `OPENFLUX_E2E_*` variable (and `KUBECONFIG`) of the environment
    /// description, for helpers that need more than the fields above.
    pub vars: BTreeMap<String, String>,
}

/// Path of the `e2e/cluster` script of this repository.
pub fn cluster_script() -> PathBuf {
    workspace_root().join("e2e").join("cluster")
}

/// The root of this repository (the workspace), where `e2e/`, `manifests/`
/// and `webhook-config/` live.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Path of a binary of this workspace that cargo built for the running test
/// or benchmark: test executables live in `target/<profile>/deps/`, the
/// binaries one level up. `cargo test --workspace --all-targets` builds them
/// all; a missing one is named with the command that builds it.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test executable");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test executable lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --bin {name}` (cargo test --workspace --all-targets builds every binary)",
        path.display()
    );
    path
}

/// The environment description, resolved once per process.
struct Resolved {
    local: bool,
    kubeconfig: Option<PathBuf>,
    vars: BTreeMap<String, String>,
}

static RESOLVED: OnceLock<Result<Resolved, String>> = OnceLock::new();

fn resolve() -> Result<Resolved, String> {
    if std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()) {
        let vars = std::env::vars()
            .filter(|(k, _)| k.starts_with("OPENFLUX_E2E_") || k == "KUBECONFIG")
            .collect();
        return Ok(Resolved {
            local: false,
            kubeconfig: None,
            vars,
        });
    }
    let script = cluster_script();
    // `up` is idempotent and takes a lock, so concurrently running test
    // binaries share one control plane. Its progress (including a cold
    // build) goes straight to this process's stderr.
    let status = Command::new(&script)
        .arg("up")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("running {} up: {e}", script.display()))?;
    if !status.success() {
        return Err(format!(
            "the local control plane did not start: {} up failed ({status}); its output above \
             names the component that did not come up and shows the tail of its log",
            script.display()
        ));
    }
    let out = Command::new(&script)
        .arg("env")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {} env: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} env failed ({})", script.display(), out.status));
    }
    let vars = parse_env(&String::from_utf8_lossy(&out.stdout));
    let kubeconfig = vars
        .get("KUBECONFIG")
        .map(PathBuf::from)
        .ok_or_else(|| "`e2e/cluster env` printed no KUBECONFIG".to_string())?;
    Ok(Resolved {
        local: true,
        kubeconfig: Some(kubeconfig),
        vars,
    })
}

/// Parses the `export NAME='value'` lines printed by `e2e/cluster env`.
pub fn parse_env(text: &str) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("export ") else {
            continue;
        };
        let Some((name, value)) = rest.split_once('=') else {
            continue;
        };
        let value = match value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
            Some(quoted) => quoted.replace("'\\''", "'"),
            None => value.to_string(),
        };
        vars.insert(name.to_string(), value);
    }
    vars
}

/// The cluster for this test: starts the local control plane once per
/// process (unless `KUBECONFIG` is set) and returns a fresh client for the
/// calling test's runtime. Panics with a readable message if the cluster
/// cannot be started or reached.
pub async fn cluster() -> Env {
    let resolved = RESOLVED
        .get_or_init(|| {
            // `up` may build for a long time: keep it off the async runtime.
            std::thread::spawn(resolve)
                .join()
                .unwrap_or_else(|_| Err("starting the local control plane panicked".into()))
        })
        .as_ref()
        .unwrap_or_else(|e| panic!("e2e cluster: {e}"));
    let config = match &resolved.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .unwrap_or_else(|e| panic!("e2e cluster: reading {}: {e}", path.display()));
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| panic!("e2e cluster: kubeconfig {}: {e}", path.display()))
        }
        None => Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("e2e cluster: kubeconfig from KUBECONFIG: {e}")),
    };
    let client = Client::try_from(config.clone())
        .unwrap_or_else(|e| panic!("e2e cluster: building a client: {e}"));
    Env {
        client,
        config,
        kubeconfig: resolved.kubeconfig.clone(),
        local: resolved.local,
        fixtures: Fixtures::from_vars(&resolved.vars)
            .map_err(|missing| missing_fixtures(resolved.local, &missing)),
        vars: resolved.vars.clone(),
    }
}

/// Why a cluster has no fixtures, naming the missing variables.
fn missing_fixtures(local: bool, missing: &[&str]) -> String {
    let names = missing.join(", ");
    if local {
        format!("`e2e/cluster env` printed no {names}")
    } else {
        format!(
            "this test needs the loopback fixtures of e2e/cluster, but {names} \
             {verb} not set. KUBECONFIG is set, so the tests use that cluster as it is: \
             unset KUBECONFIG to run them on the local control plane, or set these \
             variables (`e2e/cluster env` prints them for a local control plane)",
            verb = if missing.len() == 1 { "is" } else { "are" }
        )
    }
}

impl Env {
    /// The loopback fixtures (Git and file servers, Helm repository).
    /// Panics, failing the test with the names of the missing
    /// `OPENFLUX_E2E_*` variables, when the cluster in use has none.
    pub fn fixtures(&self) -> &Fixtures {
        self.try_fixtures()
            .unwrap_or_else(|why| panic!("e2e fixtures missing: {why}"))
    }

    /// The loopback fixtures, or why there are none (for code that reports
    /// errors instead of panicking, such as the benchmarks).
    pub fn try_fixtures(&self) -> Result<&Fixtures, String> {
        self.fixtures.as_ref().map_err(Clone::clone)
    }

    /// Creates a uniquely named namespace (`<prefix>-<unique>`), deleted when
    /// the guard is dropped or [`TestNamespace::delete`] is called.
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        TestNamespace::create(self, prefix).await
    }

    /// Server-side applies `obj` (see [`apply`]).
    pub async fn apply(&self, obj: &serde_json::Value) -> anyhow::Result<DynamicObject> {
        apply(&self.client, obj).await
    }

    /// Server-side applies every document of a YAML (or JSON) text.
    pub async fn apply_yaml(&self, text: &str) -> anyhow::Result<Vec<DynamicObject>> {
        apply_yaml(&self.client, text).await
    }

    /// Gets an object by apiVersion/kind/namespace/name (`None` if absent).
    pub async fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> anyhow::Result<Option<DynamicObject>> {
        get(&self.client, api_version, kind, namespace, name).await
    }

    /// A namespaced object, `None` when it does not exist or cannot be read.
    pub async fn find(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<DynamicObject> {
        self.get(api_version, kind, Some(namespace), name)
            .await
            .ok()
            .flatten()
    }

    /// A `kubectl` command for this cluster: the one matching the local
    /// control plane's version (`OPENFLUX_E2E_KUBECTL`), else `kubectl` from
    /// `PATH`, with the local control plane's kubeconfig.
    pub fn kubectl(&self) -> Command {
        let program = self
            .vars
            .get("OPENFLUX_E2E_KUBECTL")
            .filter(|p| !p.is_empty())
            .map_or_else(|| PathBuf::from("kubectl"), PathBuf::from);
        let mut cmd = Command::new(program);
        if let Some(kc) = &self.kubeconfig {
            cmd.env("KUBECONFIG", kc);
        }
        cmd
    }

    /// Runs `kubectl ARGS` (see [`Env::kubectl`]) with `stdin` as its input;
    /// panics, naming the program, when it cannot be started.
    pub fn run_kubectl(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
        use std::io::Write as _;
        let mut cmd = self.kubectl();
        let program = cmd.get_program().to_string_lossy().into_owned();
        cmd.args(args)
            .current_dir(workspace_root())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "running {program}: {e} (set OPENFLUX_E2E_KUBECTL, or put kubectl on PATH, for a cluster not started by e2e/cluster)"
            )
        });
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            input
                .write_all(text.as_bytes())
                .unwrap_or_else(|e| panic!("writing to {program}: {e}"));
        }
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for {program}: {e}"))
    }
}

// ----------------------------------------------------------------- waits --

/// Polls `check` every 250 ms until it returns `Some`, for at most `timeout`;
/// panics with `what` (and the time waited) when the bound is reached.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if start.elapsed() >= timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ------------------------------------------------------------ namespaces --

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique across test processes: `<prefix>-<pid>-<n>-<time>`, cut to
/// a valid DNS label (lowercase, at most 63 characters).
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    let suffix = format!("{}-{n}-{:x}", std::process::id(), t & 0xfffff);
    let mut prefix: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    prefix.truncate(62 - suffix.len());
    let prefix = prefix.trim_matches('-');
    if prefix.is_empty() {
        format!("t-{suffix}")
    } else {
        format!("{prefix}-{suffix}")
    }
}

/// A namespace that exists for one test. Deleted (without waiting for the
/// namespace controller to finish) on drop or by [`TestNamespace::delete`].
pub struct TestNamespace {
    name: String,
    config: Config,
    deleted: bool,
}

impl TestNamespace {
    async fn create(env: &Env, prefix: &str) -> Self {
        let name = unique_name(prefix);
        let api: Api<Namespace> = Api::all(env.client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": name, "labels": { TEST_LABEL: prefix_label(prefix) } },
        }))
        .expect("namespace object");
        api.create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating test namespace {name}: {e}"));
        TestNamespace {
            name,
            config: env.config.clone(),
            deleted: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace now (the usual end of a test).
    pub async fn delete(mut self) {
        self.deleted = true;
        if let Ok(client) = Client::try_from(self.config.clone()) {
            delete_namespace(client, &self.name).await;
        }
    }
}

fn prefix_label(prefix: &str) -> String {
    let mut label: String = prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    label.truncate(63);
    label.trim_matches('-').to_string()
}

async fn delete_namespace(client: Client, name: &str) {
    let api: Api<Namespace> = Api::all(client);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => eprintln!("warning: deleting test namespace {name}: {e}"),
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        // Drop cannot await and the test's runtime may be shutting down: use
        // a short-lived runtime (and client) on a helper thread.
        let config = self.config.clone();
        let name = self.name.clone();
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    if let Ok(client) = Client::try_from(config) {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(10),
                            delete_namespace(client, &name),
                        )
                        .await;
                    }
                });
            }
        });
        let _ = done.join();
    }
}

// ------------------------------------------------------------ dynamic API --

/// Splits `group/version` (or `version` for the core group) and builds a GVK.
pub fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    match api_version.split_once('/') {
        Some((group, version)) => GroupVersionKind::gvk(group, version, kind),
        None => GroupVersionKind::gvk("", api_version, kind),
    }
}

/// The API for a kind, found by discovery (`namespace` is ignored for
/// cluster-scoped kinds and means "all namespaces" when `None`).
pub async fn dynamic_api(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> anyhow::Result<(Api<DynamicObject>, ApiResource)> {
    let (ar, caps) = pinned_kind(client, &gvk(api_version, kind))
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let api = match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    Ok((api, ar))
}

/// Server-side applies one object given as JSON (field manager
/// [`FIELD_MANAGER`], conflicts forced). Namespaced kinds need
/// `metadata.namespace`.
pub async fn apply(client: &Client, obj: &serde_json::Value) -> anyhow::Result<DynamicObject> {
    let api_version = obj["apiVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("object without apiVersion: {obj}"))?;
    let kind = obj["kind"]
        .as_str()
        .ok_or_else(|| anyhow!("object without kind: {obj}"))?;
    let name = obj["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow!("object without metadata.name: {obj}"))?;
    let namespace = obj["metadata"]["namespace"].as_str();
    let (ar, caps) = pinned_kind(client, &gvk(api_version, kind))
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = namespace.ok_or_else(|| {
                anyhow!("{kind} {name} is namespaced but has no metadata.namespace")
            })?;
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| {
        format!(
            "applying {kind} {}{name}",
            namespace.map(|n| format!("{n}/")).unwrap_or_default()
        )
    })
}

/// Server-side applies every non-empty document of a YAML (or JSON) text,
/// in order.
pub async fn apply_yaml(client: &Client, text: &str) -> anyhow::Result<Vec<DynamicObject>> {
    use serde::Deserialize as _;
    let mut applied = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(doc).context("parsing YAML")?;
        if value.is_null() {
            continue;
        }
        applied.push(apply(client, &value).await?);
    }
    Ok(applied)
}

/// Gets an object (`None` if it does not exist).
pub async fn get(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> anyhow::Result<Option<DynamicObject>> {
    let (api, _) = dynamic_api(client, api_version, kind, namespace).await?;
    api.get_opt(name)
        .await
        .with_context(|| format!("getting {kind} {name}"))
}

/// The `Ready` condition of an object's status: `(status, reason, message)`.
pub fn ready_condition(obj: &DynamicObject) -> Option<(String, String, String)> {
    condition(obj, "Ready")
}

/// A condition of an object's status: `(status, reason, message)`.
pub fn condition(obj: &DynamicObject, type_: &str) -> Option<(String, String, String)> {
    let conditions = obj.data.get("status")?.get("conditions")?.as_array()?;
    let c = conditions
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(type_))?;
    let field = |k: &str| {
        c.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Some((field("status"), field("reason"), field("message")))
}

/// True when `Ready` is `True` and `status.observedGeneration` (if present)
/// matches `metadata.generation`.
pub fn is_ready(obj: &DynamicObject) -> bool {
    let observed = obj
        .data
        .get("status")
        .and_then(|s| s.get("observedGeneration"))
        .and_then(|g| g.as_i64());
    let current = observed.is_none() || observed == obj.metadata.generation;
    current && ready_condition(obj).is_some_and(|(status, _, _)| status == "True")
}

/// A JSON pointer lookup in an object's body (`"/status/artifact/revision"`).
pub fn field<'a>(obj: &'a DynamicObject, pointer: &str) -> Option<&'a serde_json::Value> {
    obj.data.pointer(pointer)
}

/// Asks a Flux object to reconcile now (`reconcile.fluxcd.io/requestedAt`).
pub async fn request_reconcile(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    let (api, _) = dynamic_api(client, api_version, kind, Some(namespace)).await?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let patch = serde_json::json!({
        "metadata": { "annotations": { "reconcile.fluxcd.io/requestedAt": now.to_string() } }
    });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("requesting reconciliation of {kind} {namespace}/{name}"))?;
    Ok(())
}

// ------------------------------------------------------------------ CRDs --

/// Installs openflux's Artifact CRD (as committed under manifests/).
pub async fn install_artifact_crd(env: &Env) {
    env.apply_yaml(include_str!("../../../manifests/crds/artifacts.yaml"))
        .await
        .expect("installing the Artifact CRD");
}

/// Installs the test-only custom source kind `TestSource` of `group`
/// (version v1, any content), standing in for a third party's source.
pub async fn install_test_source_crd(env: &Env, group: &str) {
    env.apply(&serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("testsources.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "TestSource", "plural": "testsources", "singular": "testsource"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .await
    .unwrap_or_else(|e| panic!("installing the TestSource CRD of {group}: {e}"));
}

/// Waits (bounded) until every named CRD is Established.
pub async fn wait_established(env: &Env, names: &[&str]) {
    for name in names {
        wait_for(&format!("CRD {name} established"), TIMEOUT, || async {
            let crd = env
                .get(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    name,
                )
                .await
                .ok()
                .flatten()?;
            crd.data["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
                .then_some(())
        })
        .await;
    }
}

/// A ConfigMap `app-config` with `data.value`, as a manifest in a source.
pub fn configmap_yaml(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  value: {value}\n"
    )
}
