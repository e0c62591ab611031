//! End to end: the HttpSource controller against a real API server.
//!
//! Each test runs its own `openflux-http-source`, watching only the test's
//! namespace and running as a ServiceAccount bound (by a RoleBinding) to the
//! ClusterRole shipped in manifests/http-source/rbac.yaml, so every test also
//! proves those permissions suffice. Content is served by an in-test HTTP
//! server on loopback that honours `If-None-Match`, counts what it sends
//! and keeps the headers it was sent; the controller is allowed to fetch
//! from it with `--allow-network=127.0.0.1/32` (loopback is refused by
//! default, see `security`). Events for notification-controller go to an
//! in-test receiver that keeps them.

#[path = "e2e_http_source/fairness.rs"]
mod fairness;
#[path = "e2e_http_source/healing.rs"]
mod healing;
#[path = "e2e_http_source/leader.rs"]
mod leader;
#[path = "e2e_http_source/security.rs"]
mod security;
#[path = "e2e_http_source/spiffe.rs"]
mod spiffe;

use openflux_testkit as support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use openflux_api::SHARD_LABEL;
use serde_json::json;
use sha2::{Digest, Sha256};
use support::openflux::{free_addr, http_get, tail};
use support::{
    cluster, condition, field, ready_condition, request_reconcile, wait_for, Env, TIMEOUT,
};

const HTTP_SOURCE: &str = "sources.openflux.dev/v1alpha1";
const ARTIFACT: &str = "openflux.dev/v1alpha1";
const ROLE: &str = "openflux-http-source";

// ------------------------------------------------------------ content ----

/// What the in-test server serves at one path, and what it answered.
#[derive(Default, Clone)]
struct Served {
    body: Vec<u8>,
    /// Answer 503 instead.
    down: bool,
    /// Require this `Authorization` header.
    authorization: Option<String>,
    /// Answer `302 Found` with this `Location` instead.
    redirect: Option<String>,
    /// The headers of every request, names in lower case.
    seen: Vec<HashMap<String, String>>,
    /// 200 responses with a body.
    full: u64,
    /// 304 responses.
    not_modified: u64,
    /// Every request.
    requests: u64,
}

#[derive(Clone, Default)]
struct Content(Arc<Mutex<HashMap<String, Served>>>);

impl Content {
    fn with<T>(&self, path: &str, f: impl FnOnce(&mut Served) -> T) -> T {
        let mut map = self.0.lock().unwrap();
        f(map.entry(path.to_string()).or_default())
    }
    fn put(&self, path: &str, body: Vec<u8>) {
        self.with(path, |s| s.body = body);
    }
    fn set_down(&self, path: &str, down: bool) {
        self.with(path, |s| s.down = down);
    }
    fn stats(&self, path: &str) -> Served {
        self.with(path, |s| s.clone())
    }
}

/// Serves `Content` on 127.0.0.1 with ETags (`"<sha256>"`) and 304s.
struct ContentServer {
    addr: SocketAddr,
    content: Content,
    task: tokio::task::JoinHandle<()>,
}

impl ContentServer {
    async fn start() -> Self {
        Self::start_on("127.0.0.1").await
    }

    /// A content server on another loopback address (Linux routes all of
    /// 127.0.0.0/8 to the loopback interface).
    async fn start_on(ip: &str) -> Self {
        let content = Content::default();
        let router = Router::new()
            .route("/{*path}", get(serve_content))
            .with_state(content.clone());
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .expect("binding the content server");
        let addr = listener.local_addr().expect("content server address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        ContentServer {
            addr,
            content,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }
}

impl Drop for ContentServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_content(
    State(content): State<Content>,
    UrlPath(path): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let mut map = content.0.lock().unwrap();
    let Some(served) = map.get_mut(&path) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    served.requests += 1;
    served.seen.push(
        headers
            .iter()
            .map(|(n, v)| {
                let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (n.as_str().to_string(), value)
            })
            .collect(),
    );
    if served.down {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if let Some(location) = &served.redirect {
        return (StatusCode::FOUND, [(header::LOCATION, location.clone())]).into_response();
    }
    if let Some(expected) = &served.authorization {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if given != Some(expected.as_str()) {
            return StatusCode::UNAUTHORIZED.into_response();
        }
    }
    let etag = format!("\"{}\"", hex::encode(Sha256::digest(&served.body)));
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    if matches {
        served.not_modified += 1;
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    served.full += 1;
    ([(header::ETAG, etag)], served.body.clone()).into_response()
}

/// Stands in for notification-controller's event endpoint (`--events-addr`):
/// keeps every event posted to it, answers 202 as notification-controller
/// does.
struct EventReceiver {
    addr: SocketAddr,
    events: Arc<Mutex<Vec<serde_json::Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventReceiver {
    async fn start() -> Self {
        let events: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let keep = events.clone();
        let router = Router::new().route(
            "/",
            post(move |body: axum::body::Bytes| {
                let keep = keep.clone();
                async move {
                    match serde_json::from_slice(&body) {
                        Ok(event) => {
                            keep.lock().unwrap().push(event);
                            StatusCode::ACCEPTED
                        }
                        Err(_) => StatusCode::BAD_REQUEST,
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the event receiver");
        let addr = listener.local_addr().expect("event receiver address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        EventReceiver { addr, events, task }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Waits for an event with `reason` about an object of `kind`.
    async fn wait_for(&self, reason: &str, kind: &str) -> serde_json::Value {
        let what = format!("a {reason} event about a {kind} posted to notification-controller");
        wait_for(&what, TIMEOUT, || async {
            self.events
                .lock()
                .unwrap()
                .iter()
                .find(|e| e["reason"] == reason && e["involvedObject"]["kind"] == kind)
                .cloned()
        })
        .await
    }
}

impl Drop for EventReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A tar.gz of `files` (path, contents) with the given mtime and owner, in
/// the given order, so tests can serve the same content packed differently.
fn tgz(files: &[(&str, &str)], mtime: u64, uid: u64) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(0o640);
        header.set_mtime(mtime);
        header.set_uid(uid);
        header.set_gid(uid);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, contents.as_bytes())
            .expect("tar entry");
    }
    gzip(&builder.into_inner().expect("tar"))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

/// A tar.gz with one raw entry: name and link target are written byte for
/// byte (the tar crate refuses unsafe names), to build malicious archives.
fn raw_tgz(name: &str, kind: tar::EntryType, link: &str, data: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_ustar();
    header.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    if !link.is_empty() {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, data).expect("raw tar entry");
    gzip(&builder.into_inner().expect("tar"))
}

/// The files of a tar.gz: (path, contents), directories left out.
fn untgz(bytes: &[u8]) -> Vec<(String, String)> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut out = Vec::new();
    for entry in archive.entries().expect("tar entries") {
        let mut entry = entry.expect("tar entry");
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().expect("path").to_string_lossy().into_owned();
        let mut contents = String::new();
        entry.read_to_string(&mut contents).expect("contents");
        out.push((path, contents));
    }
    out
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

// --------------------------------------------------------- controller ----

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_openflux-http-source"))
}

/// A running `openflux-http-source`, stopped on drop (its log tail printed
/// when the test fails).
struct Controller {
    child: Option<Child>,
    metrics_addr: SocketAddr,
    storage_addr: SocketAddr,
    storage: tempfile::TempDir,
    log: PathBuf,
}

/// How to start a controller beyond the defaults.
struct Launch {
    /// Flags added at the end.
    extra: Vec<String>,
    /// `--allow-network` values (default: the loopback content server's).
    allow: Vec<String>,
    /// The storage directory (a fresh one when `None`).
    storage: Option<tempfile::TempDir>,
    /// Environment variables added.
    env: Vec<(String, String)>,
    /// Name of the log file and of the pod (`POD_NAME`, `HOSTNAME`).
    instance: String,
    /// Wait for `/readyz` (a standby of leader election is never ready).
    wait_ready: bool,
    /// Watch every namespace (`ns` is then the runtime namespace only).
    watch_all: bool,
}

impl Launch {
    fn new(ns: &str, extra: &[String]) -> Self {
        Launch {
            extra: extra.to_vec(),
            allow: vec!["127.0.0.1/32".to_string()],
            storage: None,
            env: Vec::new(),
            instance: format!("{ns}-controller"),
            wait_ready: true,
            watch_all: false,
        }
    }
}

impl Controller {
    async fn launch(kubeconfig: &Path, ns: &str, launch: Launch) -> Self {
        let (metrics_addr, health_addr, storage_addr) = (free_addr(), free_addr(), free_addr());
        let storage = match launch.storage {
            Some(dir) => dir,
            None => tempfile::tempdir().expect("storage dir"),
        };
        let log = std::env::temp_dir().join(format!("{}-http-source.log", launch.instance));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file handle");
        let child = Command::new(binary())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--watch-all-namespaces={}", launch.watch_all))
            .arg(format!("--namespace={ns}"))
            .arg(format!("--storage-path={}", storage.path().display()))
            .arg(format!("--storage-addr={storage_addr}"))
            .arg(format!("--storage-adv-addr={storage_addr}"))
            .arg(format!("--metrics-addr={metrics_addr}"))
            .arg(format!("--health-addr={health_addr}"))
            .arg("--artifact-retention-ttl=10s")
            .arg("--artifact-retention-records=2")
            .arg("--log-level=debug")
            .args(launch.allow.iter().map(|a| format!("--allow-network={a}")))
            .args(&launch.extra)
            .env("POD_NAME", &launch.instance)
            .env("HOSTNAME", &launch.instance)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("all_proxy")
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting openflux-http-source");
        let mut controller = Controller {
            child: Some(child),
            metrics_addr,
            storage_addr,
            storage,
            log,
        };
        let probe = if launch.wait_ready {
            "/readyz"
        } else {
            "/healthz"
        };
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
                matches!(http_get(health_addr, probe).await, Some((200, _))).then_some(())
            }
        })
        .await;
        controller
    }

    /// Stops the controller (SIGTERM, as Kubernetes does) and hands back its
    /// storage.
    fn stop(mut self) -> tempfile::TempDir {
        self.terminate();
        let placeholder = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self.storage, placeholder)
    }

    fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            for _ in 0..50 {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The whole log so far.
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A sample of `openflux_http_source_fetches_total` (0 when absent).
    async fn fetches(&self, result: &str) -> u64 {
        let series = format!("openflux_http_source_fetches_total{{result=\"{result}\"}}");
        self.metric(&series).await.map_or(0, |v| v as u64)
    }

    /// The value of one series on `/metrics`, if present.
    async fn metric(&self, series: &str) -> Option<f64> {
        let Some((200, text)) = http_get(self.metrics_addr, "/metrics").await else {
            panic!("GET /metrics failed");
        };
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
    }

    /// The JSON log lines written so far.
    fn json_log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Downloads an artifact URL (it must point at this controller).
    async fn download(&self, url: &str) -> Vec<u8> {
        let prefix = format!("http://{}", self.storage_addr);
        let path = url
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("artifact url {url} is not under {prefix}"));
        let (status, body) = self.artifact_server(path).await;
        assert_eq!(status, 200, "GET {url}");
        body
    }

    /// GET `path` (sent as written) from the artifact server: status, body.
    async fn artifact_server(&self, path: &str) -> (u16, Vec<u8>) {
        // The artifact server answers binary bodies; fetch them raw.
        let mut stream = tokio::net::TcpStream::connect(self.storage_addr)
            .await
            .expect("connecting to the artifact server");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.storage_addr);
        stream.write_all(request.as_bytes()).await.expect("request");
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
            .await
            .expect("artifact download timed out")
            .expect("reading the artifact");
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP response");
        let head = String::from_utf8_lossy(&response[..split]);
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head}"));
        (status, response[split + 4..].to_vec())
    }

    /// The artifact files stored for a source.
    fn stored_files(&self, ns: &str, name: &str) -> Vec<String> {
        let dir = self.storage.path().join(ns).join(name);
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".tar.gz"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- openflux-http-source log ({}) ----\n{}",
                self.log.display(),
                tail(&self.log, 80)
            );
        }
        self.terminate();
    }
}

// -------------------------------------------------------------- setup ----

/// The CRDs: openflux's Artifact (committed manifest) and the HttpSource
/// CRD as the binary prints it.
async fn install_crds(env: &Env) {
    support::install_artifact_crd(env).await;
    let out = Command::new(binary())
        .arg("crds")
        .output()
        .expect("running openflux-http-source crds");
    assert!(out.status.success(), "openflux-http-source crds failed");
    env.apply_yaml(&String::from_utf8_lossy(&out.stdout))
        .await
        .expect("installing the HttpSource CRD");
    support::wait_established(
        env,
        &["artifacts.openflux.dev", "httpsources.sources.openflux.dev"],
    )
    .await;
}

/// The shipped ClusterRole, a ServiceAccount in `ns` bound to it by a
/// RoleBinding, and a kubeconfig that impersonates that ServiceAccount.
async fn service_account_kubeconfig(env: &Env, ns: &str, dir: &Path) -> PathBuf {
    use serde::Deserialize as _;
    for doc in serde_yaml_ng::Deserializer::from_str(include_str!(
        "../../../manifests/http-source/rbac.yaml"
    )) {
        let mut value = serde_json::Value::deserialize(doc).expect("rbac.yaml");
        if value["kind"] == "ClusterRole" {
            env.apply(&value).await.expect("applying the ClusterRole");
        }
        // The leader election Role and its binding, moved to the test's
        // namespace (the controller runs there).
        if value["kind"] == "Role" || value["kind"] == "RoleBinding" {
            value["metadata"]["namespace"] = json!(ns);
            if let Some(subjects) = value.get_mut("subjects").and_then(|s| s.as_array_mut()) {
                for subject in subjects {
                    subject["namespace"] = json!(ns);
                }
            }
            env.apply(&value)
                .await
                .expect("applying the leader election Role");
        }
    }
    env.apply(&json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": ROLE, "namespace": ns},
    }))
    .await
    .expect("ServiceAccount");
    env.apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": ROLE, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": ROLE, "namespace": ns}],
    }))
    .await
    .expect("RoleBinding");

    let source = admin_kubeconfig(env);
    let text = std::fs::read_to_string(&source).expect("reading the kubeconfig");
    let mut config: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("kubeconfig YAML");
    let user = format!("system:serviceaccount:{ns}:{ROLE}");
    if let Some(users) = config.get_mut("users").and_then(|u| u.as_sequence_mut()) {
        for entry in users {
            if let Some(auth) = entry.get_mut("user").and_then(|u| u.as_mapping_mut()) {
                auth.insert("as".into(), user.clone().into());
            }
        }
    }
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        serde_yaml_ng::to_string(&config).expect("kubeconfig"),
    )
    .expect("write");
    path
}

/// The cluster admin's kubeconfig file.
fn admin_kubeconfig(env: &Env) -> PathBuf {
    env.kubeconfig
        .clone()
        .or_else(|| {
            std::env::var("KUBECONFIG")
                .ok()
                .and_then(|v| v.split(':').next().map(PathBuf::from))
        })
        .expect("a kubeconfig file")
}

/// One test's world: cluster, namespace, content server and controller.
struct World {
    env: Env,
    ns: support::TestNamespace,
    server: ContentServer,
    controller: Controller,
    /// The ServiceAccount's kubeconfig, to start more controllers.
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

async fn world(prefix: &str) -> World {
    world_with(prefix, &[]).await
}

/// A world whose controller gets `extra` flags.
async fn world_with(prefix: &str, extra: &[String]) -> World {
    world_launched(prefix, |ns| Launch::new(ns, extra)).await
}

/// A world whose controller is started as `launch` says.
async fn world_launched(prefix: &str, launch: impl FnOnce(&str) -> Launch) -> World {
    let env = cluster().await;
    install_crds(&env).await;
    let ns = env.namespace(prefix).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = service_account_kubeconfig(&env, ns.name(), dir.path()).await;
    let server = ContentServer::start().await;
    let controller = Controller::launch(&kubeconfig, ns.name(), launch(ns.name())).await;
    World {
        env,
        ns,
        server,
        controller,
        kubeconfig,
        _dir: dir,
    }
}

impl World {
    fn ns(&self) -> &str {
        self.ns.name()
    }

    async fn apply_source(&self, name: &str, spec: serde_json::Value) {
        self.env
            .apply(&json!({
                "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
                "metadata": {"name": name, "namespace": self.ns()},
                "spec": spec,
            }))
            .await
            .expect("applying the HttpSource");
    }

    async fn source(&self, name: &str) -> Option<DynamicObject> {
        self.env
            .get(HTTP_SOURCE, "HttpSource", Some(self.ns()), name)
            .await
            .ok()
            .flatten()
    }

    async fn artifact(&self, name: &str) -> Option<DynamicObject> {
        self.env
            .get(ARTIFACT, "Artifact", Some(self.ns()), name)
            .await
            .ok()
            .flatten()
    }

    /// Waits until the source is Ready with a revision other than `not`,
    /// and returns it.
    async fn wait_ready(&self, name: &str, not: Option<&str>) -> DynamicObject {
        let what = format!("HttpSource {name} Ready at a revision other than {not:?}");
        wait_for(&what, TIMEOUT, || async {
            let obj = self.source(name).await?;
            let (status, _, _) = ready_condition(&obj)?;
            let revision = revision(&obj)?;
            (status == "True" && Some(revision.as_str()) != not).then_some(obj)
        })
        .await
    }

    /// Waits until `Ready` is False with `reason`; returns the message.
    async fn wait_not_ready(&self, name: &str, reason: &str) -> (DynamicObject, String) {
        let what = format!("HttpSource {name} Ready=False with reason {reason}");
        wait_for(&what, TIMEOUT, || async {
            let obj = self.source(name).await?;
            let (status, r, message) = ready_condition(&obj)?;
            (status == "False" && r == reason).then_some((obj, message))
        })
        .await
    }

    async fn events(&self, name: &str, reason: &str) -> Vec<K8sEvent> {
        let api: Api<K8sEvent> = Api::namespaced(self.env.client.clone(), self.ns());
        api.list(&ListParams::default())
            .await
            .expect("listing events")
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    async fn patch_labels(&self, name: &str, labels: serde_json::Value) {
        let ar = kube::core::ApiResource::from_gvk(&support::gvk(HTTP_SOURCE, "HttpSource"));
        let api: Api<DynamicObject> = Api::namespaced_with(self.env.client.clone(), self.ns(), &ar);
        let patch = json!({ "metadata": { "labels": labels } });
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("labelling the HttpSource");
    }

    async fn patch_spec(&self, name: &str, spec: serde_json::Value) {
        let ar = kube::core::ApiResource::from_gvk(&support::gvk(HTTP_SOURCE, "HttpSource"));
        let api: Api<DynamicObject> = Api::namespaced_with(self.env.client.clone(), self.ns(), &ar);
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .expect("patching the HttpSource");
    }
}

fn revision(obj: &DynamicObject) -> Option<String> {
    field(obj, "/status/artifact/revision")?
        .as_str()
        .map(str::to_string)
}

fn text(obj: &DynamicObject, pointer: &str) -> String {
    field(obj, pointer)
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

/// The digest `openflux-http-source digest` computes for served bytes.
fn cli_digest(bytes: &[u8], url: &str) -> String {
    cli_digest_ignoring(bytes, url, None)
}

fn cli_digest_ignoring(bytes: &[u8], url: &str, ignore: Option<&str>) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("served");
    std::fs::write(&file, bytes).expect("write");
    let out = Command::new(binary())
        .arg("digest")
        .arg(&file)
        .arg(format!("--url={url}"))
        .args(ignore.map(|i| format!("--ignore={i}")))
        .output()
        .expect("running openflux-http-source digest");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

const CONFIG_ONE: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  v: one\n";
const CONFIG_TWO: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  v: two\n";

// -------------------------------------------------------------- tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_an_artifact_and_follows_the_remote() {
    let w = world("hs-publish").await;
    let path = "releases/app.tar.gz";
    let served = tgz(
        &[("deploy/app.yaml", CONFIG_ONE), ("README.md", "# app\n")],
        1_700_000_000,
        1000,
    );
    w.server.content.put(path, served.clone());
    let url = w.server.url(path);
    w.apply_source(
        "app",
        json!({"url": url, "interval": "1s", "ignore": "*.md\n"}),
    )
    .await;

    // Ready, with an Artifact owned by the source whose digest is the one of
    // the file it names, holding what the remote serves (minus ignored files).
    let hs = w.wait_ready("app", None).await;
    let first = revision(&hs).expect("revision");
    let artifact = wait_for("the Artifact", TIMEOUT, || w.artifact("app")).await;
    let owner = &artifact.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        ("HttpSource", "app", Some(true), Some(true))
    );
    assert_eq!(Some(&owner.uid), hs.metadata.uid.as_ref());
    // Moved to a shard: the Artifact follows its source's shard label, so
    // that shard's openflux exports it.
    w.patch_labels("app", json!({ SHARD_LABEL: "shard1" }))
        .await;
    wait_for("the Artifact in its source's shard", TIMEOUT, || async {
        let a = w.artifact("app").await?;
        (a.metadata.labels?.get(SHARD_LABEL)? == "shard1").then_some(())
    })
    .await;
    assert_eq!(text(&artifact, "/spec/revision"), first);
    assert_eq!(text(&artifact, "/spec/digest"), first);
    assert_eq!(
        text(&artifact, "/spec/url"),
        text(&hs, "/status/artifact/url")
    );
    let bytes = w.controller.download(&text(&artifact, "/spec/url")).await;
    assert_eq!(
        sha256(&bytes),
        first,
        "the digest is the sha256 of the artifact file"
    );
    assert_eq!(
        field(&artifact, "/spec/size").and_then(|v| v.as_i64()),
        Some(bytes.len() as i64)
    );
    assert_eq!(
        untgz(&bytes),
        [("deploy/app.yaml".to_string(), CONFIG_ONE.to_string())]
    );
    // The CLI computes the same digest from the served file.
    assert_eq!(cli_digest_ignoring(&served, &url, Some("*.md\n")), first);
    assert_eq!(
        field(&hs, "/status/observedGeneration").and_then(|v| v.as_i64()),
        hs.metadata.generation
    );

    // The same content packed differently (mtime, owner) is the same artifact.
    w.server.content.put(
        path,
        tgz(
            &[("README.md", "# other\n"), ("deploy/app.yaml", CONFIG_ONE)],
            5,
            0,
        ),
    );
    let full = w.server.content.stats(path).full;
    wait_for("the repacked archive to be downloaded", TIMEOUT, || async {
        (w.server.content.stats(path).full > full).then_some(())
    })
    .await;
    // One more successful fetch after it: still the first revision.
    let requests = w.server.content.stats(path).requests;
    wait_for("another fetch", TIMEOUT, || async {
        (w.server.content.stats(path).requests > requests + 1).then_some(())
    })
    .await;
    assert_eq!(
        revision(&w.wait_ready("app", None).await).as_deref(),
        Some(first.as_str())
    );

    // An unchanged remote costs no download: only 304s, no new revision.
    let downloaded = w.controller.fetches("downloaded").await;
    let full = w.server.content.stats(path).full;
    let not_modified = w.controller.fetches("not_modified").await;
    wait_for("three not-modified fetches", TIMEOUT, || async {
        (w.controller.fetches("not_modified").await >= not_modified + 3).then_some(())
    })
    .await;
    assert_eq!(w.controller.fetches("downloaded").await, downloaded);
    assert_eq!(w.server.content.stats(path).full, full);
    assert!(w.server.content.stats(path).not_modified >= 3);

    // New content: a new revision, an Artifact that follows, an Event.
    w.server
        .content
        .put(path, tgz(&[("deploy/app.yaml", CONFIG_TWO)], 0, 0));
    let hs = w.wait_ready("app", Some(&first)).await;
    let second = revision(&hs).expect("revision");
    let artifact = wait_for("the Artifact at the new revision", TIMEOUT, || async {
        let a = w.artifact("app").await?;
        (text(&a, "/spec/revision") == second).then_some(a)
    })
    .await;
    let bytes = w.controller.download(&text(&artifact, "/spec/url")).await;
    assert_eq!(sha256(&bytes), second);
    assert_eq!(
        untgz(&bytes),
        [("deploy/app.yaml".to_string(), CONFIG_TWO.to_string())]
    );
    let events = wait_for("two NewArtifact events", TIMEOUT, || async {
        let e = w.events("app", "NewArtifact").await;
        (e.len() >= 2).then_some(e)
    })
    .await;
    assert!(events
        .iter()
        .any(|e| e.note.as_deref().is_some_and(|n| n.contains(&second))));

    // A third revision: the oldest artifact file is collected (2 records kept).
    w.server.content.put(
        path,
        tgz(
            &[(
                "deploy/app.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n",
            )],
            0,
            0,
        ),
    );
    let third = revision(&w.wait_ready("app", Some(&second)).await).expect("revision");
    let hex = |r: &str| format!("{}.tar.gz", r.trim_start_matches("sha256:"));
    let want = {
        let mut want = vec![hex(&second), hex(&third)];
        want.sort();
        want
    };
    wait_for(
        "two artifact files: the current and the previous",
        TIMEOUT,
        || async { (w.controller.stored_files(w.ns(), "app") == want).then_some(()) },
    )
    .await;

    // Deleting the source deletes its Artifact (ownerReference) and storage.
    let ar = kube::core::ApiResource::from_gvk(&support::gvk(HTTP_SOURCE, "HttpSource"));
    let api: Api<DynamicObject> = Api::namespaced_with(w.env.client.clone(), w.ns(), &ar);
    api.delete("app", &DeleteParams::foreground())
        .await
        .expect("deleting the HttpSource");
    wait_for("the Artifact to be garbage collected", TIMEOUT, || async {
        w.artifact("app").await.is_none().then_some(())
    })
    .await;
    wait_for(
        "the storage of the source to be removed",
        TIMEOUT,
        || async {
            w.controller
                .stored_files(w.ns(), "app")
                .is_empty()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keeps_the_last_artifact_while_the_remote_is_down() {
    let w = world("hs-down").await;
    let path = "app.tgz";
    w.server
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_ONE)], 0, 0));
    w.apply_source("app", json!({"url": w.server.url(path), "interval": "1s"}))
        .await;
    let good = revision(&w.wait_ready("app", None).await).expect("revision");

    w.server.content.set_down(path, true);
    let (hs, message) = w.wait_not_ready("app", "FetchFailed").await;
    assert!(message.contains("503"), "{message}");
    assert_eq!(
        revision(&hs).as_deref(),
        Some(good.as_str()),
        "status keeps the artifact"
    );
    let reconciling = condition(&hs, "Reconciling").expect("Reconciling");
    assert_eq!(reconciling.0, "True");
    let artifact = w.artifact("app").await.expect("the Artifact stays");
    assert_eq!(text(&artifact, "/spec/revision"), good);
    w.controller.download(&text(&artifact, "/spec/url")).await;
    wait_for("a FetchFailed warning event", TIMEOUT, || async {
        let e = w.events("app", "FetchFailed").await;
        e.iter()
            .any(|e| e.type_.as_deref() == Some("Warning"))
            .then_some(())
    })
    .await;

    // Back up: Ready again at the same revision.
    w.server.content.set_down(path, false);
    let hs = w.wait_ready("app", None).await;
    assert_eq!(revision(&hs).as_deref(), Some(good.as_str()));
    assert!(condition(&hs, "Reconciling").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_unsafe_archives_and_unexpected_digests() {
    let w = world("hs-reject").await;
    let cases = [
        (
            "dotdot",
            raw_tgz(
                "../escape.yaml",
                tar::EntryType::Regular,
                "",
                CONFIG_ONE.as_bytes(),
            ),
            "ArchiveRejected",
            "'..'",
        ),
        (
            "absolute",
            raw_tgz(
                "/etc/evil.yaml",
                tar::EntryType::Regular,
                "",
                CONFIG_ONE.as_bytes(),
            ),
            "ArchiveRejected",
            "absolute",
        ),
        (
            "symlink",
            raw_tgz(
                "link.yaml",
                tar::EntryType::Symlink,
                "../../etc/passwd",
                b"",
            ),
            "ArchiveRejected",
            "outside",
        ),
        (
            "device",
            raw_tgz("dev", tar::EntryType::Char, "", b""),
            "ArchiveRejected",
            "device",
        ),
        (
            "html",
            b"<html><body>Sign in</body></html>".to_vec(),
            "InvalidArtifact",
            "neither",
        ),
    ];
    for (name, body, _, _) in &cases {
        w.server.content.put(name, body.clone());
        w.apply_source(name, json!({"url": w.server.url(name), "interval": "1m"}))
            .await;
    }
    // An archive that is fine but not the one pinned by spec.digest.
    w.server
        .content
        .put("pinned", tgz(&[("app.yaml", CONFIG_ONE)], 0, 0));
    let wrong = format!("sha256:{}", "0".repeat(64));
    w.apply_source(
        "pinned",
        json!({"url": w.server.url("pinned"), "interval": "1m", "digest": wrong}),
    )
    .await;

    for (name, _, reason, needle) in &cases {
        let (hs, message) = w.wait_not_ready(name, reason).await;
        assert!(message.contains(needle), "{name}: {message}");
        assert!(revision(&hs).is_none(), "{name}: nothing published");
        assert!(w.artifact(name).await.is_none(), "{name}: no Artifact");
    }
    let (_, message) = w.wait_not_ready("pinned", "DigestMismatch").await;
    assert!(message.contains(&wrong), "{message}");
    assert!(w.artifact("pinned").await.is_none());

    // Pinning the right digest (as the CLI computes it) publishes it.
    let served = w.server.content.stats("pinned").body;
    let right = cli_digest(&served, &w.server.url("pinned"));
    w.patch_spec("pinned", json!({"digest": right})).await;
    let hs = w.wait_ready("pinned", None).await;
    assert_eq!(revision(&hs), Some(right));

    // An invalid spec stalls.
    w.apply_source(
        "bad-ignore",
        json!({"url": w.server.url("pinned"), "interval": "1m", "ignore": "a{b\n[z-a]\n"}),
    )
    .await;
    let (hs, _) = w.wait_not_ready("bad-ignore", "InvalidSpec").await;
    assert_eq!(
        condition(&hs, "Stalled").map(|c| c.0).as_deref(),
        Some("True")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticates_and_wraps_a_single_yaml_file() {
    let w = world("hs-auth").await;
    let path = "private/install.yaml";
    w.server.content.put(path, CONFIG_ONE.as_bytes().to_vec());
    w.server
        .content
        .with(path, |s| s.authorization = Some("Bearer s3cret".into()));
    w.apply_source(
        "app",
        json!({"url": w.server.url(path), "interval": "1m", "secretRef": {"name": "creds"}}),
    )
    .await;
    let (_, message) = w.wait_not_ready("app", "AuthenticationFailed").await;
    assert!(message.contains("creds"), "{message}");

    w.env
        .apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds", "namespace": w.ns()},
            "stringData": {"headers": "Authorization: Bearer s3cret\n"},
        }))
        .await
        .expect("Secret");
    let hs = w.wait_ready("app", None).await;
    let bytes = w
        .controller
        .download(&text(&hs, "/status/artifact/url"))
        .await;
    assert_eq!(
        untgz(&bytes),
        [("install.yaml".to_string(), CONFIG_ONE.to_string())]
    );
    assert_eq!(
        revision(&hs),
        Some(cli_digest(CONFIG_ONE.as_bytes(), &w.server.url(path)))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_stops_fetching_and_a_request_fetches_now() {
    let w = world("hs-suspend").await;
    w.server
        .content
        .put("clock", tgz(&[("a.yaml", CONFIG_ONE)], 0, 0));
    w.server
        .content
        .put("app", tgz(&[("a.yaml", CONFIG_ONE)], 0, 0));
    // A second source fetching every second is the test's clock.
    w.apply_source(
        "clock",
        json!({"url": w.server.url("clock"), "interval": "1s"}),
    )
    .await;
    w.apply_source("app", json!({"url": w.server.url("app"), "interval": "1s"}))
        .await;
    let first = revision(&w.wait_ready("app", None).await).expect("revision");
    w.wait_ready("clock", None).await;

    w.patch_spec("app", json!({"suspend": true})).await;
    // Let the controller see the change: two clock ticks.
    let ticks = |n: u64| {
        let base = w.server.content.stats("clock").requests;
        let content = w.server.content.clone();
        async move {
            wait_for(&format!("{n} clock ticks"), TIMEOUT, || async {
                (content.stats("clock").requests >= base + n).then_some(())
            })
            .await
        }
    };
    ticks(2).await;
    let suspended = w.server.content.stats("app").requests;
    ticks(4).await;
    assert_eq!(
        w.server.content.stats("app").requests,
        suspended,
        "a suspended source does not fetch"
    );
    let hs = w.source("app").await.expect("source");
    assert_eq!(revision(&hs).as_deref(), Some(first.as_str()));
    assert!(w.artifact("app").await.is_some(), "the Artifact stays");

    // Resumed with a long interval: a reconcile request fetches at once.
    w.server
        .content
        .put("app", tgz(&[("a.yaml", CONFIG_TWO)], 0, 0));
    w.patch_spec("app", json!({"suspend": false, "interval": "1h"}))
        .await;
    let second = revision(&w.wait_ready("app", Some(&first)).await).expect("revision");
    w.server
        .content
        .put("app", tgz(&[("a.yaml", CONFIG_ONE)], 0, 0));
    ticks(2).await;
    assert_eq!(
        revision(&w.source("app").await.expect("source")).as_deref(),
        Some(second.as_str()),
        "no fetch before the 1h interval"
    );
    request_reconcile(&w.env.client, HTTP_SOURCE, "HttpSource", w.ns(), "app")
        .await
        .expect("requesting a reconcile");
    let hs = w.wait_ready("app", Some(&second)).await;
    assert_eq!(revision(&hs).as_deref(), Some(first.as_str()));
    let requested = hs
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("reconcile.fluxcd.io/requestedAt"))
        .cloned();
    let handled = wait_for("lastHandledReconcileAt", TIMEOUT, || async {
        let hs = w.source("app").await?;
        let handled = field(&hs, "/status/lastHandledReconcileAt")?
            .as_str()?
            .to_string();
        Some(handled)
    })
    .await;
    assert_eq!(Some(handled), requested);
}

/// Flux's conventions, as an operator sees them: the leader election Lease,
/// Flux's metrics for the object, JSON logs with the reconcile keys, and
/// events posted to notification-controller in Flux's format, about the
/// HttpSource until its Artifact is exported and about the exported object
/// after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_flux_conventions() {
    let receiver = EventReceiver::start().await;
    let w = world_with(
        "hs-flux",
        &[
            "--enable-leader-election".to_string(),
            format!("--events-addr={}", receiver.url()),
            "--log-encoding=json".to_string(),
        ],
    )
    .await;
    let ns = w.ns().to_string();

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(w.env.client.clone(), &ns);
    let lease = leases
        .get("openflux-http-source-leader-election")
        .await
        .expect("the leader election Lease");
    let spec = lease.spec.expect("Lease spec");
    assert!(
        spec.holder_identity.is_some_and(|h| !h.is_empty()),
        "the Lease has a holder"
    );
    assert_eq!(spec.lease_duration_seconds, Some(35));

    let path = "flux.tgz";
    w.server
        .content
        .put(path, tgz(&[("deploy/app.yaml", CONFIG_ONE)], 0, 0));
    w.apply_source("app", json!({"url": w.server.url(path), "interval": "1m"}))
        .await;
    let first = revision(&w.wait_ready("app", None).await).expect("revision");

    // Metrics, under Flux's names and labels.
    let object = format!("kind=\"HttpSource\",name=\"app\",namespace=\"{ns}\"");
    let c = &w.controller;
    wait_for(
        "gotk_reconcile_duration_seconds for the source",
        TIMEOUT,
        || async {
            let series = format!("gotk_reconcile_duration_seconds_count{{{object}}}");
            c.metric(&series).await.filter(|n| *n >= 1.0)
        },
    )
    .await;
    let total = |result: &str| {
        format!(
            "controller_runtime_reconcile_total{{controller=\"httpsource\",result=\"{result}\"}}"
        )
    };
    assert!(c.metric(&total("requeue_after")).await.unwrap_or(0.0) >= 1.0);
    assert_eq!(
        c.metric("controller_runtime_max_concurrent_reconciles{controller=\"httpsource\"}")
            .await,
        Some(4.0)
    );
    assert_eq!(
        c.metric(&format!("gotk_suspend_status{{{object}}}")).await,
        Some(0.0)
    );
    assert_eq!(
        c.metric(&format!(
            "gotk_reconcile_condition{{{object},type=\"Ready\",status=\"True\"}}"
        ))
        .await,
        Some(1.0)
    );

    // The new artifact, posted about the HttpSource (not exported yet).
    let event = receiver.wait_for("NewArtifact", "HttpSource").await;
    assert_eq!(event["severity"], "info");
    assert_eq!(event["involvedObject"]["name"], "app");
    assert_eq!(event["involvedObject"]["namespace"], ns.as_str());
    assert_eq!(event["involvedObject"]["apiVersion"], HTTP_SOURCE);
    assert!(event["involvedObject"]["uid"].is_string());
    assert_eq!(
        event["metadata"]["sources.openflux.dev/revision"],
        first.as_str()
    );
    assert_eq!(
        event["metadata"]["sources.openflux.dev/digest"],
        first.as_str()
    );
    assert_eq!(event["reportingController"], "openflux-http-source");
    assert_eq!(event["reportingInstance"], format!("{ns}-controller"));
    assert!(event["message"]
        .as_str()
        .is_some_and(|m| m.contains(&first)));
    assert!(event["timestamp"].is_string());

    // A failure: a Warning, severity error, counted as a reconcile error.
    w.server.content.set_down(path, true);
    w.env
        .apply(&json!({
            "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
            "metadata": {"name": "app", "namespace": ns},
            "spec": {"url": w.server.url(path), "interval": "2s"},
        }))
        .await
        .expect("shortening the interval");
    w.wait_not_ready("app", "FetchFailed").await;
    let event = receiver.wait_for("FetchFailed", "HttpSource").await;
    assert_eq!(event["severity"], "error");
    assert!(
        c.metric("controller_runtime_reconcile_errors_total{controller=\"httpsource\"}")
            .await
            .unwrap_or(0.0)
            >= 1.0
    );

    // openflux exports the Artifact (here: its status says so, as openflux's
    // export controller writes it): the recovery is posted about the
    // exported object, which an Alert can select.
    let ar = kube::core::ApiResource::from_gvk(&support::gvk(ARTIFACT, "Artifact"));
    let artifacts: Api<DynamicObject> = Api::namespaced_with(w.env.client.clone(), &ns, &ar);
    artifacts
        .patch_status(
            "app",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"exportedRef": {
                "apiVersion": "source.toolkit.fluxcd.io/v1",
                "kind": "ExternalArtifact",
                "name": "httpsource-app",
                "namespace": ns,
            }}})),
        )
        .await
        .expect("writing the Artifact's exportedRef");
    w.server.content.set_down(path, false);
    let event = receiver.wait_for("Succeeded", "ExternalArtifact").await;
    assert_eq!(event["involvedObject"]["name"], "httpsource-app");
    assert_eq!(event["severity"], "info");
    assert_eq!(
        event["metadata"]["source.toolkit.fluxcd.io/revision"],
        first.as_str()
    );

    // The logs: zap's JSON with controller-runtime's keys.
    let log = c.json_log();
    let stored = log
        .iter()
        .find(|l| l["msg"] == "stored new artifact")
        .unwrap_or_else(|| panic!("no 'stored new artifact' line in {log:#?}"));
    assert_eq!(stored["level"], "info");
    assert!(stored["ts"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(stored["controller"], "httpsource");
    assert_eq!(stored["controllerGroup"], "sources.openflux.dev");
    assert_eq!(stored["controllerKind"], "HttpSource");
    assert_eq!(
        stored["HttpSource"],
        json!({"name": "app", "namespace": ns})
    );
    assert_eq!(stored["name"], "app");
    assert!(stored["reconcileID"].is_string());
    assert_eq!(stored["revision"], first.as_str());
    let failed = log
        .iter()
        .find(|l| l["msg"] == "reconcile failed")
        .expect("a 'reconcile failed' line");
    assert_eq!(failed["level"], "error");
    assert_eq!(failed["reason"], "FetchFailed");

    // A deleted source takes its gotk_* series with it.
    let hs_api = kube::core::ApiResource::from_gvk(&support::gvk(HTTP_SOURCE, "HttpSource"));
    Api::<DynamicObject>::namespaced_with(w.env.client.clone(), &ns, &hs_api)
        .delete("app", &DeleteParams::default())
        .await
        .expect("deleting the HttpSource");
    wait_for("the source's gotk_* series to go", TIMEOUT, || async {
        let series = format!("gotk_reconcile_duration_seconds_count{{{object}}}");
        c.metric(&series).await.is_none().then_some(())
    })
    .await;
}

/// `openflux run` for this namespace. Only what it does is awaited (the
/// ExternalArtifact it exports), not its readiness endpoint.
struct OpenfluxRun {
    child: Child,
    log: PathBuf,
}

impl OpenfluxRun {
    fn start(env: &Env, ns: &str) -> Self {
        let log = std::env::temp_dir().join(format!("{ns}-openflux.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file handle");
        let mut cmd = Command::new(support::openflux::binary());
        cmd.arg("run")
            .arg("--watch-all-namespaces=false")
            // No webhook here: no Artifact has a recorded writer.
            .arg("--verify-artifact-writers=false")
            .arg(format!("--namespace={ns}"))
            .arg(format!("--metrics-addr={}", free_addr()))
            .arg(format!("--health-addr={}", free_addr()))
            .arg(format!("--webhook-addr={}", free_addr()))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // As openflux's own identity on the local control plane.
        if let Some(kubeconfig) = support::identity::openflux_kubeconfig(env) {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        let child = cmd.spawn().expect("starting openflux run");
        OpenfluxRun { child, log }
    }
}

impl Drop for OpenfluxRun {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- openflux log ({}) ----\n{}",
                self.log.display(),
                tail(&self.log, 40)
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fails, naming what is missing, unless Flux's source-controller and
/// kustomize-controller CRDs are installed.
async fn require_flux(env: &Env) {
    for crd in [
        "kustomizations.kustomize.toolkit.fluxcd.io",
        "ocirepositories.source.toolkit.fluxcd.io",
    ] {
        let installed = env
            .get(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                None,
                crd,
            )
            .await
            .unwrap_or_else(|e| panic!("reading CRD {crd}: {e}"))
            .is_some();
        assert!(
            installed,
            "CRD {crd} is not installed: this test needs Flux's source-controller and \
             kustomize-controller in the cluster"
        );
    }
}

/// The whole path a user sees: HttpSource -> Artifact -> ExternalArtifact
/// (openflux's export controller) -> Kustomization (stock kustomize-controller
/// with its ExternalArtifact feature gate) -> objects in the cluster, and a
/// change of the remote rolled out the same way. The Kustomization names the
/// exported object; with openflux's webhook it may name the HttpSource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kustomization_deploys_what_an_http_source_fetches() {
    let receiver = EventReceiver::start().await;
    let w = world_with("hs-flow", &[format!("--events-addr={}", receiver.url())]).await;
    require_flux(&w.env).await;
    let ns = w.ns().to_string();
    let _openflux = OpenfluxRun::start(&w.env, &ns);

    let configmap = |v: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: flow\ndata:\n  v: {v}\n")
    };
    let path = "flow.tgz";
    w.server
        .content
        .put(path, tgz(&[("deploy/cm.yaml", &configmap("one"))], 0, 0));
    w.apply_source("app", json!({"url": w.server.url(path), "interval": "1s"}))
        .await;
    let first = revision(&w.wait_ready("app", None).await).expect("revision");

    // An ExternalArtifact or a shadow OCIRepository, as the cluster's Flux
    // flags allow: found through the Artifact's status.
    let (_, exported) = support::exports::wait_export(&w.env, &ns, "app", |e| {
        text(e, "/status/artifact/digest") == first
    })
    .await;
    let origin = text(
        &exported,
        "/status/artifact/metadata/org.opencontainers.image.source",
    );
    assert!(
        origin.starts_with("HttpSource.") && origin.ends_with("/app"),
        "{origin}"
    );
    let export_ref = support::exports::reference_to(&exported);

    w.env
        .apply(&json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "app", "namespace": ns},
            "spec": {
                "interval": "1m", "prune": true, "path": "./deploy", "targetNamespace": ns,
                "sourceRef": export_ref,
            },
        }))
        .await
        .expect("applying the Kustomization");

    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(w.env.client.clone(), &ns);
    let value = |cms: Api<k8s_openapi::api::core::v1::ConfigMap>| async move {
        cms.get_opt("flow")
            .await
            .ok()
            .flatten()
            .and_then(|cm| cm.data)
            .and_then(|d| d.get("v").cloned())
    };
    wait_for(
        "the ConfigMap deployed from the HttpSource",
        TIMEOUT,
        || {
            let cms = cms.clone();
            async move { (value(cms).await.as_deref() == Some("one")).then_some(()) }
        },
    )
    .await;

    w.server
        .content
        .put(path, tgz(&[("deploy/cm.yaml", &configmap("two"))], 0, 0));
    let second = revision(&w.wait_ready("app", Some(&first)).await).expect("revision");
    wait_for("the change rolled out", TIMEOUT, || {
        let cms = cms.clone();
        async move { (value(cms).await.as_deref() == Some("two")).then_some(()) }
    })
    .await;
    // kustomize-controller writes its status after applying: wait for it.
    wait_for(
        &format!("the Kustomization to report {second} as applied"),
        TIMEOUT,
        || async {
            let ks = w
                .env
                .get(
                    "kustomize.toolkit.fluxcd.io/v1",
                    "Kustomization",
                    Some(&ns),
                    "app",
                )
                .await
                .ok()
                .flatten()?;
            (text(&ks, "/status/lastAppliedRevision") == second).then_some(())
        },
    )
    .await;
}

/// The real notification-controller of the local control plane delivers an
/// Alert on an HttpSource's event to a receiver: the controller posts the
/// event about the object openflux exported the source's Artifact to (an
/// Alert cannot select a custom kind), notification-controller matches the
/// Alert and forwards it through a generic Provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_reaches_a_receiver_through_notification_controller() {
    let env = cluster().await;
    let var = |name: &str| {
        env.vars
            .get(name)
            .filter(|v| !v.is_empty() && v.as_str() != "unset")
            .cloned()
            .unwrap_or_else(|| {
                panic!("{name} is not set: this test needs the notification-controller and the alert receiver of e2e/cluster")
            })
    };
    let events_addr = var("OPENFLUX_E2E_EVENTS_ADDR");
    let receiver_url = var("OPENFLUX_E2E_RECEIVER_URL");
    let w = world_with("hs-alert", &[format!("--events-addr={events_addr}")]).await;
    let ns = w.ns().to_string();
    let receiver = format!("{}/{ns}", receiver_url.trim_end_matches('/'));

    w.env
        .apply(&json!({
            "apiVersion": "notification.toolkit.fluxcd.io/v1beta3", "kind": "Provider",
            "metadata": {"name": "receiver", "namespace": ns},
            "spec": {"type": "generic", "address": receiver},
        }))
        .await
        .expect("the Provider");
    w.env
        .apply(&json!({
            "apiVersion": "notification.toolkit.fluxcd.io/v1beta3", "kind": "Alert",
            "metadata": {"name": "exports", "namespace": ns},
            "spec": {
                "providerRef": {"name": "receiver"},
                "eventSeverity": "info",
                "eventSources": [{"kind": "ExternalArtifact", "name": "*"}],
            },
        }))
        .await
        .expect("the Alert");

    let path = "alert.tgz";
    w.server
        .content
        .put(path, tgz(&[("deploy/app.yaml", CONFIG_ONE)], 0, 0));
    w.apply_source("app", json!({"url": w.server.url(path), "interval": "2s"}))
        .await;
    let first = revision(&w.wait_ready("app", None).await).expect("revision");
    wait_for("the Artifact", TIMEOUT, || async {
        w.artifact("app").await
    })
    .await;

    // The Artifact is exported (its status says so, as openflux writes it).
    let ar = kube::core::ApiResource::from_gvk(&support::gvk(ARTIFACT, "Artifact"));
    Api::<DynamicObject>::namespaced_with(w.env.client.clone(), &ns, &ar)
        .patch_status(
            "app",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"exportedRef": {
                "apiVersion": "source.toolkit.fluxcd.io/v1",
                "kind": "ExternalArtifact",
                "name": "app-httpsource--62b7e5876f24",
                "namespace": ns,
            }}})),
        )
        .await
        .expect("writing the Artifact's exportedRef");

    // New content: a new artifact, posted about the export, alerted on.
    w.server
        .content
        .put(path, tgz(&[("deploy/app.yaml", CONFIG_TWO)], 0, 0));
    let second = revision(&w.wait_ready("app", Some(&first)).await).expect("revision");
    let client = reqwest::Client::new();
    let delivered = wait_for("the Alert's notification at the receiver", TIMEOUT, || {
        let client = client.clone();
        let receiver = receiver.clone();
        let second = second.clone();
        async move {
            let body = client
                .get(&receiver)
                .send()
                .await
                .ok()?
                .bytes()
                .await
                .ok()?;
            let bodies: Vec<serde_json::Value> = serde_json::from_slice(&body).ok()?;
            bodies.into_iter().find(|b| {
                b["involvedObject"]["kind"] == "ExternalArtifact"
                    && b["metadata"]["revision"] == second.as_str()
            })
        }
    })
    .await;
    assert_eq!(
        delivered["involvedObject"]["name"],
        "app-httpsource--62b7e5876f24"
    );
    assert_eq!(delivered["involvedObject"]["namespace"], ns.as_str());
    assert_eq!(delivered["severity"], "info");
    assert_eq!(delivered["reportingController"], "openflux-http-source");
}
