//! What the image tests run against: the cluster's kubeconfig, a webhook
//! configuration of their own, an HTTPS server with a test CA.

use std::net::SocketAddr;
use std::sync::Arc;

use openflux::certs::{self, Authority, DEFAULT_CERT_VALIDITY};
use openflux_testkit::webhook::{local_webhook, Webhook};
use openflux_testkit::Env;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
pub struct HttpsServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl HttpsServer {
    pub async fn start(ca: &Authority, body: Vec<u8>) -> HttpsServer {
        let issued = ca
            .issue(
                &["localhost".into()],
                &["127.0.0.1".parse().unwrap()],
                DEFAULT_CERT_VALIDITY,
            )
            .expect("a serving certificate");
        let material = certs::material_from_pem(
            issued.cert_pem.as_bytes(),
            issued.key_pem.as_bytes(),
            Some(ca.cert_pem.as_bytes()),
        )
        .expect("TLS material");
        let resolver = Arc::new(certs::SwappableCert::new(material.certified));
        let tls = Arc::new(certs::server_config(resolver).expect("TLS config"));
        let router = axum::Router::new().fallback(move || {
            let body = body.clone();
            async move { body }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the HTTPS server");
        let addr = listener.local_addr().expect("address");
        let task = tokio::spawn(openflux::webhook::server::serve_tls(
            listener,
            tls,
            router,
            std::future::pending(),
        ));
        HttpsServer { addr, task }
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
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
