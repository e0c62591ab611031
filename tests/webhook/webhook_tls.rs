//! The webhook over real TLS: an AdmissionReview answered over HTTP/1.1 and
//! HTTP/2, old protocol versions refused, and a certificate rotation seen by
//! new connections while an open keep-alive connection keeps working.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use openflux::api::{Artifact, ArtifactSpec};
use openflux::certs::{Authority, Issued, DEFAULT_CA_VALIDITY, DEFAULT_CERT_VALIDITY};
use openflux::index::{IndexedArtifact, OwnerIndex};
use openflux::webhook::{self, WebhookArgs, WebhookMetrics};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::accept_any::AcceptAny;

const REVIEW: &str = include_str!("../fixtures/admission/kustomization-create-custom.json");

fn index() -> webhook::Knowledge {
    let mut artifact = Artifact::new(
        "web-latest",
        ArtifactSpec {
            url: "http://storage/a.tar.gz".into(),
            revision: "r1".into(),
            ..Default::default()
        },
    );
    artifact.metadata.namespace = Some("apps".into());
    artifact.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "sources.openflux.dev/v1alpha1".into(),
        kind: "HttpSource".into(),
        name: "web".into(),
        uid: "u1".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let mut index = OwnerIndex::new();
    index.reset(IndexedArtifact::from_artifact(&artifact));
    let facts = openflux::cluster::facts::Facts::everywhere(
        openflux::cluster::target::Target::ExternalArtifact,
        &[("HttpSource", "sources.openflux.dev")],
    );
    webhook::Knowledge {
        index: Arc::new(RwLock::new(index)),
        facts: Arc::new(RwLock::new(facts)),
        ..Default::default()
    }
}

/// Writes the files the way the kubelet lays out a mounted Secret: the names
/// are symlinks into `..data`, itself a symlink swapped to a new directory.
fn publish(dir: &Path, ca: &Authority, issued: &Issued, generation: u32) {
    let data = dir.join(format!("..gen_{generation}"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("ca.crt"), &ca.cert_pem).unwrap();
    std::fs::write(data.join("tls.crt"), &issued.cert_pem).unwrap();
    std::fs::write(data.join("tls.key"), &issued.key_pem).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(data.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for name in ["ca.crt", "tls.crt", "tls.key"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
}

fn issue(ca: &Authority) -> Issued {
    ca.issue(
        &["localhost".to_string()],
        &["127.0.0.1".parse().unwrap()],
        DEFAULT_CERT_VALIDITY,
    )
    .unwrap()
}

fn leaf_der(issued: &Issued) -> CertificateDer<'static> {
    openflux::certs::parse_certs(issued.cert_pem.as_bytes()).unwrap()[0].clone()
}

fn client_config(
    ca: &Authority,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in openflux::certs::parse_certs(ca.cert_pem.as_bytes()).unwrap() {
        roots.add(cert).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(openflux::certs::provider())
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

async fn connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

fn peer_leaf(tls: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

fn post() -> Request<Body> {
    Request::post("/mutate")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Body::from(REVIEW))
        .unwrap()
}

async fn answer(response: hyper::Response<hyper::body::Incoming>) -> Value {
    assert_eq!(response.status(), 200);
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn assert_rewritten(answer: &Value) {
    let response = &answer["response"];
    assert_eq!(response["uid"], "3f1c9c1e-1d3a-4c55-9a57-8f1f0c1b2a01");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
}

/// Sends a TLS ClientHello offering only `version` (0x0301 TLS 1.0, 0x0302
/// TLS 1.1) and returns the first bytes the server answers with.
async fn hello_with(addr: SocketAddr, version: [u8; 2]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[0; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&[0, 4, 0x00, 0x2f, 0x00, 0x35]); // AES-CBC-SHA suites
    body.extend_from_slice(&[1, 0]); // null compression
    let mut handshake = vec![1, 0, 0, body.len() as u8];
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01, 0, handshake.len() as u8];
    record.extend_from_slice(&handshake);
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut reply = vec![0; 7];
    tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    reply
}

#[tokio::test]
async fn serves_tls_and_rotates_certificates_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::generate(DEFAULT_CA_VALIDITY).unwrap();
    let first = issue(&ca);
    publish(dir.path(), &ca, &first, 1);

    let args = WebhookArgs {
        webhook_addr: "127.0.0.1:0".parse().unwrap(),
        tls_cert_file: Some(dir.path().join("tls.crt")),
        tls_key_file: Some(dir.path().join("tls.key")),
        tls_reload_interval_seconds: 1,
        ..WebhookArgs::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = WebhookMetrics::register(&mut registry);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook::serve_on(
        listener,
        args,
        None,
        index(),
        metrics,
        async {
            let _ = stopped.await;
        },
    ));

    // HTTP/1.1 keep-alive connection, TLS 1.2 only.
    let tls12 = client_config(&ca, &[&rustls::version::TLS12], &[b"http/1.1"]);
    let kept = connect(addr, tls12).await;
    assert_eq!(
        kept.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(peer_leaf(&kept), leaf_der(&first));
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(kept))
        .await
        .unwrap();
    tokio::spawn(conn);
    assert_rewritten(&answer(h1.send_request(post()).await.unwrap()).await);

    // HTTP/2 over TLS 1.3, chosen by ALPN.
    let tls13 = client_config(&ca, &[&rustls::version::TLS13], &[b"h2"]);
    let stream = connect(addr, tls13.clone()).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    assert_rewritten(&answer(h2.send_request(post()).await.unwrap()).await);

    // TLS 1.0 and 1.1 are refused with an alert.
    for version in [[3, 1], [3, 2]] {
        let reply = hello_with(addr, version).await;
        assert_eq!(
            reply[0], 0x15,
            "an alert record, not a ServerHello: {reply:?}"
        );
        assert_eq!(reply[5], 2, "fatal: {reply:?}");
        assert!(
            [40, 70].contains(&reply[6]),
            "handshake_failure or protocol_version: {reply:?}"
        );
    }

    // Rotate: new connections get the new certificate.
    let second = issue(&ca);
    publish(dir.path(), &ca, &second, 2);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let fresh = connect(addr, tls13.clone()).await;
        if peer_leaf(&fresh) == leaf_der(&second) {
            break;
        }
        assert!(Instant::now() < deadline, "rotation not picked up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The connection opened before the rotation still answers.
    assert_rewritten(&answer(h1.send_request(post()).await.unwrap()).await);
    assert_rewritten(&answer(h2.send_request(post()).await.unwrap()).await);

    // A bad rotation (key of another certificate) is refused; serving goes on.
    let third = issue(&ca);
    let broken = Issued {
        cert_pem: third.cert_pem.clone(),
        key_pem: first.key_pem.clone(),
    };
    publish(dir.path(), &ca, &broken, 3);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let fresh = connect(addr, tls13.clone()).await;
    assert_eq!(peer_leaf(&fresh), leaf_der(&second));

    let mut metrics_text = String::new();
    prometheus_client::encoding::text::encode(&mut metrics_text, &registry).unwrap();
    assert!(
        metrics_text.contains(
            r#"openflux_admission_requests_total{consumer="kustomizations",outcome="rewritten"} 4"#
        ),
        "{metrics_text}"
    );

    // Shutdown ends serve() even with connections open.
    drop(h1);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("serve() returns after shutdown")
        .unwrap()
        .unwrap();
}

/// At shutdown a kept-alive connection is not closed under its client's
/// next request (an API server whose endpoints lag still sends one): for
/// [`SHUTDOWN_DRAIN`] every request, on kept and on new connections, is
/// answered with `Connection: close`, and serve() returns after.
#[tokio::test]
async fn shutdown_answers_kept_connections_and_asks_them_to_close() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::generate(DEFAULT_CA_VALIDITY).unwrap();
    publish(dir.path(), &ca, &issue(&ca), 1);
    let args = WebhookArgs {
        webhook_addr: "127.0.0.1:0".parse().unwrap(),
        tls_cert_file: Some(dir.path().join("tls.crt")),
        tls_key_file: Some(dir.path().join("tls.key")),
        tls_reload_interval_seconds: 1,
        ..WebhookArgs::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = WebhookMetrics::register(&mut registry);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook::serve_on(
        listener,
        args,
        None,
        index(),
        metrics,
        async {
            let _ = stopped.await;
        },
    ));
    let http1 = client_config(&ca, &[&rustls::version::TLS13], &[b"http/1.1"]);
    let open = |config: Arc<rustls::ClientConfig>| async move {
        let (sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(connect(addr, config).await))
                .await
                .unwrap();
        let conn = tokio::spawn(conn);
        (sender, conn)
    };
    let (mut kept, kept_conn) = open(http1.clone()).await;
    let first = kept.send_request(post()).await.unwrap();
    assert!(first.headers().get("connection").is_none());
    assert_rewritten(&answer(first).await);

    let stopped_at = Instant::now();
    stop.send(()).unwrap();
    // Shutdown has begun once a new connection is told to close.
    loop {
        assert!(
            stopped_at.elapsed() < openflux::webhook::server::SHUTDOWN_DRAIN,
            "no connection was answered with Connection: close after shutdown began"
        );
        let Ok(Ok(tcp)) = tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        else {
            panic!("the webhook stopped accepting at once instead of draining");
        };
        drop(tcp);
        let (mut fresh, _) = open(http1.clone()).await;
        let response = fresh.send_request(post()).await.unwrap();
        let closing = response
            .headers()
            .get("connection")
            .is_some_and(|v| v == "close");
        assert_rewritten(&answer(response).await);
        if closing {
            break;
        }
    }
    // The connection kept from before is answered too, and told to close.
    kept.ready()
        .await
        .expect("the kept connection is still open");
    let response = kept
        .send_request(post())
        .await
        .expect("an answer on the kept connection");
    assert_eq!(
        response
            .headers()
            .get("connection")
            .map(|v| v.to_str().unwrap()),
        Some("close")
    );
    assert_rewritten(&answer(response).await);
    tokio::time::timeout(Duration::from_secs(5), kept_conn)
        .await
        .expect("the kept connection closes after its last answer")
        .unwrap()
        .unwrap();
    tokio::time::timeout(
        openflux::webhook::server::SHUTDOWN_DRAIN + openflux::webhook::server::SHUTDOWN_GRACE,
        server,
    )
    .await
    .expect("serve() returns after the drain")
    .unwrap()
    .unwrap();
}

#[tokio::test]
async fn in_memory_certificate_is_made_for_the_given_names() {
    let args = WebhookArgs {
        webhook_addr: "127.0.0.1:0".parse().unwrap(),
        webhook_dns_names: vec!["localhost".into()],
        webhook_ips: vec!["127.0.0.1".parse().unwrap()],
        webhook_configuration: vec!["openflux".into()],
        ..WebhookArgs::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook::serve_on(
        listener,
        args,
        None,
        index(),
        WebhookMetrics::default(),
        async {
            let _ = stopped.await;
        },
    ));
    // No CA to trust here: accept what is served and check its names.
    let tcp = TcpStream::connect(addr).await.unwrap();
    let config = rustls::ClientConfig::builder_with_provider(openflux::certs::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let leaf = peer_leaf(&tls);
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    let text = format!("{:?}", san.general_names);
    assert!(text.contains("localhost"), "{text}");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
