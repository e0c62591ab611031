//! `spec.certSecretRef`: a private CA and a client certificate, read from
//! a Secret as Flux's sources read them.

use super::*;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A test CA.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
    der: CertificateDer<'static>,
}

impl Ca {
    fn new() -> Self {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca {
            pem: cert.pem(),
            der: cert.der().clone(),
            params,
            key,
        }
    }

    /// A certificate for `usage`, with 127.0.0.1 as its address: PEM of
    /// the certificate and of its key.
    fn issue(&self, usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
        params.extended_key_usages = vec![usage];
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// An HTTPS server on 127.0.0.1 answering every request with `body`;
/// with `client_auth`, it requires a client certificate issued by `ca`.
struct TlsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    async fn start(ca: &Ca, client_auth: bool, body: Vec<u8>) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (cert_pem, key_pem) = ca.issue(ExtendedKeyUsagePurpose::ServerAuth);
        let cert =
            CertificateDer::from_pem_slice(cert_pem.as_bytes()).expect("server certificate DER");
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("server key DER");
        let builder = rustls::ServerConfig::builder();
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.der.clone()).expect("the CA as a root");
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder
            .with_single_cert(vec![cert], key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the HTTPS server");
        let addr = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(response.as_bytes()).await;
                    let _ = tls.write_all(&body).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        TlsServer { addr, task }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/app.tgz", self.addr.port())
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server whose certificate a private CA issued is trusted with the CA
/// of `certSecretRef` (beside the system's roots), and a server that
/// requires a client certificate gets the Secret's `tls.crt`/`tls.key`
/// (a `kubernetes.io/tls` Secret, as Flux accepts it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusts_the_ca_and_presents_the_client_certificate_of_its_secret() {
    let w = world("hs-tls").await;
    let ns = w.ns().to_string();
    let ca = Ca::new();
    let body = tgz(&[("app.yaml", CONFIG_ONE)], 0, 0);
    let server = TlsServer::start(&ca, false, body.clone()).await;
    let mtls = TlsServer::start(&ca, true, body).await;
    let (client_cert, client_key) = ca.issue(ExtendedKeyUsagePurpose::ClientAuth);
    w.env
        .apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "ca", "namespace": ns},
            "stringData": {"ca.crt": ca.pem},
        }))
        .await
        .expect("the CA Secret");
    w.env
        .apply(&json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "client", "namespace": ns},
            "stringData": {"ca.crt": ca.pem, "tls.crt": client_cert, "tls.key": client_key},
        }))
        .await
        .expect("the client certificate Secret");

    for (name, url, secret) in [
        ("untrusted", server.url(), None),
        ("trusted", server.url(), Some("ca")),
        ("no-client-cert", mtls.url(), Some("ca")),
        ("mutual", mtls.url(), Some("client")),
        ("missing-secret", server.url(), Some("nope")),
    ] {
        let mut spec = json!({"url": url, "interval": "1m", "timeout": "10s"});
        if let Some(secret) = secret {
            spec["certSecretRef"] = json!({"name": secret});
        }
        w.apply_source(name, spec).await;
    }

    let (_, message) = w.wait_not_ready("untrusted", "FetchFailed").await;
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    let hs = w.wait_ready("trusted", None).await;
    let bytes = w
        .controller
        .download(&text(&hs, "/status/artifact/url"))
        .await;
    assert_eq!(
        untgz(&bytes),
        [("app.yaml".to_string(), CONFIG_ONE.to_string())]
    );
    w.wait_not_ready("no-client-cert", "FetchFailed").await;
    w.wait_ready("mutual", None).await;
    let (_, message) = w
        .wait_not_ready("missing-secret", "AuthenticationFailed")
        .await;
    assert!(
        message.contains("certSecretRef: secret 'nope' not found"),
        "{message}"
    );
}
