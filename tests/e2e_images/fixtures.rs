//! What the image tests run against: the cluster's kubeconfig, a webhook
//! configuration of their own, an HTTPS server with a test CA.

use std::net::SocketAddr;

use openflux::certs::Authority;
use openflux_testkit::webhook::{local_webhook, Webhook};
use openflux_testkit::Env;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use crate::https::HttpsServer;

/// The kubeconfig of the test cluster (self-contained: certificates inline).
pub fn kubeconfig(env: &Env) -> Vec<u8> {
    let path = env
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(Into::into))
        .expect("a kubeconfig");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The kubeconfig openflux runs with: its own identity on the local
/// control plane (see `openflux_testkit::identity`).
pub fn openflux_kubeconfig(env: &Env) -> Vec<u8> {
    match openflux_testkit::identity::openflux_kubeconfig(env) {
        Some(path) => std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        None => kubeconfig(env),
    }
}

/// The shipped local webhook configuration, pointed at `addr` and limited
/// to namespace `ns`.
pub async fn webhook_configuration(env: &Env, ns: &str, addr: SocketAddr) -> Webhook {
    local_webhook(env, "openflux-image", ns, addr).await
}

/// Serves `body` at every path over HTTPS on 127.0.0.1 with a certificate
/// of `ca`; stops when dropped.
pub async fn serve_body(ca: &Authority, body: Vec<u8>) -> HttpsServer {
    let router = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move { body }
    });
    HttpsServer::serve(ca, router).await
}

/// The body of a plain HTTP GET of `url` (`http://host:port/path`).
pub async fn download(url: &str) -> Vec<u8> {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .expect("connecting");
    let request = format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("response");
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response");
    let head = String::from_utf8_lossy(&response[..end]);
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    response[end + 4..].to_vec()
}
