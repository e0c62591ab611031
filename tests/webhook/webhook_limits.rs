//! The webhook's bounds over real TLS, and the chaos short pass: generated
//! AdmissionReviews through the decision path in process and a sample of
//! them through the HTTPS server. `make chaos` runs the long pass.

#[path = "../chaos/reviews.rs"]
mod reviews;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::Request;
use hyper_util::rt::TokioIo;
use openflux::index::OwnerIndex;
use openflux::webhook::server::{answer, MAX_BODY_BYTES};
use openflux::webhook::{self, Options, WebhookArgs, WebhookMetrics};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::accept_any::AcceptAny;

use reviews::Rng;

fn synced_index() -> OwnerIndex {
    let mut index = OwnerIndex::new();
    index.reset([]);
    index
}

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start() -> Server {
    let args = WebhookArgs {
        webhook_addr: "127.0.0.1:0".parse().unwrap(),
        webhook_dns_names: vec!["localhost".into()],
        webhook_ips: vec!["127.0.0.1".parse().unwrap()],
        ..WebhookArgs::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(webhook::serve_on(
        listener,
        args,
        None,
        webhook::Knowledge {
            index: Arc::new(RwLock::new(synced_index())),
            facts: Arc::new(RwLock::new(all_external_artifact())),
            ..Default::default()
        },
        WebhookMetrics::default(),
        async {
            let _ = stopped.await;
        },
    ));
    Server {
        addr,
        stop: Some(stop),
        task,
    }
}

impl Server {
    /// Stops the server; returns how long it took to return.
    async fn stop(mut self) -> Duration {
        let started = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("serve_on returns after shutdown")
            .unwrap()
            .unwrap();
        started.elapsed()
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Body>;

async fn client(addr: SocketAddr) -> Sender {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let config = rustls::ClientConfig::builder_with_provider(openflux::certs::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
    let tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn post(sender: &mut Sender, body: Body, length: Option<usize>) -> (u16, Vec<u8>) {
    let mut request = Request::post(openflux::webhook::server::MUTATE_PATH)
        .header("host", "localhost")
        .header("content-type", "application/json");
    if let Some(length) = length {
        request = request.header("content-length", length);
    }
    let response = sender
        .send_request(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(Body::new(response.into_body()), usize::MAX)
        .await
        .unwrap();
    (status, body.to_vec())
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_handshake_does_not_hold_shutdown() {
    let server = start().await;
    // Connected, nothing sent: a probe, a scanner, a client that stalled.
    let _idle = TcpStream::connect(server.addr).await.unwrap();
    let mut sender = client(server.addr).await;
    let (status, _) = post(&mut sender, Body::from("{"), None).await;
    assert_eq!(status, 400);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let took = server.stop().await;
    // The drain, then nothing to wait for.
    let bound = openflux::webhook::server::SHUTDOWN_DRAIN + Duration::from_secs(2);
    assert!(took < bound, "shutdown took {took:?}");
}

/// A TLS connection to `addr` that finished its handshake and sends
/// nothing.
async fn idle_tls(addr: SocketAddr) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    tokio::time::timeout(Duration::from_secs(5), async {
        let tcp = TcpStream::connect(addr).await.ok()?;
        tls_over(tcp).await
    })
    .await
    .ok()?
}

async fn tls_over(tcp: TcpStream) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = rustls::ClientConfig::builder_with_provider(openflux::certs::provider())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").ok()?, tcp)
        .await
        .ok()
}

/// Connections that finish their handshake and never send a request hold
/// no place the API server's need: with 2,000 of them open, a new client
/// is answered within the API server's timeout for a webhook (5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_keep_requests_out() {
    use futures::StreamExt;
    let server = start().await;
    let idle: Vec<_> = futures::stream::iter(0..2000)
        .map(|_| idle_tls(server.addr))
        .buffer_unordered(32)
        .collect()
        .await;
    let held = idle.iter().filter(|c| c.is_some()).count();
    assert!(
        held >= 1900,
        "only {held} of 2,000 idle connections finished their handshake"
    );
    let bound = Duration::from_secs(5);
    let started = Instant::now();
    let fresh = async {
        let mut sender = client(server.addr).await;
        post(&mut sender, Body::from("{"), None).await.0
    };
    let answer = tokio::time::timeout(bound, fresh).await;
    assert_eq!(
        answer.ok(),
        Some(400),
        "a new client, after {:?}",
        started.elapsed()
    );
    drop(idle);
    server.stop().await;
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_before_they_are_read() {
    let server = start().await;
    let mut sender = client(server.addr).await;
    // Declared too large: refused from the header.
    let (status, _) = post(&mut sender, Body::from("{}"), Some(MAX_BODY_BYTES + 1)).await;
    assert_eq!(status, 413);
    // Streamed without a length: refused once past the limit, while the
    // client would go on sending (64 MiB in all).
    let mut sender = client(server.addr).await;
    let chunks = futures::stream::iter(
        (0..1024).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; 64 * 1024]))),
    );
    let (status, _) = post(&mut sender, Body::from_stream(chunks), None).await;
    assert_eq!(status, 413);
    server.stop().await;
}

#[tokio::test]
async fn generated_reviews_over_https_are_each_answered() {
    let server = start().await;
    let mut rng = Rng(0x5eed_0001);
    let mut sender = client(server.addr).await;
    let mut seen = std::collections::BTreeMap::new();
    for i in 0..400 {
        let body = reviews::body(&mut rng, 256 * 1024);
        let len = body.len();
        let (status, answer) = post(&mut sender, Body::from(body.clone()), Some(len)).await;
        let kind =
            reviews::check(&body, status, &answer).unwrap_or_else(|e| panic!("request {i}: {e}"));
        *seen.entry(kind).or_insert(0) += 1;
        if status == 400 {
            // The server may close after an error: take a fresh connection.
            sender = client(server.addr).await;
        }
    }
    assert!(
        seen.len() == 3,
        "allowed, denied and 400 all seen: {seen:?}"
    );
    server.stop().await;
}

#[test]
fn chaos_short_pass_through_the_decision_path() {
    let index = synced_index();
    let facts = all_external_artifact();
    let view = openflux::rewrite::View {
        index: &index,
        facts: &facts,
        policies: &openflux::policy::NONE,
    };
    let options = Options::default();
    let mut rng = Rng(0x5eed_0002);
    let count = std::env::var("OPENFLUX_CHAOS_REVIEWS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3_000);
    let mut seen = std::collections::BTreeMap::new();
    for i in 0..count {
        let body = reviews::body(&mut rng, 256 * 1024);
        let answered =
            std::panic::catch_unwind(|| answer(&body, view, &options)).unwrap_or_else(|_| {
                panic!(
                    "review {i} panicked: {}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                )
            });
        let bytes = match &answered.review {
            Ok(review) => review.clone(),
            Err(message) => message.clone().into_bytes(),
        };
        let kind = reviews::check(&body, answered.status.as_u16(), &bytes).unwrap_or_else(|e| {
            panic!(
                "review {i}: {e}\n{}",
                String::from_utf8_lossy(&body[..body.len().min(600)])
            )
        });
        *seen.entry(kind).or_insert(0u64) += 1;
    }
    assert_eq!(seen.len(), 3, "allowed, denied and 400 all seen: {seen:?}");
}

/// Export targets that send every consumer to ExternalArtifact.
fn all_external_artifact() -> openflux::cluster::facts::Facts {
    openflux::cluster::facts::Facts::everywhere(
        openflux::cluster::target::Target::ExternalArtifact,
        &[],
    )
}

/// The oracle refuses answers that do not answer the request: another uid,
/// or a patch that does not apply to the object sent.
#[test]
fn the_oracle_refuses_answers_to_another_request_and_patches_that_do_not_apply() {
    use base64::Engine as _;
    let request = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE",
                    "object": {"metadata": {"name": "a"}, "spec": {"sourceRef": {"kind": "X"}}}}
    }))
    .unwrap();
    let answer = |uid: &str, patch: Option<serde_json::Value>| {
        let mut response = serde_json::json!({"uid": uid, "allowed": true});
        if let Some(patch) = patch {
            let text = serde_json::to_vec(&patch).unwrap();
            response["patchType"] = serde_json::json!("JSONPatch");
            response["patch"] =
                serde_json::json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response
        }))
        .unwrap()
    };
    let fits = serde_json::json!([{"op": "replace", "path": "/spec/sourceRef/kind", "value": "Y"}]);
    let misses =
        serde_json::json!([{"op": "replace", "path": "/spec/chartRef/kind", "value": "Y"}]);
    assert_eq!(
        reviews::check(&request, 200, &answer("u-1", None)),
        Ok("allowed")
    );
    assert_eq!(
        reviews::check(&request, 200, &answer("u-1", Some(fits))),
        Ok("allowed")
    );
    assert!(
        reviews::check(&request, 200, &answer("someone-else", None)).is_err(),
        "an answer with another request's uid was accepted"
    );
    assert!(
        reviews::check(&request, 200, &answer("u-1", Some(misses))).is_err(),
        "a patch that does not apply was accepted"
    );
    assert_eq!(reviews::check(&request, 400, b"bad"), Ok("400"));
}
