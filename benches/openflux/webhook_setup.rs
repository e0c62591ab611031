//! What the webhook benchmark measures with: the owner index and the
//! requests, the servers' routers (openflux's, the constant answer's, the
//! static answer's), the in-process cost of a router, and the in-process
//! phase alone for a profiler (`--webhook-profile N`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use anyhow::{bail, Context as _};
use axum::body::{Body, Bytes};
use axum::extract::DefaultBodyLimit;
use axum::http::header::CONTENT_TYPE;
use axum::routing::post;
use axum::Router;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use openflux::api::{Artifact, ArtifactSpec};
use openflux::certs::{self, CertKeeper, CertSource};
use openflux::index::{IndexedArtifact, OwnerIndex};
use openflux::webhook::server::{router, serve_tls, AppState, MAX_BODY_BYTES, MUTATE_PATH};
use openflux::webhook::{Options, WebhookMetrics};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::WebhookParams;

/// A recorded AdmissionReview: CREATE of a Kustomization referencing
/// `HttpSource apps/web` (sources.openflux.dev/v1alpha1).
pub const RECORDED: &str =
    include_str!("../../tests/fixtures/admission/kustomization-create-custom.json");
/// The custom source kind of the index: apiVersion and kind.
pub const HTTP_SOURCE: (&str, &str) = ("sources.openflux.dev/v1alpha1", "HttpSource");
/// 100 namespaces of 100 custom sources, one Artifact each.
const NAMESPACES: usize = 100;
pub const SOURCES_PER_NAMESPACE: usize = 100;
/// Distinct requests sent in turn.
pub const VARIANTS: usize = 1024;

/// The baseline's answer.
const ALLOWED: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-4000-8000-000000000000","allowed":true}}"#;

fn namespace(i: usize) -> String {
    format!("team-{i:02}")
}

fn source(i: usize) -> String {
    format!("src-{i:03}")
}

/// The owner index the webhook answers from: 10,000 Artifacts, and as
/// many per namespace of `extra`.
pub fn index(extra: &[String]) -> OwnerIndex {
    let namespaces: Vec<String> = (0..NAMESPACES)
        .map(namespace)
        .chain(extra.iter().cloned())
        .collect();
    let mut entries = Vec::with_capacity(namespaces.len() * SOURCES_PER_NAMESPACE);
    for (n, ns) in namespaces.iter().enumerate() {
        for s in 0..SOURCES_PER_NAMESPACE {
            let (ns, src) = (ns.clone(), source(s));
            let mut a = Artifact::new(
                &format!("{src}-latest"),
                ArtifactSpec {
                    url: format!("http://storage.example/{ns}/{src}.tar.gz"),
                    revision: "v1".into(),
                    digest: Some(format!("sha256:{:064x}", n * 1000 + s)),
                    ..Default::default()
                },
            );
            a.metadata.namespace = Some(ns.clone());
            a.metadata.uid = Some(format!("artifact-{ns}-{src}"));
            a.metadata.owner_references = Some(vec![OwnerReference {
                api_version: HTTP_SOURCE.0.into(),
                kind: HTTP_SOURCE.1.into(),
                name: src.clone(),
                uid: format!("source-{ns}-{src}"),
                controller: Some(true),
                block_owner_deletion: None,
            }]);
            if let Some(entry) = IndexedArtifact::from_artifact(&a) {
                entries.push(entry);
            }
        }
    }
    let mut index = OwnerIndex::new();
    index.reset(entries);
    index
}

/// The recorded review re-addressed to `VARIANTS` sources of the index.
pub fn bodies() -> anyhow::Result<Vec<Bytes>> {
    let recorded: Value = serde_json::from_str(RECORDED).context("the recorded review")?;
    let mut bodies = Vec::with_capacity(VARIANTS);
    for v in 0..VARIANTS {
        let (ns, src) = (
            namespace(v % NAMESPACES),
            source((v * 37) % SOURCES_PER_NAMESPACE),
        );
        let mut review = recorded.clone();
        let name = format!("app-{v}");
        let set = |review: &mut Value, pointer: &str, value: &str| -> anyhow::Result<()> {
            *review
                .pointer_mut(pointer)
                .with_context(|| format!("the recorded review has no {pointer}"))? =
                Value::String(value.to_string());
            Ok(())
        };
        set(
            &mut review,
            "/request/uid",
            &format!("00000000-0000-4000-8000-{v:012}"),
        )?;
        set(&mut review, "/request/name", &name)?;
        set(&mut review, "/request/namespace", &ns)?;
        set(&mut review, "/request/object/metadata/name", &name)?;
        set(&mut review, "/request/object/metadata/namespace", &ns)?;
        set(&mut review, "/request/object/spec/sourceRef/name", &src)?;
        bodies.push(Bytes::from(serde_json::to_vec(&review)?));
    }
    Ok(bodies)
}

/// An in-memory serving certificate for localhost and 127.0.0.1: the keeper
/// (keep it while serving), the TLS configuration and the CA in PEM.
pub fn loopback_tls() -> anyhow::Result<(CertKeeper, Arc<rustls::ServerConfig>, Vec<u8>)> {
    let keeper = CertKeeper::start(CertSource::InMemory {
        dns_names: vec!["localhost".into()],
        ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    })
    .context("making the serving certificate")?;
    let tls = Arc::new(certs::server_config(keeper.resolver())?);
    let ca = keeper.ca_bundle().borrow().clone();
    Ok((keeper, tls, ca))
}

/// Serves `app` with `tls` on a loopback port, on the runtime this runs
/// on, until `stop`.
pub async fn serve_loopback(
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(serve_tls(listener, tls, app, async move {
        let _ = stop.wait_for(|s| *s).await;
    }));
    Ok((addr, task))
}

pub fn baseline_router() -> Router {
    Router::new()
        .route(
            MUTATE_PATH,
            post(|_body: Bytes| async { ([(CONTENT_TYPE, "application/json")], ALLOWED) }),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// CPU time per request of a router alone, called in process on this
/// thread (no TLS, no HTTP parsing, no network), in microseconds.
pub async fn router_cost(app: &Router, bodies: &[Bytes], requests: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    for i in 0..requests {
        let request = axum::http::Request::post(MUTATE_PATH)
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(bodies[i % bodies.len()].clone()))?;
        let response = app.clone().oneshot(request).await?;
        if !response.status().is_success() {
            bail!("the router answered {}", response.status());
        }
        axum::body::to_bytes(response.into_body(), usize::MAX).await?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / requests as f64)
}

/// `openflux run` logs at info by default: formatting its log lines is
/// part of the cost (they are written to nowhere, so no terminal or disk
/// speed is measured).
pub fn init_logs(p: &WebhookParams) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(p.log_level.as_str())
        .with_writer(std::io::sink)
        .try_init();
}

/// openflux's handler state over the benchmark's owner index, and the
/// number of Artifacts indexed.
pub fn state() -> (AppState, usize) {
    state_for(&[])
}

/// [`state`] with the custom sources of the namespaces `extra` indexed too.
pub fn state_for(extra: &[String]) -> (AppState, usize) {
    let index = index(extra);
    let indexed = index.len();
    let facts = openflux::cluster::facts::Facts::everywhere(
        openflux::cluster::target::Target::ExternalArtifact,
        &[],
    );
    let state = AppState::new(
        openflux::webhook::Knowledge {
            index: Arc::new(RwLock::new(index)),
            facts: Arc::new(RwLock::new(facts)),
            ..Default::default()
        },
        WebhookMetrics::default(),
        Options::default(),
    );
    (state, indexed)
}

/// openflux's answer to `body`, from the router in process: what the
/// static server sends back for every request.
pub async fn answer_of(app: &Router, body: &Bytes) -> anyhow::Result<Bytes> {
    let request = axum::http::Request::post(MUTATE_PATH)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(body.clone()))?;
    let response = app.clone().oneshot(request).await?;
    if !response.status().is_success() {
        bail!("the router answered {}", response.status());
    }
    Ok(axum::body::to_bytes(response.into_body(), usize::MAX).await?)
}

/// A router that answers every request with `answer`, without reading it
/// beyond receiving the body: the floor of a webhook that sends the same
/// bytes as openflux on the same server.
pub fn static_router(answer: Bytes) -> Router {
    Router::new()
        .route(
            MUTATE_PATH,
            post(move |_body: Bytes| {
                let answer = answer.clone();
                async move { ([(CONTENT_TYPE, "application/json")], answer) }
            }),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// The in-process phase alone, for a profiler (`--webhook-profile N`): N
/// requests to openflux's router, then N to the constant answer's, each
/// in a function of its own (`profile_openflux`, `profile_baseline`) so
/// that a profiler can tell them apart (e.g. valgrind's
/// `--toggle-collect=*profile_openflux*`).
pub fn profile(p: &WebhookParams, requests: usize) -> anyhow::Result<()> {
    init_logs(p);
    let (state, _) = state();
    let (app, base) = (router(state), baseline_router());
    let bodies = bodies()?;
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Warm up: lazily built tables, metric families, allocator pools.
    client.block_on(router_cost(&app, &bodies, bodies.len()))?;
    client.block_on(router_cost(&base, &bodies, bodies.len()))?;
    let of = profile_openflux(&client, &app, &bodies, requests)?;
    let baseline = profile_baseline(&client, &base, &bodies, requests)?;
    println!("router alone, {requests} requests: openflux {of:.2} µs, baseline {baseline:.2} µs per request");
    Ok(())
}

// Two functions with the same body on purpose: each is its own frame in a
// callgrind profile, so openflux's requests and the baseline's are counted
// apart.
#[inline(never)]
fn profile_openflux(
    client: &tokio::runtime::Runtime,
    app: &Router,
    bodies: &[Bytes],
    requests: usize,
) -> anyhow::Result<f64> {
    client.block_on(router_cost(app, bodies, requests))
}

#[inline(never)]
fn profile_baseline(
    client: &tokio::runtime::Runtime,
    app: &Router,
    bodies: &[Bytes],
    requests: usize,
) -> anyhow::Result<f64> {
    client.block_on(router_cost(app, bodies, requests))
}
