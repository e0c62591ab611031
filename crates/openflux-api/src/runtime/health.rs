//! The health endpoints (`--health-addr`) and serving the kit's routers.
//!
//! `/healthz` answers while the process runs; `/readyz` once the controller
//! said it is ready (for a controller: its watch has synced), as the probes
//! of Flux's Deployments expect.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// Readiness, shared by whoever can tell and the endpoint.
#[derive(Clone)]
pub struct Health {
    ready: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            ready: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

impl Health {
    pub fn set_ready(&self) {
        self.ready.send_replace(true);
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Resolves once ready.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives as long as self: this cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// `/healthz` (alive) and `/readyz` (ready).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(self.clone())
    }
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    if health.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// A server that could not start.
#[derive(Debug, thiserror::Error)]
#[error("binding the {name} server to {addr}: {source}")]
pub struct ServeError {
    pub name: String,
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` and serves `router` in the background. Binding happens
/// before this returns, so a taken port is an error at start; the address
/// actually bound is returned (port 0 picks a free one).
pub async fn serve(name: &str, addr: SocketAddr, router: Router) -> Result<SocketAddr, ServeError> {
    let failed = |source| ServeError {
        name: name.to_string(),
        addr,
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(failed)?;
    let bound = listener.local_addr().map_err(failed)?;
    tracing::info!(addr = %bound, "{name} server listening");
    let name = name.to_string();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "{name} server stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get_status(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response.lines().next().unwrap_or_default().to_string()
    }

    #[tokio::test]
    async fn readiness_turns_true_once_set() {
        let health = Health::default();
        let addr = serve("health", "127.0.0.1:0".parse().unwrap(), health.router())
            .await
            .unwrap();
        assert!(get_status(addr, "/healthz").await.contains("200"));
        assert!(get_status(addr, "/readyz").await.contains("503"));
        let waiter = tokio::spawn({
            let health = health.clone();
            async move { health.wait_ready().await }
        });
        health.set_ready();
        waiter.await.unwrap();
        assert!(get_status(addr, "/readyz").await.contains("200"));
    }

    #[tokio::test]
    async fn a_taken_port_is_an_error() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve("metrics", addr, Router::new()).await.unwrap_err();
        assert!(err.to_string().contains("metrics server"), "{err}");
    }
}
