//! Load for the fault tests, counted from the client side: admissions
//! through the API server (what a user's `kubectl apply` meets) and
//! maximum-size AdmissionReviews posted straight to openflux's Pods.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use hyper::Request;
use hyper_util::rt::TokioIo;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::admission::AdmissionReview;
use openflux::webhook::server::{MAX_BODY_BYTES, MUTATE_PATH};
use openflux_testkit as support;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use support::Env;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

use super::{HTTP_SOURCE, KUSTOMIZE};

/// The name the webhook's serving certificate is made for.
pub const WEBHOOK_HOST: &str = "openflux-webhook.openflux-system.svc";

/// What one kind of load saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub answered: usize,
    /// When (after the load started) and why each failure happened.
    pub failures: Vec<(Duration, String)>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.answered += other.answered;
        self.failures.extend(other.failures);
        self.failures.sort_by_key(|(at, _)| *at);
    }

    /// The first few failures, for an assertion message.
    pub fn first_failures(&self) -> Vec<&(Duration, String)> {
        self.failures.iter().take(5).collect()
    }

    /// Fails the test, naming the first failures, when any admission failed
    /// `during` (a phrase: "the upgrade").
    pub fn assert_none_failed(&self, during: &str) {
        assert!(
            self.failures.is_empty(),
            "{} of {} admissions failed during {during}: {:?}",
            self.failures.len(),
            self.answered + self.failures.len(),
            self.first_failures()
        );
    }
}

/// Admissions of a Kustomization that references a custom source, each a
/// server-side dry run through the API server, so openflux's webhook is
/// called exactly as for a real `kubectl apply`. `clients` loops, each one
/// admission per `every`, until [`Admissions::stop`].
pub struct Admissions {
    running: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    clients: Vec<JoinHandle<Tally>>,
}

impl Admissions {
    /// Admissions of a Kustomization naming the HttpSource `web`.
    pub async fn start(env: &Env, ns: &str, clients: usize, every: Duration) -> Admissions {
        let reference = json!({"apiVersion": HTTP_SOURCE, "kind": "HttpSource", "name": "web"});
        Admissions::naming(env, ns, reference, clients, every).await
    }

    /// Admissions of a Kustomization whose sourceRef is `reference`, a
    /// custom source.
    pub async fn naming(
        env: &Env,
        ns: &str,
        reference: serde_json::Value,
        clients: usize,
        every: Duration,
    ) -> Admissions {
        let (api, _) = support::dynamic_api(&env.client, KUSTOMIZE, "Kustomization", Some(ns))
            .await
            .expect("the Kustomization API");
        let running = Arc::new(AtomicBool::new(true));
        let answered = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let shared = Shared {
            api,
            ns: ns.to_string(),
            reference,
            every,
            running: running.clone(),
            answered: answered.clone(),
            started,
        };
        let clients = (0..clients)
            .map(|client| tokio::spawn(admit_until_stopped(shared.clone(), client)))
            .collect();
        Admissions {
            running,
            answered,
            clients,
        }
    }

    /// Admissions answered so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Stops the clients and adds up what they saw.
    pub async fn stop(self) -> Tally {
        self.running.store(false, Ordering::SeqCst);
        let mut tally = Tally::default();
        for client in self.clients {
            tally.merge(client.await.expect("an admission client"));
        }
        tally
    }
}

/// What every admission client shares.
#[derive(Clone)]
struct Shared {
    api: Api<DynamicObject>,
    ns: String,
    reference: serde_json::Value,
    every: Duration,
    running: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    started: Instant,
}

async fn admit_until_stopped(shared: Shared, client: usize) -> Tally {
    let Shared {
        api,
        ns,
        reference,
        every,
        running,
        answered,
        started,
    } = shared;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut tally = Tally::default();
    let mut pace = tokio::time::interval(every);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0.. {
        pace.tick().await;
        if !running.load(Ordering::SeqCst) {
            break;
        }
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": KUSTOMIZE, "kind": "Kustomization",
            "metadata": {"name": format!("load-{client}-{i}"), "namespace": ns},
            "spec": {"interval": "1m", "path": "./", "prune": true, "sourceRef": reference}
        }))
        .expect("a Kustomization");
        let at = started.elapsed();
        match api.create(&dry_run, &obj).await {
            Ok(created) => {
                // Admitted by openflux, not let through: the reference is
                // rewritten to the export.
                let kind = created
                    .data
                    .pointer("/spec/sourceRef/kind")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default();
                if Some(kind) == reference["kind"].as_str() {
                    tally
                        .failures
                        .push((at, "admitted without openflux's rewrite".into()));
                } else {
                    tally.answered += 1;
                    answered.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e) => tally.failures.push((at, e.to_string())),
        }
    }
    tally
}

/// The CA the API server trusts for openflux's webhook: the caBundle of
/// its MutatingWebhookConfiguration, whoever made the certificate.
pub fn webhook_ca(env: &Env) -> Vec<u8> {
    let out = env.run_kubectl(
        &[
            "get",
            "mutatingwebhookconfiguration",
            "openflux",
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "reading openflux's caBundle: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(out.stdout.trim_ascii())
        .expect("the caBundle is base64")
}

/// A client TLS configuration trusting `ca_pem` only.
pub fn tls_trusting(ca_pem: &[u8]) -> Arc<rustls::ClientConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = pem::parse_many(ca_pem)
        .expect("PEM in the caBundle")
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| CertificateDer::from(p.into_contents()))
        .collect();
    assert!(!certs.is_empty(), "the caBundle holds no certificate");
    for cert in certs {
        roots.add(cert).expect("a CA certificate");
    }
    Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// The largest AdmissionReview openflux takes: a HelmRelease with a
/// custom chart reference and values filling the rest of the body.
pub fn max_size_review() -> Bytes {
    let item = json!({"key": "value", "n": 1});
    let per = serde_json::to_vec(&item).expect("JSON").len() + 1;
    let items = vec![item; (MAX_BODY_BYTES - 4096) / per];
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "max", "operation": "CREATE", "namespace": "apps",
            "kind": {"group": "helm.toolkit.fluxcd.io", "version": "v2", "kind": "HelmRelease"},
            "resource": {"group": "helm.toolkit.fluxcd.io", "version": "v2", "resource": "helmreleases"},
            "userInfo": {"username": "flood"},
            "object": {
                "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
                "metadata": {"name": "big", "namespace": "apps"},
                "spec": {"chartRef": {"kind": "HttpSource", "apiVersion": HTTP_SOURCE, "name": "web"},
                         "values": {"items": items}}
            }
        }
    });
    let body = serde_json::to_vec(&review).expect("JSON");
    assert!(body.len() <= MAX_BODY_BYTES, "{} bytes", body.len());
    // What the test sends is a review openflux parses, not noise.
    let _: AdmissionReview<DynamicObject> =
        serde_json::from_slice(&body).expect("an AdmissionReview");
    Bytes::from(body)
}

/// What the flood's clients saw: answers by status, and requests that got
/// no answer at all.
#[derive(Debug, Default)]
pub struct Flood {
    pub ok: usize,
    /// 429: openflux shedding what it cannot take now (the API server
    /// retries those).
    pub shed: usize,
    pub other: Vec<String>,
}

/// `clients` clients per address post `body` to openflux's webhook port,
/// each waiting for its answer before the next, until `until`.
pub async fn flood(
    addrs: &[std::net::SocketAddr],
    tls: Arc<rustls::ClientConfig>,
    body: Bytes,
    clients: usize,
    until: Instant,
) -> Flood {
    let mut handles = Vec::new();
    for addr in addrs {
        for _ in 0..clients {
            handles.push(tokio::spawn(flood_one(
                *addr,
                tls.clone(),
                body.clone(),
                until,
            )));
        }
    }
    let mut all = Flood::default();
    for handle in handles {
        let one = handle.await.expect("a flood client");
        all.ok += one.ok;
        all.shed += one.shed;
        all.other.extend(one.other);
    }
    all
}

async fn flood_one(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    body: Bytes,
    until: Instant,
) -> Flood {
    let mut seen = Flood::default();
    while Instant::now() < until {
        match post(addr, &tls, body.clone()).await {
            Ok(200) => seen.ok += 1,
            Ok(429) => {
                seen.shed += 1;
                // `Retry-After: 1`, as the API server honours it.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(status) => seen.other.push(format!("{addr}: HTTP {status}")),
            Err(e) => seen.other.push(format!("{addr}: {e:#}")),
        }
    }
    seen
}

async fn post(
    addr: std::net::SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    body: Bytes,
) -> anyhow::Result<u16> {
    let tcp = TcpStream::connect(addr).await?;
    let stream = TlsConnector::from(tls.clone())
        .connect(ServerName::try_from(WEBHOOK_HOST)?.to_owned(), tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = Request::post(MUTATE_PATH)
        .header("host", WEBHOOK_HOST)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(Body::from(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    axum::body::to_bytes(Body::new(response.into_body()), usize::MAX)
        .await
        .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?;
    Ok(status)
}
