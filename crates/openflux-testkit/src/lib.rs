//! The openflux test kit: the local control plane, fixtures and helpers shared by the end-to-end tests and the benchmarks (`use openflux_testkit as support;`).
//!
//! [`cluster`] gives every test a client for a Kubernetes API server with the
//! stock Flux controllers: by default the local control plane of
//! `e2e/cluster` (started once per test process and shared by all test
//! binaries), or, when `KUBECONFIG` is set, that cluster as it is.
//!
//! [`cell`] gives the same for one cell of the Flux matrix: another local
//! control plane with another Flux line or other feature gates (started on
//! demand, held by one test at a time; see `e2e/lib/cells.sh`), and
//! [`set_feature_gates`] restarts a local control plane's kustomize-controller
//! and helm-controller with other `--feature-gates`.
//!
//! Tests that need the loopback fixtures (Git server, static file server)
//! take them from [`Env::fixtures`]. A test never skips: on a cluster that
//! was not started by `e2e/cluster` and without the `OPENFLUX_E2E_*` fixture
//! variables, it fails with a message naming the missing variables; a control
//! plane that cannot start fails it with the component that did not come up.
//! Waits are always bounded ([`wait_for`]); nothing sleeps to synchronize.
#![allow(dead_code)]

mod cells;
pub mod exports;
pub mod fixtures;
pub mod identity;
mod namespace;
pub mod nodes;
mod objects;
pub mod openflux;
pub mod operator;
pub mod pods;
pub mod proxy;
pub mod references;
pub mod release;
pub mod spire;
pub mod turns;
mod wait;
pub mod webhook;
pub mod writers;

pub use cells::{cell, set_feature_gates, Cell};
pub use fixtures::{Fixtures, GitRepo, FIXTURE_VARIABLES};
pub use namespace::*;
pub use objects::*;
pub use wait::wait_for;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use kube::api::DynamicObject;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Field manager used by [`apply`].
pub const FIELD_MANAGER: &str = "openflux-e2e";

/// Default bound for waits on reconciliations in the tests.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// Label set on every namespace created by [`Env::namespace`].
pub const TEST_LABEL: &str = "e2e.openflux.dev/test";

/// What a test gets from [`cluster`] or [`cell`].
pub struct Env {
    /// Which control plane this is ([`Cell::Main`] for [`cluster`]).
    pub cell: Cell,
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
    /// A cell's lock, held while this `Env` lives (see [`cell`]).
    _hold: Option<std::fs::File>,
    /// The test's turn among the modules of its binary ([`turns`]).
    _turn: Option<turns::Turn>,
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
/// calling test's runtime, once no test of another module of the binary
/// runs ([`turns`]). Panics with a readable message if the cluster cannot
/// be started or reached.
pub async fn cluster() -> Env {
    let turn = turns::Turn::take();
    let resolved = RESOLVED
        .get_or_init(|| {
            // `up` may build for a long time: keep it off the async runtime.
            std::thread::spawn(resolve)
                .join()
                .unwrap_or_else(|_| Err("starting the local control plane panicked".into()))
        })
        .as_ref()
        .unwrap_or_else(|e| panic!("e2e cluster: {e}"));
    connect(
        Cell::Main,
        resolved.local,
        resolved.kubeconfig.clone(),
        resolved.vars.clone(),
        None,
        turn,
    )
    .await
}

/// A client and the fixtures for a control plane described by `vars`
/// (the output of `e2e/cluster env`); `kubeconfig` `None` means the
/// `KUBECONFIG` of the environment.
async fn connect(
    cell: Cell,
    local: bool,
    kubeconfig: Option<PathBuf>,
    vars: BTreeMap<String, String>,
    hold: Option<std::fs::File>,
    turn: Option<turns::Turn>,
) -> Env {
    let what = cell.name();
    let config = match &kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .unwrap_or_else(|e| panic!("e2e cluster {what}: reading {}: {e}", path.display()));
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| {
                    panic!("e2e cluster {what}: kubeconfig {}: {e}", path.display())
                })
        }
        None => Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .unwrap_or_else(|e| panic!("e2e cluster {what}: kubeconfig from KUBECONFIG: {e}")),
    };
    let client = Client::try_from(config.clone())
        .unwrap_or_else(|e| panic!("e2e cluster {what}: building a client: {e}"));
    Env {
        cell,
        client,
        config,
        kubeconfig,
        local,
        fixtures: Fixtures::from_vars(&vars).map_err(|missing| fixtures::missing(local, &missing)),
        vars,
        _hold: hold,
        _turn: turn,
    }
}

impl Env {
    /// The Flux line of a local control plane (`2.9`, `2.7`), as
    /// `e2e/cluster env` reported it.
    pub fn flux_line(&self) -> Option<&str> {
        self.vars.get("OPENFLUX_E2E_FLUX_LINE").map(String::as_str)
    }

    /// The `--feature-gates` of kustomize-controller and helm-controller of
    /// a local control plane when this `Env` was made (empty: none, Flux's
    /// defaults); [`set_feature_gates`] changes them.
    pub fn feature_gates(&self) -> Option<&str> {
        self.vars
            .get("OPENFLUX_E2E_FEATURE_GATES")
            .map(String::as_str)
    }

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

    /// Deletes a namespaced object (in the background); panics naming it
    /// when the API server refuses.
    pub async fn delete_object(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        let (api, _) = dynamic_api(&self.client, api_version, kind, Some(namespace))
            .await
            .expect("discovery");
        api.delete(name, &kube::api::DeleteParams::background())
            .await
            .unwrap_or_else(|e| panic!("deleting {kind} {namespace}/{name}: {e}"));
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
