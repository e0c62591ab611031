//! Runs `openflux` as a local process for an end-to-end test.
#![allow(dead_code)]

use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{wait_for, Env, Fixtures};

/// A running `openflux run`, stopped (SIGTERM, then kill) on drop. When the
/// test is failing, the tail of its log is printed.
pub struct Openflux {
    child: Option<Child>,
    pub metrics_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub log: PathBuf,
}

/// A free loopback port, bound and released, and never one this process
/// handed out before: the kernel may give a released port again at the
/// next bind, and two of a test's processes (one's webhook port, the
/// other's metrics port) would then race for it.
pub fn free_addr() -> SocketAddr {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port");
        if !given.contains(&addr.port()) {
            given.push(addr.port());
            return addr;
        }
    }
}

/// Removes from `cmd`'s environment what cargo sets for the running test
/// (`CARGO_PKG_*`, `CARGO_MANIFEST_DIR`, `OUT_DIR`, ...), for a command that
/// runs cargo itself. Cargo compares the variables build scripts track
/// (ring's include `CARGO_PKG_NAME` and `OUT_DIR`) with its own environment: inherited from a
/// test, they would differ from a build started elsewhere, and every crate
/// above such a build script would be built again.
pub fn without_test_env(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref())
        {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd
}

/// Path of the openflux binary cargo built for this test run.
pub fn binary() -> PathBuf {
    super::workspace_bin("openflux")
}

impl Openflux {
    /// Starts `openflux run` against the test cluster with `args` added, and
    /// waits (bounded) until it reports ready. It acts as openflux's own
    /// identity where the control plane has one (see [`crate::identity`]);
    /// its runtime namespace (`--namespace=`) gets the shipped Roles of
    /// openflux's namespace.
    pub async fn start(env: &Env, name: &str, args: &[&str]) -> Self {
        let kubeconfig = crate::identity::openflux_kubeconfig(env);
        Self::start_as(env, name, args, kubeconfig).await
    }

    /// [`Self::start`] with the kubeconfig `kubeconfig` (`None`: the
    /// `KUBECONFIG` of the environment): openflux acting as another
    /// identity, for example one the admission policy does not accept.
    pub async fn start_as(
        env: &Env,
        name: &str,
        args: &[&str],
        kubeconfig: Option<PathBuf>,
    ) -> Self {
        if let Some(ns) = args.iter().find_map(|a| a.strip_prefix("--namespace=")) {
            crate::identity::grant_runtime_namespace(env, ns).await;
        }
        // The ports are free when chosen but not held: another process may
        // take one before openflux binds it. Then start again with others.
        for _ in 0..3 {
            let mut of = Self::spawn(name, args, kubeconfig.clone());
            if of.wait_ready(name).await {
                return of;
            }
            eprintln!(
                "openflux ({name}): a port it was given was taken meanwhile; starting it again"
            );
            of.stop();
        }
        panic!("openflux ({name}): three starts in a row found a port taken");
    }

    fn spawn(name: &str, args: &[&str], kubeconfig: Option<PathBuf>) -> Self {
        let metrics_addr = free_addr();
        let health_addr = free_addr();
        let log = std::env::temp_dir().join(format!("{}.log", super::unique_name(name)));
        let out = std::fs::File::create(&log).expect("creating the openflux log file");
        let err = out.try_clone().expect("cloning the log file handle");
        let mut cmd = Command::new(binary());
        cmd.arg("run")
            .arg(format!("--metrics-addr={metrics_addr}"))
            .arg(format!("--health-addr={health_addr}"))
            .args(args)
            // Without openflux's webhook no Artifact has a recorded writer:
            // tests that start none trust every Artifact.
            .args(
                (!args
                    .iter()
                    .any(|a| a.starts_with("--verify-artifact-writers")))
                .then_some("--verify-artifact-writers=false"),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(kc) = kubeconfig {
            cmd.env("KUBECONFIG", kc);
        }
        let child = cmd.spawn().expect("starting openflux");
        Openflux {
            child: Some(child),
            metrics_addr,
            health_addr,
            log,
        }
    }

    /// Waits (bounded) until openflux reports ready: true, or false when one
    /// of the ports it was given for metrics and health was taken.
    async fn wait_ready(&mut self, name: &str) -> bool {
        let health = self.health_addr;
        let taken = [
            format!("{}: Address already in use", self.metrics_addr),
            format!("{health}: Address already in use"),
        ];
        // The last /readyz answer, for the message of a wait that ends.
        let last = std::sync::Mutex::new(String::from("no answer"));
        let what = format!("openflux ({name}) to be ready on {health}");
        let ready = tokio::time::timeout(
            Duration::from_secs(60),
            wait_for(&what, Duration::MAX, || {
                let exited = self
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                let log = self.log.clone();
                let (taken, last) = (&taken, &last);
                async move {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    if taken.iter().any(|t| text.contains(t.as_str())) {
                        return Some(false);
                    }
                    if let Some(status) = exited {
                        panic!("openflux exited early ({status}):\n{}", tail(&log, 40));
                    }
                    match http_get(health, "/readyz").await {
                        Some((200, _)) => Some(true),
                        Some((code, body)) => {
                            *last.lock().unwrap() = format!("{code}: {}", body.trim());
                            None
                        }
                        None => None,
                    }
                }
            }),
        )
        .await;
        ready.unwrap_or_else(|_| {
            panic!(
                "timed out after 60s waiting for {what}; /readyz said {}\n{}",
                last.lock().unwrap(),
                tail(&self.log, 40)
            )
        })
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        match http_get(self.metrics_addr, "/metrics").await {
            Some((200, body)) => body,
            other => panic!("GET /metrics: {other:?}"),
        }
    }

    /// The value of the first sample whose line starts with `prefix`.
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        self.metrics()
            .await
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Stops the process with SIGTERM and waits (bounded) for it to exit.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        stop_child(self.child.take()?)
    }

    /// Kills the process with SIGKILL, as a crashed node would: no
    /// shutdown, no Lease release.
    pub fn kill(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        child.wait().ok()
    }

    /// The process id, while this handle owns the process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process still runs (it has not exited on its own).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

impl Drop for Openflux {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- openflux log ({}) ----\n{}",
                self.log.display(),
                tail(&self.log, 60)
            );
        }
        self.stop();
    }
}

/// The last `lines` lines of a file.
pub fn tail(path: &PathBuf, lines: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A plain HTTP/1.0 GET on loopback: status code and body, `None` when the
/// server does not answer.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).to_string();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .ok()
        .flatten()
}

/// A gzipped tarball holding `files` (path, contents), made with `tar`, and
/// its `sha256:<hex>` digest.
pub fn tarball(files: &[(&str, &str)]) -> (Vec<u8>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    for (path, contents) in files {
        let dest = dir.path().join(path);
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::write(&dest, contents).expect("write file");
    }
    let out = dir.path().join("artifact.tar.gz");
    let mut names: Vec<&str> = files.iter().map(|(p, _)| *p).collect();
    names.sort();
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&out)
        .arg("-C")
        .arg(dir.path())
        .args(&names)
        .status()
        .expect("running tar");
    assert!(status.success(), "tar failed");
    let bytes = std::fs::read(&out).expect("reading the tarball");
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    (bytes, digest)
}

/// Puts a tarball of `files` on the fixtures' static server, as a producer
/// would, and returns the Artifact spec pointing at it (revision
/// `<version>@<digest>`).
pub fn publish(
    fx: &Fixtures,
    ns: &str,
    name: &str,
    version: &str,
    files: &[(&str, &str)],
) -> serde_json::Value {
    let (bytes, digest) = tarball(files);
    let path = format!("artifacts/{ns}/{name}-{}.tar.gz", &digest[7..19]);
    let url = fx.put_file(&path, &bytes).expect("publishing the tarball");
    serde_json::json!({
        "url": url, "revision": format!("{version}@{digest}"), "digest": digest, "size": bytes.len(),
    })
}

/// Stops a child process: SIGTERM, a bounded wait (10 s), then SIGKILL.
pub fn stop_child(mut child: Child) -> Option<std::process::ExitStatus> {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    for _ in 0..100 {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    child.wait().ok()
}
