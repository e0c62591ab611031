//! Closed-loop HTTPS clients: each posts its body, waits for the answer,
//! posts again; it reconnects every few requests so TLS handshakes keep
//! happening during the run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use axum::body::{Body, Bytes};
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// One client's work.
#[derive(Clone)]
pub struct Load {
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
    pub body: Bytes,
    pub reconnect_every: usize,
}

/// What the clients saw.
#[derive(Default, Debug)]
pub struct Tally {
    pub statuses: BTreeMap<u16, u64>,
    /// Requests without an answer (connection or TLS errors).
    pub failures: u64,
    pub first_failures: Vec<String>,
    pub latencies: Vec<Duration>,
}

impl Tally {
    pub fn merge(&mut self, other: Tally) {
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        self.failures += other.failures;
        self.first_failures.extend(other.first_failures);
        self.first_failures.truncate(5);
        self.latencies.extend(other.latencies);
    }

    pub fn answered(&self) -> u64 {
        self.statuses.values().sum()
    }

    pub fn not_ok(&self) -> u64 {
        self.statuses
            .iter()
            .filter(|(s, _)| **s != 200)
            .map(|(_, n)| n)
            .sum::<u64>()
            + self.failures
    }

    /// The `q` quantile of the latencies, in ms.
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[i].as_secs_f64() * 1000.0
    }
}

async fn connect(load: &Load) -> anyhow::Result<SendRequest<Body>> {
    let tcp = TcpStream::connect(load.addr).await?;
    let tls = TlsConnector::from(load.tls.clone())
        .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
        .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn post(sender: &mut SendRequest<Body>, body: Bytes) -> anyhow::Result<u16> {
    let len = body.len();
    let request = Request::post(openflux::webhook::server::MUTATE_PATH)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("content-length", len)
        .body(Body::from(body))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    axum::body::to_bytes(Body::new(response.into_body()), usize::MAX)
        .await
        .map_err(|e| anyhow!("reading the answer: {e}"))?;
    Ok(status)
}

/// Runs one client until `until`.
pub async fn run(load: Load, until: Instant) -> Tally {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let mut sender = match connect(&load).await {
            Ok(sender) => sender,
            Err(e) => {
                tally.failures += 1;
                if tally.first_failures.len() < 5 {
                    tally.first_failures.push(format!("connect: {e:#}"));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        for _ in 0..load.reconnect_every {
            if Instant::now() >= until {
                break;
            }
            let started = Instant::now();
            match post(&mut sender, load.body.clone()).await {
                Ok(status) => {
                    tally.latencies.push(started.elapsed());
                    *tally.statuses.entry(status).or_default() += 1;
                    if status == 429 {
                        // `Retry-After: 1`, honoured as the API server does.
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    if status != 200 {
                        break;
                    }
                }
                Err(e) => {
                    tally.failures += 1;
                    if tally.first_failures.len() < 5 {
                        tally.first_failures.push(format!("request: {e:#}"));
                    }
                    break;
                }
            }
        }
    }
    tally
}

/// Runs `clients` copies of each load until `until`; one tally per load.
pub async fn run_all(loads: &[(Load, usize)], until: Instant) -> Vec<Tally> {
    let mut handles = Vec::new();
    for (i, (load, clients)) in loads.iter().enumerate() {
        for _ in 0..*clients {
            handles.push((i, tokio::spawn(run(load.clone(), until))));
        }
    }
    let mut tallies: Vec<Tally> = loads.iter().map(|_| Tally::default()).collect();
    for (i, handle) in handles {
        if let Ok(tally) = handle.await {
            tallies[i].merge(tally);
        }
    }
    tallies
}

/// Posts `body` on a fresh connection; the status and the answer's bytes.
pub async fn post_once(load: &Load, body: Bytes) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut sender = connect(load).await?;
    let len = body.len();
    let request = Request::post(openflux::webhook::server::MUTATE_PATH)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("content-length", len)
        .body(Body::from(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), usize::MAX)
        .await
        .map_err(|e| anyhow!("reading the answer: {e}"))?;
    Ok((status, bytes.to_vec()))
}
