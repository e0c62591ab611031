//! The mutating webhook under load, in process, over TLS on loopback.
//!
//! openflux: the webhook's own router and TLS server answering a recorded
//! AdmissionReview of a Kustomization whose `sourceRef` names a custom
//! source, so every request runs the whole parse, resolve (against an owner
//! index of 10,000 Artifacts) and patch path.
//!
//! Baseline: the same TLS configuration and the same server function
//! (`serve_tls`: axum on hyper, HTTP/1.1 and HTTP/2) with a router that
//! answers a constant "allowed" AdmissionReview. The ratio is the cost of
//! openflux's decision over the stack it runs on.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

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
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::loadgen::{self, Connection, Target};
use crate::report::{Figure, Report};
use crate::stats::{mean, summarize};
use crate::WebhookParams;

/// A recorded AdmissionReview: CREATE of a Kustomization referencing
/// `HttpSource apps/web` (sources.openflux.dev/v1alpha1).
const RECORDED: &str =
    include_str!("../../tests/fixtures/admission/kustomization-create-custom.json");
const SOURCE_API_VERSION: &str = "sources.openflux.dev/v1alpha1";
const SOURCE_KIND: &str = "HttpSource";
/// 100 namespaces of 100 custom sources, one Artifact each.
const NAMESPACES: usize = 100;
const SOURCES_PER_NAMESPACE: usize = 100;
/// Distinct requests sent in turn.
const VARIANTS: usize = 1024;

/// The baseline's answer.
const ALLOWED: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-4000-8000-000000000000","allowed":true}}"#;

fn namespace(i: usize) -> String {
    format!("team-{i:02}")
}

fn source(i: usize) -> String {
    format!("src-{i:03}")
}

/// The owner index the webhook answers from: 10,000 Artifacts.
fn index() -> OwnerIndex {
    let mut entries = Vec::with_capacity(NAMESPACES * SOURCES_PER_NAMESPACE);
    for n in 0..NAMESPACES {
        for s in 0..SOURCES_PER_NAMESPACE {
            let (ns, src) = (namespace(n), source(s));
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
                api_version: SOURCE_API_VERSION.into(),
                kind: SOURCE_KIND.into(),
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
fn bodies() -> anyhow::Result<Vec<Bytes>> {
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

fn baseline_router() -> Router {
    Router::new()
        .route(
            MUTATE_PATH,
            post(|_body: Bytes| async { ([(CONTENT_TYPE, "application/json")], ALLOWED) }),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// Serves `app` with `tls` on a loopback port of `runtime` until `stop`.
fn start(
    runtime: &tokio::runtime::Runtime,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = runtime.block_on(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))?;
    let addr = listener.local_addr()?;
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let task = runtime.spawn(serve_tls(listener, tls, app, shutdown));
    Ok((addr, task))
}

/// CPU time per request of a router alone, called in process on this
/// thread (no TLS, no HTTP parsing, no network), in microseconds.
async fn router_cost(app: &Router, bodies: &[Bytes], requests: usize) -> anyhow::Result<f64> {
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

/// Every variant gets the answer the benchmark is about: openflux allows
/// and patches it; the baseline allows it.
async fn verify(target: &Arc<Target>, patched: bool) -> anyhow::Result<()> {
    let mut conn = Connection::open(target).await?;
    for (i, body) in target.bodies.iter().enumerate() {
        let answer: Value = serde_json::from_slice(&conn.post(body.clone()).await?)?;
        let allowed = answer.pointer("/response/allowed") == Some(&Value::Bool(true));
        let patch = answer
            .pointer("/response/patchType")
            .and_then(|v| v.as_str());
        if !allowed || (patched && patch != Some("JSONPatch")) {
            bail!("request {i} was not answered as expected: {answer}");
        }
    }
    Ok(())
}

pub fn run(p: &WebhookParams, report: &mut Report) -> anyhow::Result<()> {
    // `openflux run` logs at info by default: formatting its log lines is
    // part of the cost (they are written to nowhere, so no terminal or disk
    // speed is measured).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(p.log_level.as_str())
        .with_writer(std::io::sink)
        .try_init();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("webhook-server")
        .enable_all()
        .build()?;
    let keeper = CertKeeper::start(CertSource::InMemory {
        dns_names: vec!["localhost".into()],
        ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    })
    .context("making the serving certificate")?;
    let tls = Arc::new(certs::server_config(keeper.resolver())?);
    let ca = keeper.ca_bundle().borrow().clone();
    let index = index();
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
    let (stop, stopped) = watch::channel(false);
    let in_process = (router(state.clone()), baseline_router());
    let (of_addr, of_task) = start(&server, tls.clone(), router(state), stopped.clone())?;
    let (base_addr, base_task) = start(&server, tls, baseline_router(), stopped)?;

    let client_tls = loadgen::client_config(&ca)?;
    let name = ServerName::try_from("localhost")?;
    let bodies = bodies()?;
    let openflux = Target::new(
        of_addr,
        client_tls.clone(),
        name.clone(),
        MUTATE_PATH,
        bodies.clone(),
    );
    let baseline = Target::new(base_addr, client_tls, name, MUTATE_PATH, bodies);

    report.param("webhook.indexed_artifacts", indexed);
    report.param("webhook.distinct_requests", VARIANTS);
    report.param("webhook.connections", p.connections);
    report.param("webhook.seconds_per_run", p.seconds);
    report.param("webhook.rounds", p.rounds);
    report.param("webhook.rate", p.rate);
    report.param("webhook.server_threads", cores);
    report.param("webhook.log_level", &p.log_level);

    // The load generator runs on this thread, beside the server's threads.
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let direct_requests = (p.seconds * 4000.0) as usize;
    let measured = client.block_on(async {
        verify(&openflux, true).await?;
        verify(&baseline, false).await?;
        let direct = (
            router_cost(&in_process.0, &openflux.bodies, direct_requests).await?,
            router_cost(&in_process.1, &openflux.bodies, direct_requests).await?,
        );
        let warmup = Duration::from_secs_f64(p.warmup);
        let duration = Duration::from_secs_f64(p.seconds);
        let (mut sat_of, mut sat_base) = (Vec::new(), Vec::new());
        let (mut lat_of, mut lat_base, mut lag) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..p.rounds {
            // Alternate the order, so neither always runs second.
            let order = if round % 2 == 0 { [true, false] } else { [false, true] };
            for is_openflux in order {
                let target = if is_openflux { &openflux } else { &baseline };
                let s = loadgen::saturate(target, p.connections, warmup, duration).await?;
                eprintln!(
                    "webhook round {round}: {} saturated at {:.0} req/s ({} answers)",
                    if is_openflux { "openflux" } else { "baseline" },
                    s.per_second,
                    s.requests
                );
                if is_openflux { &mut sat_of } else { &mut sat_base }.push(s.per_second);
            }
            for is_openflux in order {
                let target = if is_openflux { &openflux } else { &baseline };
                let r = loadgen::paced(target, p.connections, p.rate, warmup, duration).await?;
                let s = summarize(r.latencies_ms.clone());
                eprintln!(
                    "webhook round {round}: {} at {:.0} req/s: p50 {:.3} ms, p99 {:.3} ms (answered {:.0} req/s)",
                    if is_openflux { "openflux" } else { "baseline" },
                    r.rate,
                    s.p50,
                    s.p99,
                    r.achieved
                );
                lag.extend(r.pacer_lag_ms);
                if is_openflux { &mut lat_of } else { &mut lat_base }.extend(r.latencies_ms);
            }
        }
        anyhow::Ok((sat_of, sat_base, lat_of, lat_base, lag, direct))
    });
    let _ = stop.send(true);
    let _ = server.block_on(async {
        let _ = of_task.await;
        base_task.await
    });
    server.shutdown_timeout(Duration::from_secs(5));
    let (sat_of, sat_base, lat_of, lat_base, lag, direct) = measured?;

    let section = "webhook";
    let (t_of, t_base) = (mean(&sat_of), mean(&sat_base));
    report.push(
        Figure::new(
            section,
            &format!("throughput, saturated, {} connections", p.connections),
            "req/s",
            t_of,
        )
        .baseline(t_base)
        .target("ratio >= 0.80", t_of / t_base >= 0.80),
    );
    let (of, base) = (summarize(lat_of.clone()), summarize(lat_base.clone()));
    let rate = p.rate;
    report.push(
        Figure::new(
            section,
            &format!("p50 latency at {rate:.0} req/s"),
            "ms",
            of.p50,
        )
        .baseline(base.p50),
    );
    report.push(
        Figure::new(
            section,
            &format!("p99 latency at {rate:.0} req/s"),
            "ms",
            of.p99,
        )
        .baseline(base.p99)
        .target("<= 1 ms", of.p99 <= 1.0),
    );
    report.push(
        Figure::new(
            section,
            &format!("p99.9 latency at {rate:.0} req/s"),
            "ms",
            of.p999,
        )
        .baseline(base.p999),
    );
    report.push(
        Figure::new(
            section,
            "router alone, in process: CPU per request",
            "µs",
            direct.0,
        )
        .baseline(direct.1),
    );
    let lag = summarize(lag);
    report.note(format!(
        "webhook: {} + {} requests timed at {rate:.0} req/s; the load generator released them p50 {:.3} ms, p99 {:.3} ms after their intended time (included in the latencies, for both)",
        of.n, base.n, lag.p50, lag.p99
    ));
    report.samples(
        "webhook saturated throughput, openflux (req/s per round)",
        &sat_of,
    );
    report.samples(
        "webhook saturated throughput, baseline (req/s per round)",
        &sat_base,
    );
    Ok(())
}
