//! A small HTTPS load generator: HTTP/1.1 with keep-alive over a few
//! rustls connections, posting prepared bodies in turn.
//!
//! - [`saturate`]: closed loop, every connection sends its next request as
//!   soon as the previous answer arrived; requests per second.
//! - [`paced`]: open loop at a fixed rate. A pacing thread releases request
//!   `i` at `start + i / rate` whatever happened before; latency counts from
//!   that intended time (so queueing behind a slow answer is measured, not
//!   hidden), and the pacer's own lateness is reported apart.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use axum::body::{Body, Bytes};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Mutex};
use tokio_rustls::TlsConnector;

/// Where and what to send.
pub struct Target {
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
    pub server_name: ServerName<'static>,
    pub path: String,
    /// Request bodies, sent in turn.
    pub bodies: Vec<Bytes>,
    next: AtomicUsize,
}

impl Target {
    pub fn new(
        addr: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
        path: &str,
        bodies: Vec<Bytes>,
    ) -> Arc<Self> {
        Arc::new(Target {
            addr,
            tls,
            server_name,
            path: path.to_string(),
            bodies,
            next: AtomicUsize::new(0),
        })
    }

    fn next_body(&self) -> Bytes {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.bodies[i % self.bodies.len()].clone()
    }
}

/// A TLS client configuration trusting the PEM CA bundle `ca_pem`,
/// offering HTTP/1.1 only.
pub fn client_config(ca_pem: &[u8]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in openflux::certs::parse_certs(ca_pem).context("reading the CA bundle")? {
        roots.add(cert).context("adding a CA certificate")?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One keep-alive connection.
pub struct Connection {
    sender: SendRequest<Body>,
    target: Arc<Target>,
}

impl Connection {
    pub async fn open(target: &Arc<Target>) -> anyhow::Result<Self> {
        let tcp = TcpStream::connect(target.addr)
            .await
            .with_context(|| format!("connecting to {}", target.addr))?;
        tcp.set_nodelay(true)?;
        let tls = TlsConnector::from(target.tls.clone())
            .connect(target.server_name.clone(), tcp)
            .await
            .context("TLS handshake")?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Connection {
            sender,
            target: target.clone(),
        })
    }

    /// Posts the next body; returns the whole answer.
    pub async fn post_next(&mut self) -> anyhow::Result<Bytes> {
        let body = self.target.next_body();
        self.post(body).await
    }

    pub async fn post(&mut self, body: Bytes) -> anyhow::Result<Bytes> {
        self.sender.ready().await.context("connection closed")?;
        let request = Request::post(&self.target.path)
            .header(HOST, "localhost")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(body))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = axum::body::to_bytes(Body::new(response.into_body()), usize::MAX).await?;
        if !status.is_success() {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }
}

/// Result of a closed-loop run.
#[derive(Clone, Copy, Debug)]
pub struct Saturation {
    /// Answers counted in the measured window.
    pub requests: u64,
    pub per_second: f64,
    /// Every answer, the warm-up's included.
    pub answered: u64,
}

/// Closed loop on `connections` connections: `warmup`, then answers are
/// counted for `duration`.
pub async fn saturate(
    target: &Arc<Target>,
    connections: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Saturation> {
    let mut conns = Vec::new();
    for _ in 0..connections {
        conns.push(Connection::open(target).await?);
    }
    let start = Instant::now() + Duration::from_millis(10);
    let from = start + warmup;
    let until = from + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        tasks.spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let (mut counted, mut answered) = (0u64, 0u64);
            loop {
                conn.post_next().await?;
                answered += 1;
                let now = Instant::now();
                if now >= until {
                    return Ok::<_, anyhow::Error>((counted, answered));
                }
                if now >= from {
                    counted += 1;
                }
            }
        });
    }
    let (mut requests, mut answered) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (counted, all) = done.map_err(|e| anyhow!("load task failed: {e}"))??;
        requests += counted;
        answered += all;
    }
    Ok(Saturation {
        requests,
        per_second: requests as f64 / duration.as_secs_f64(),
        answered,
    })
}

/// Result of an open-loop run.
#[derive(Clone, Debug)]
pub struct Paced {
    /// Latency of each measured request from its intended send time, ms.
    pub latencies_ms: Vec<f64>,
    /// How late the pacer released each measured request, ms.
    pub pacer_lag_ms: Vec<f64>,
    /// Requests intended per second.
    pub rate: f64,
    /// Requests answered per second over the measured window.
    pub achieved: f64,
}

/// Open loop at `rate` requests per second over `connections` connections:
/// `warmup`, then `duration` measured. A request waits for a free
/// connection when all are busy (that wait is part of its latency).
pub async fn paced(
    target: &Arc<Target>,
    connections: usize,
    rate: f64,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Paced> {
    let mut conns = Vec::new();
    for _ in 0..connections {
        conns.push(Connection::open(target).await?);
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let warm = (warmup.as_secs_f64() * rate).round() as u64;
    let total = warm + (duration.as_secs_f64() * rate).round() as u64;
    let (tx, rx) = mpsc::unbounded_channel::<(u64, Instant, Instant)>();
    let rx = Arc::new(Mutex::new(rx));
    let start = Instant::now() + Duration::from_millis(20);

    // The pacer: a plain thread sleeps more precisely than the runtime's
    // millisecond timer.
    let pacer = std::thread::spawn(move || {
        for i in 0..total {
            let due = start + period.mul_f64(i as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if tx.send((i, due, Instant::now())).is_err() {
                return;
            }
        }
    });

    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let rx = rx.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut lags = Vec::new();
            loop {
                let job = rx.lock().await.recv().await;
                let Some((i, due, released)) = job else {
                    return Ok::<_, anyhow::Error>((latencies, lags));
                };
                conn.post_next().await?;
                let done = Instant::now();
                if i >= warm {
                    latencies.push(done.duration_since(due).as_secs_f64() * 1000.0);
                    lags.push(released.duration_since(due).as_secs_f64() * 1000.0);
                }
            }
        });
    }
    // The workers hold the receiver now: when they stop, the pacer stops.
    drop(rx);
    let mut latencies_ms = Vec::new();
    let mut pacer_lag_ms = Vec::new();
    let mut failure = None;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok((l, g))) => {
                latencies_ms.extend(l);
                pacer_lag_ms.extend(g);
            }
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(anyhow!("load task failed: {e}")),
        }
        if failure.is_some() {
            tasks.abort_all();
            break;
        }
    }
    let _ = tokio::task::spawn_blocking(move || pacer.join()).await;
    if let Some(e) = failure {
        return Err(e);
    }
    let measured = latencies_ms.len() as f64;
    Ok(Paced {
        latencies_ms,
        pacer_lag_ms,
        rate,
        achieved: measured / duration.as_secs_f64(),
    })
}
