//! The webhook under test, in a process of its own so its memory is its
//! own: this binary run with `--serve DIR` serves the certificate files in
//! DIR (reloaded every second) until its standard input closes.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};

use anyhow::{anyhow, Context as _};
use openflux::certs::{Authority, Issued, DEFAULT_CA_VALIDITY, DEFAULT_CERT_VALIDITY};
use openflux::index::OwnerIndex;
use openflux::webhook::{self, WebhookArgs, WebhookMetrics};

/// The child's side: serve until stdin closes.
pub fn serve(dir: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let args = WebhookArgs {
            webhook_addr: "127.0.0.1:0".parse().map_err(anyhow::Error::msg)?,
            tls_cert_file: Some(dir.join("tls.crt")),
            tls_key_file: Some(dir.join("tls.key")),
            tls_ca_file: Some(dir.join("ca.crt")),
            tls_reload_interval_seconds: 1,
            ..WebhookArgs::default()
        };
        let listener = tokio::net::TcpListener::bind(args.webhook_addr.socket_addr()).await?;
        println!("{}", listener.local_addr()?);
        let mut index = OwnerIndex::new();
        index.reset([]);
        let stdin_closed = async {
            let _ = tokio::task::spawn_blocking(|| {
                let mut sink = Vec::new();
                let _ = std::io::stdin().read_to_end(&mut sink);
            })
            .await;
        };
        webhook::serve_on(
            listener,
            args,
            None,
            webhook::Knowledge {
                index: Arc::new(RwLock::new(index)),
                facts: Arc::new(RwLock::new(openflux::cluster::facts::Facts::everywhere(
                    openflux::cluster::target::Target::ExternalArtifact,
                    &[],
                ))),
                ..Default::default()
            },
            WebhookMetrics::default(),
            stdin_closed,
        )
        .await
    })
}

/// The certificate files a child serves, and the CA that signs them.
pub struct Certs {
    pub dir: tempfile::TempDir,
    pub ca: Authority,
}

impl Certs {
    pub fn new() -> anyhow::Result<Self> {
        let certs = Certs {
            dir: tempfile::tempdir()?,
            ca: Authority::generate(DEFAULT_CA_VALIDITY)?,
        };
        certs.rotate()?;
        Ok(certs)
    }

    /// Writes a freshly issued certificate (new key), as a Secret update
    /// does: written beside, then renamed into place.
    pub fn rotate(&self) -> anyhow::Result<()> {
        let issued: Issued = self.ca.issue(
            &["localhost".to_string()],
            &["127.0.0.1".parse()?],
            DEFAULT_CERT_VALIDITY,
        )?;
        let dir = self.dir.path();
        for (name, text) in [
            ("ca.crt", &self.ca.cert_pem),
            ("tls.key", &issued.key_pem),
            ("tls.crt", &issued.cert_pem),
        ] {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, dir.join(name))?;
        }
        Ok(())
    }

    pub fn client_config(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in openflux::certs::parse_certs(self.ca.cert_pem.as_bytes())? {
            roots.add(cert)?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(openflux::certs::provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A running child server.
pub struct Served {
    child: Child,
    pub addr: SocketAddr,
}

impl Served {
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        let exe: PathBuf = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("--serve")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the webhook process")?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line
            .trim()
            .parse()
            .with_context(|| format!("webhook address {line:?}"))?;
        Ok(Served { child, addr })
    }

    /// Resident and peak resident memory (VmRSS, VmHWM), in MiB.
    pub fn memory(&self) -> anyhow::Result<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let field = |name: &str| -> f64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
                .map_or(f64::NAN, |kb| kb / 1024.0)
        };
        Ok((field("VmRSS:"), field("VmHWM:")))
    }

    /// Closes stdin and waits for the exit; the time it took.
    pub fn stop(mut self) -> anyhow::Result<std::time::Duration> {
        let started = std::time::Instant::now();
        drop(self.child.stdin.take());
        let status = self.child.wait()?;
        if !status.success() {
            return Err(anyhow!("the webhook process exited with {status}"));
        }
        Ok(started.elapsed())
    }
}
