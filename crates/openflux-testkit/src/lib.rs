//! The openflux test kit: the local control plane, fixtures and helpers shared by the end-to-end tests and the benchmarks (`use openflux_testkit as support;`).
//!
//! [`cluster`] gives every test a client for a Kubernetes API server with the
//! stock Flux controllers: by default the local control plane of
//! `e2e/cluster` (started once per test process and shared by all test
//! binaries), or, when `KUBECONFIG` is set, that cluster as it is.
//!
//! Tests that need the loopback fixtures (Git server, static file server)
//! take them from [`Env::fixtures`], which is `None` on a cluster that was not
//! started by `e2e/cluster` unless the `OPENFLUX_E2E_*` variables are set; use
//! [`Env::fixtures_or_skip`] to skip with a clear message then.
//!
//! Waits are always bounded ([`wait_for`]); nothing sleeps to synchronize.
#![allow(dead_code)]

pub mod openflux;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context as _};
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
    /// The loopback fixtures, when known.
    pub fixtures: Option<Fixtures>,
    /// Every `OPENFLUX_E2E_*` variable (and `KUBECONFIG`) of the environment
    /// description, for helpers that need more than the fields above.
    pub vars: BTreeMap<String, String>,
}

/// The test fixtures served on loopback by `e2e/cluster`.
#[derive(Clone, Debug)]
pub struct Fixtures {
    /// Base URL of the Git smart HTTP server; `<git_url>/<name>.git` is the
    /// bare repository `<git_root>/<name>.git`.
    pub git_url: String,
    /// Directory of the served bare repositories.
    pub git_root: PathBuf,
    /// Base URL of the static file server; `<http_url>/<path>` is
    /// `<http_root>/<path>`.
    pub http_url: String,
    /// Directory served by the static file server.
    pub http_root: PathBuf,
    /// A Helm repository with the chart `hello` 0.1.0.
    pub helm_repo_url: Option<String>,
    /// `host:port` of source-controller's artifact storage, if known.
    pub source_storage_addr: Option<String>,
    /// `host:port` of source-watcher's artifact storage, if known.
    pub watcher_storage_addr: Option<String>,
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
            "{} up failed ({status}); see its output above and the logs in its state directory",
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

fn fixtures_from(vars: &BTreeMap<String, String>) -> Option<Fixtures> {
    let get = |k: &str| vars.get(k).filter(|v| !v.is_empty()).cloned();
    Some(Fixtures {
        git_url: get("OPENFLUX_E2E_GIT_URL")?,
        git_root: PathBuf::from(get("OPENFLUX_E2E_GIT_ROOT")?),
        http_url: get("OPENFLUX_E2E_HTTP_URL")?,
        http_root: PathBuf::from(get("OPENFLUX_E2E_HTTP_ROOT")?),
        helm_repo_url: get("OPENFLUX_E2E_HELM_REPO_URL"),
        source_storage_addr: get("OPENFLUX_E2E_SOURCE_STORAGE_ADDR"),
        watcher_storage_addr: get("OPENFLUX_E2E_WATCHER_STORAGE_ADDR"),
    })
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
        fixtures: fixtures_from(&resolved.vars),
        vars: resolved.vars.clone(),
    }
}

impl Env {
    /// The fixtures, or `None` after printing why `test` is skipped. Use as
    /// `let Some(fx) = env.fixtures_or_skip("my_test") else { return };`
    pub fn fixtures_or_skip(&self, test: &str) -> Option<&Fixtures> {
        if self.fixtures.is_none() {
            eprintln!(
                "SKIPPED {test}: needs the loopback fixtures of e2e/cluster \
                 (OPENFLUX_E2E_GIT_URL, OPENFLUX_E2E_GIT_ROOT, OPENFLUX_E2E_HTTP_URL, \
                 OPENFLUX_E2E_HTTP_ROOT); unset KUBECONFIG to use the local control plane"
            );
        }
        self.fixtures.as_ref()
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

    /// The kubectl matching the local control plane's version, if known.
    pub fn kubectl(&self) -> Option<PathBuf> {
        self.vars.get("OPENFLUX_E2E_KUBECTL").map(PathBuf::from)
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

// -------------------------------------------------------------------- git --

/// A bare repository served by the fixtures Git server.
#[derive(Clone, Debug)]
pub struct GitRepo {
    /// Repository name without `.git`.
    pub name: String,
    /// Path of the bare repository.
    pub path: PathBuf,
    /// Clone URL over HTTP (what a GitRepository's `spec.url` takes).
    pub url: String,
    /// The branch commits go to (`main`).
    pub branch: String,
}

fn git(dir: Option<&Path>, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new("git");
    cmd.args([
        "-c",
        "init.defaultBranch=main",
        "-c",
        "user.name=openflux-e2e",
        "-c",
        "user.email=e2e@openflux.invalid",
        "-c",
        "commit.gpgsign=false",
        "-c",
        "protocol.file.allow=always",
    ]);
    if let Some(dir) = dir {
        cmd.arg("-C").arg(dir);
    }
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Fixtures {
    /// URL of a file under the static root (`path` relative to it).
    pub fn http_file_url(&self, path: &str) -> String {
        format!(
            "{}/{}",
            self.http_url.trim_end_matches('/'),
            path.trim_start_matches('/')
        )
    }

    /// Writes a file under the static root (creating directories) and
    /// returns its URL.
    pub fn put_file(&self, path: &str, contents: &[u8]) -> anyhow::Result<String> {
        let dest = self.http_root.join(path.trim_start_matches('/'));
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&dest, contents).with_context(|| format!("writing {}", dest.display()))?;
        Ok(self.http_file_url(path))
    }

    /// A repository by name (it need not exist yet).
    pub fn repo(&self, name: &str) -> GitRepo {
        GitRepo {
            name: name.to_string(),
            path: self.git_root.join(format!("{name}.git")),
            url: format!("{}/{name}.git", self.git_url.trim_end_matches('/')),
            branch: "main".to_string(),
        }
    }

    /// Creates a new bare repository `<name>.git` whose branch `main` has one
    /// commit with `files` (path, contents). Returns it and the commit SHA.
    pub fn create_repo(
        &self,
        name: &str,
        files: &[(&str, &str)],
    ) -> anyhow::Result<(GitRepo, String)> {
        let repo = self.repo(name);
        if repo.path.exists() {
            bail!("repository {} already exists", repo.path.display());
        }
        let path = repo
            .path
            .to_str()
            .ok_or_else(|| anyhow!("non UTF-8 path"))?;
        git(None, &["init", "-q", "--bare", path])?;
        let sha = repo.commit(files, &[], "Initial commit")?;
        Ok((repo, sha))
    }
}

impl GitRepo {
    /// Pushes one commit to the branch that writes `files` (path, contents)
    /// and removes `remove` (paths); returns the new commit SHA.
    pub fn commit(
        &self,
        files: &[(&str, &str)],
        remove: &[&str],
        message: &str,
    ) -> anyhow::Result<String> {
        let work = tempfile::tempdir().context("creating a work tree")?;
        let wt = work.path();
        let bare = self
            .path
            .to_str()
            .ok_or_else(|| anyhow!("non UTF-8 path"))?;
        git(Some(wt), &["init", "-q"])?;
        // An empty repository has no branch yet: start from scratch then.
        if git(
            None,
            &[
                "--git-dir",
                bare,
                "rev-parse",
                "--verify",
                "-q",
                &format!("refs/heads/{}", self.branch),
            ],
        )
        .is_ok()
        {
            git(Some(wt), &["fetch", "-q", bare, &self.branch])?;
            git(
                Some(wt),
                &["checkout", "-q", "-B", &self.branch, "FETCH_HEAD"],
            )?;
        } else {
            git(Some(wt), &["checkout", "-q", "-b", &self.branch])?;
        }
        for (path, contents) in files {
            let dest = wt.join(path);
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&dest, contents).with_context(|| format!("writing {path}"))?;
        }
        for path in remove {
            git(Some(wt), &["rm", "-q", "-r", "--ignore-unmatch", path])?;
        }
        git(Some(wt), &["add", "-A"])?;
        git(Some(wt), &["commit", "-q", "--allow-empty", "-m", message])?;
        git(
            Some(wt),
            &[
                "push",
                "-q",
                bare,
                &format!("HEAD:refs/heads/{}", self.branch),
            ],
        )?;
        git(Some(wt), &["rev-parse", "HEAD"])
    }

    /// The SHA the branch points at.
    pub fn head(&self) -> anyhow::Result<String> {
        let bare = self
            .path
            .to_str()
            .ok_or_else(|| anyhow!("non UTF-8 path"))?;
        git(
            None,
            &[
                "--git-dir",
                bare,
                "rev-parse",
                &format!("refs/heads/{}", self.branch),
            ],
        )
    }

    /// The revision string Flux reports for the branch head:
    /// `<branch>@sha1:<sha>`.
    pub fn flux_revision(&self, sha: &str) -> String {
        format!("{}@sha1:{sha}", self.branch)
    }
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
