//! An HTTPS server on 127.0.0.1 for the e2e tests: a router served by
//! openflux's own TLS server, with a certificate for `localhost` and
//! 127.0.0.1 issued by a test CA; it stops when dropped.

use std::net::SocketAddr;
use std::sync::Arc;

use openflux::certs::{self, Authority, DEFAULT_CERT_VALIDITY};

pub struct HttpsServer {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl HttpsServer {
    pub async fn serve(ca: &Authority, router: axum::Router) -> HttpsServer {
        let issued = ca
            .issue(
                &["localhost".into()],
                &["127.0.0.1".parse().expect("an address")],
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
