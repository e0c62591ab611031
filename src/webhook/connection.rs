//! One webhook connection, from its TLS handshake to its close: the
//! handshake and header deadlines, HTTP/1.1 and HTTP/2 served by hyper, and
//! the close of a connection idle too long, of one whose place goes to a
//! newer connection ([`super::drain::Waiting`]) and of every one at
//! shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::drain::{Activity, FirstRequest};

/// Time a client gets to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client gets to send the headers of a request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a connection may sit with no request in flight (from its accept,
/// or from its last request) before it is closed: longer than the API server keeps an idle connection (Go's 90 s),
/// so it closes its own first and never sends on one closing here.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Serves one accepted connection until its client closes it, it idles
/// past [`IDLE_TIMEOUT`], its place goes to a newer connection or `stop`
/// says the server is shutting down (requests in flight then finish).
pub async fn serve(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    app: Router,
    mut stop: watch::Receiver<()>,
    first: FirstRequest,
) {
    let _ = tcp.set_nodelay(true);
    // A handshake under way at shutdown has no request in flight: drop it.
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
    let tls = tokio::select! {
        done = handshake => match done {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        _ = stop.changed() => return,
        () = first.evicted() => return,
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let activity = Activity::new(first, peer.ip().to_canonical());
    let service = TowerToHyperService::new(activity.track(app));
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let mut idle_check = tokio::time::interval(IDLE_TIMEOUT / 4);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "webhook connection ended with an error");
                }
                return;
            }
            _ = stop.changed() => break,
            // The place goes to a newer connection: one that never asked
            // is dropped, one that asked is closed gracefully (HTTP/2
            // clients are told by a GOAWAY and retry elsewhere).
            () = activity.evicted() => {
                if !activity.asked() {
                    tracing::debug!(%peer, "connection without a request closed for a newer one");
                    return;
                }
                tracing::debug!(%peer, "idle connection closed for a newer one");
                break;
            }
            _ = idle_check.tick() => {
                if activity.idle_for() > IDLE_TIMEOUT {
                    tracing::debug!(%peer, "closing an idle connection");
                    break;
                }
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    if let Err(error) = conn.await {
        tracing::debug!(%peer, %error, "webhook connection ended with an error");
    }
}
