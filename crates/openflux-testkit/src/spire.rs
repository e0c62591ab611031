//! A real SPIFFE Workload API for the tests: a SPIRE server and agent
//! (built from their Go module by `e2e/cluster build-spiffe`), started
//! under a directory of the test's own and stopped on drop.
//!
//! The server listens on a free loopback port (agents only) and a unix
//! socket (its admin API); it keeps its data in sqlite3 and attests the
//! agent by a join token. The agent serves the Workload API on a unix
//! socket and attests workloads with the unix attestor: a process is
//! identified by the path of its executable, so a test registers an entry
//! per binary (copy a binary to give it another identity). Nothing listens
//! beyond loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::openflux::{free_addr, tail};
use crate::wait_for;

/// How long the server and agent get to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The bin dir of the SPIFFE binaries (`spire-server`, `spire-agent`,
/// `spiffe-fetch`), built on first use. Panics with the build's reason.
pub fn spiffe_bin_dir() -> PathBuf {
    let script = crate::cluster_script();
    let out = Command::new(&script)
        .arg("build-spiffe")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {} build-spiffe: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} build-spiffe failed ({}): its output above names what did not build",
        script.display(),
        out.status
    );
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    for name in ["spire-server", "spire-agent", "spiffe-fetch"] {
        assert!(dir.join(name).is_file(), "no {name} in {}", dir.display());
    }
    dir
}

/// A running SPIRE server and agent of one trust domain.
pub struct Spire {
    pub trust_domain: String,
    pub bin: PathBuf,
    dir: PathBuf,
    server: Option<Child>,
    agent: Option<Child>,
    server_socket: PathBuf,
    agent_socket: PathBuf,
}

impl Spire {
    /// Starts a server and an agent for `trust_domain` under `dir` (which
    /// must exist and stay short: unix socket paths are limited to 107
    /// bytes), and waits until the agent serves the Workload API.
    pub async fn start(dir: &Path, trust_domain: &str) -> Spire {
        let bin = spiffe_bin_dir();
        let server_addr = free_addr();
        let server_socket = dir.join("server.sock");
        let agent_socket = dir.join("agent.sock");
        assert!(
            agent_socket.as_os_str().len() < 100,
            "{} is too long for a unix socket",
            agent_socket.display()
        );
        for data in ["server-data", "agent-data"] {
            std::fs::create_dir_all(dir.join(data)).expect("SPIRE data dir");
        }
        std::fs::write(
            dir.join("server.conf"),
            server_conf(dir, trust_domain, server_addr, &server_socket),
        )
        .expect("writing server.conf");
        let mut spire = Spire {
            trust_domain: trust_domain.to_string(),
            bin,
            dir: dir.to_path_buf(),
            server: None,
            agent: None,
            server_socket,
            agent_socket,
        };
        spire.server = Some(spire.spawn("spire-server", "server.conf"));
        let socket = spire.server_socket.display().to_string();
        spire
            .wait_healthy("spire-server", &["healthcheck", "-socketPath", &socket])
            .await;
        let token = spire.join_token();
        std::fs::write(
            dir.join("agent.conf"),
            agent_conf(dir, trust_domain, server_addr, &spire.agent_socket, &token),
        )
        .expect("writing agent.conf");
        spire.agent = Some(spire.spawn("spire-agent", "agent.conf"));
        let socket = spire.agent_socket.display().to_string();
        spire
            .wait_healthy("spire-agent", &["healthcheck", "-socketPath", &socket])
            .await;
        spire
    }

    /// The Workload API address, as `SPIFFE_ENDPOINT_SOCKET` takes it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.agent_socket.display())
    }

    /// The SPIFFE ID of `path` in this trust domain.
    pub fn id(&self, path: &str) -> String {
        format!("spiffe://{}{path}", self.trust_domain)
    }

    /// Registers `spiffe://<trust domain><path>` for processes running the
    /// executable `binary`, its X.509-SVIDs valid for `ttl` (the agent
    /// renews them at about half of it). Returns the ID.
    pub fn register(&self, path: &str, binary: &Path, ttl: Duration) -> String {
        let id = self.id(path);
        let binary =
            std::fs::canonicalize(binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        let out = self.server_cmd(&[
            "entry",
            "create",
            "-parentID",
            &self.id("/agent"),
            "-spiffeID",
            &id,
            "-selector",
            &format!("unix:path:{}", binary.display()),
            "-x509SVIDTTL",
            &ttl.as_secs().to_string(),
        ]);
        assert!(
            out.status.success(),
            "registering {id}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        id
    }

    fn server_cmd(&self, args: &[&str]) -> Output {
        let socket = self.server_socket.display().to_string();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-socketPath", &socket]);
        Command::new(self.bin.join("spire-server"))
            .args(&all)
            .stdin(Stdio::null())
            .output()
            .expect("running spire-server")
    }

    fn join_token(&self) -> String {
        let out = self.server_cmd(&[
            "token",
            "generate",
            "-spiffeID",
            &self.id("/agent"),
            "-ttl",
            "600",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "spire-server token generate: {text}");
        text.lines()
            .find_map(|l| l.strip_prefix("Token:"))
            .map(|t| t.trim().to_string())
            .unwrap_or_else(|| panic!("no token in {text:?}"))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn spawn(&self, name: &str, conf: &str) -> Child {
        let out = std::fs::File::create(self.log(name)).expect("log file");
        let err = out.try_clone().expect("log file handle");
        Command::new(self.bin.join(name))
            .arg("run")
            .arg("-config")
            .arg(self.dir.join(conf))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"))
    }

    async fn wait_healthy(&mut self, name: &str, args: &[&str]) {
        let binary = self.bin.join(name);
        let log = self.log(name);
        let child = if name == "spire-server" {
            &mut self.server
        } else {
            &mut self.agent
        };
        wait_for(&format!("{name} to be healthy"), START_TIMEOUT, || {
            let exited = child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            let healthy = Command::new(&binary)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            let log = log.clone();
            async move {
                if let Some(status) = exited {
                    panic!("{name} exited ({status}):\n{}", tail(&log, 40));
                }
                healthy.then_some(())
            }
        })
        .await;
    }
}

impl Drop for Spire {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in ["spire-server", "spire-agent"] {
                eprintln!("---- {name} log ----\n{}", tail(&self.log(name), 40));
            }
        }
        for child in [self.agent.take(), self.server.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn server_conf(dir: &Path, trust_domain: &str, addr: SocketAddr, socket: &Path) -> String {
    let data = dir.join("server-data");
    format!(
        r#"server {{
  bind_address = "{ip}"
  bind_port = "{port}"
  socket_path = "{socket}"
  trust_domain = "{trust_domain}"
  data_dir = "{data}"
  log_level = "DEBUG"
  ca_ttl = "24h"
  default_x509_svid_ttl = "1h"
}}

plugins {{
  DataStore "sql" {{
    plugin_data {{
      database_type = "sqlite3"
      connection_string = "{data}/datastore.sqlite3"
    }}
  }}
  NodeAttestor "join_token" {{
    plugin_data {{}}
  }}
  KeyManager "memory" {{
    plugin_data {{}}
  }}
}}
"#,
        ip = addr.ip(),
        port = addr.port(),
        socket = socket.display(),
        data = data.display(),
    )
}

fn agent_conf(
    dir: &Path,
    trust_domain: &str,
    server: SocketAddr,
    socket: &Path,
    token: &str,
) -> String {
    format!(
        r#"agent {{
  data_dir = "{data}"
  log_level = "DEBUG"
  server_address = "{ip}"
  server_port = "{port}"
  socket_path = "{socket}"
  trust_domain = "{trust_domain}"
  insecure_bootstrap = true
  join_token = "{token}"
}}

plugins {{
  NodeAttestor "join_token" {{
    plugin_data {{}}
  }}
  KeyManager "memory" {{
    plugin_data {{}}
  }}
  WorkloadAttestor "unix" {{
    plugin_data {{
      discover_workload_path = true
    }}
  }}
}}
"#,
        data = dir.join("agent-data").display(),
        ip = server.ip(),
        port = server.port(),
        socket = socket.display(),
    )
}
