//! Serving a router over mutual TLS: the accept loop of an artifact
//! server whose TLS configuration requires and authorizes client
//! certificates (see [`super::tls`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::tls::MtlsMetrics;
use crate::runtime::health::ServeError;

/// A handshake that takes longer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Headers that take longer to arrive end the connection.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 512;

/// Binds `addr` and serves `router` over TLS with `config` in the
/// background. Binding happens before this returns (a taken port is an
/// error at start); the address bound is returned.
pub async fn serve_tls(
    name: &str,
    addr: SocketAddr,
    router: Router,
    config: rustls::ServerConfig,
    metrics: MtlsMetrics,
) -> Result<SocketAddr, ServeError> {
    let failed = |source| ServeError {
        name: name.to_string(),
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(failed)?;
    let bound = listener.local_addr().map_err(failed)?;
    tracing::info!(addr = %bound, "{name} server listening (SPIFFE mTLS)");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let name = name.to_string();
    tokio::spawn(accept_loop(name, listener, acceptor, router, metrics));
    Ok(bound)
}

async fn accept_loop(
    name: String,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    router: Router,
    metrics: MtlsMetrics,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((tcp, peer)) => {
                let serve =
                    connection(acceptor.clone(), tcp, peer, router.clone(), metrics.clone());
                tokio::spawn(async move {
                    serve.await;
                    drop(slot);
                });
            }
            Err(error) => {
                // For example too many open files: back off instead of spinning.
                tracing::warn!(%error, "cannot accept a {name} connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    metrics: MtlsMetrics,
) {
    let _ = tcp.set_nodelay(true);
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            metrics.handshake_failed();
            tracing::info!(%peer, %error, "mTLS handshake failed");
            return;
        }
        Err(_) => {
            metrics.handshake_failed();
            tracing::info!(%peer, "mTLS handshake timed out");
            return;
        }
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(64);
    let service = TowerToHyperService::new(router);
    if let Err(error) = builder.serve_connection(TokioIo::new(tls), service).await {
        tracing::debug!(%peer, %error, "artifact connection ended with an error");
    }
}
