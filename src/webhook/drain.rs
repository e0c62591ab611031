//! The webhook server's edges: accepting a connection when there is room,
//! and the shutdown drain (answers that ask HTTP/1.1 clients to close).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::Response;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// After the shutdown signal, how long the webhook keeps accepting and
/// answering, each answer asking its client to close the connection
/// (`Connection: close`), before it closes the connections left idle. An
/// API server whose endpoints have not caught up yet still sends here;
/// closing an idle kept-alive connection at once races its next request,
/// which then fails as a broken pipe instead of being answered.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(3);

/// While draining, every answer asks its HTTP/1.1 client to close the
/// connection after reading it, so no client reuses a connection this
/// webhook is about to close. (HTTP/2 clients are told by the GOAWAY of
/// the graceful shutdown, which they retry on.)
pub async fn close_when_draining(
    State(draining): State<Arc<AtomicBool>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let http1 = request.version() <= axum::http::Version::HTTP_11;
    let mut response = next.run(request).await;
    if http1 && draining.load(Ordering::SeqCst) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Accepts a connection once there is room for one more.
pub async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> (
    Option<tokio::sync::OwnedSemaphorePermit>,
    std::io::Result<(TcpStream, SocketAddr)>,
) {
    let slot = slots.clone().acquire_owned().await.ok();
    (slot, listener.accept().await)
}
