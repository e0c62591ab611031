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
//!
//! Beside them, a static answer server: the same server again, answering
//! every request with openflux's answer to one variant, precomputed. It
//! receives and sends the same bytes as openflux and decides nothing: the
//! floor of any webhook that answers what openflux answers.
//!
//! The load generator speaks HTTP/1.1 over several keep-alive connections
//! (`--connections`, default 8), as the API server does: since Kubernetes
//! 1.16 it calls webhooks over HTTP/1.1 and opens more connections for
//! concurrent requests.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use openflux::webhook::server::{router, MUTATE_PATH};
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::sync::watch;

use crate::loadgen::{self, Connection, Target};
use crate::report::{Figure, Report};
use crate::stats::{mean, summarize};
use crate::webhook_setup::{
    answer_of, baseline_router, bodies, init_logs, loopback_tls, router_cost, serve_loopback,
    state, static_router, VARIANTS,
};
use crate::WebhookParams;

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

/// The servers measured side by side.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Server {
    Openflux,
    Baseline,
    /// The same TLS server answering every request with openflux's answer
    /// to the first variant, precomputed: the bytes in and out are
    /// openflux's, the work between them none.
    Static,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::Openflux => "openflux",
            Server::Baseline => "baseline",
            Server::Static => "static answer",
        }
    }
}

pub fn run(p: &WebhookParams, report: &mut Report) -> anyhow::Result<()> {
    init_logs(p);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("webhook-server")
        .enable_all()
        .build()?;
    let (_keeper, tls, ca) = loopback_tls()?;
    let (state, indexed) = state();
    let bodies = bodies()?;
    let (stop, stopped) = watch::channel(false);
    let in_process = (router(state.clone()), baseline_router());
    let fixed = server.block_on(answer_of(&in_process.0, &bodies[0]))?;
    let serve = |app, stop| server.block_on(serve_loopback(tls.clone(), app, stop));
    let (of_addr, of_task) = serve(router(state), stopped.clone())?;
    let (base_addr, base_task) = serve(baseline_router(), stopped.clone())?;
    let (static_addr, static_task) = serve(static_router(fixed), stopped)?;

    let client_tls = loadgen::client_config(&ca)?;
    let name = ServerName::try_from("localhost")?;
    let target = |addr| {
        Target::new(
            addr,
            client_tls.clone(),
            name.clone(),
            MUTATE_PATH,
            bodies.clone(),
        )
    };
    let (openflux, baseline, fixed) = (target(of_addr), target(base_addr), target(static_addr));
    let target_of = |server: Server| match server {
        Server::Openflux => &openflux,
        Server::Baseline => &baseline,
        Server::Static => &fixed,
    };

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
        verify(&fixed, true).await?;
        let direct = (
            router_cost(&in_process.0, &openflux.bodies, direct_requests).await?,
            router_cost(&in_process.1, &openflux.bodies, direct_requests).await?,
        );
        let warmup = Duration::from_secs_f64(p.warmup);
        let duration = Duration::from_secs_f64(p.seconds);
        let (mut sat_of, mut sat_base, mut sat_static) = (Vec::new(), Vec::new(), Vec::new());
        let (mut lat_of, mut lat_base, mut lag) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..p.rounds {
            // Alternate the order, so none always runs first or last.
            let order = if round % 2 == 0 {
                [Server::Openflux, Server::Baseline, Server::Static]
            } else {
                [Server::Static, Server::Baseline, Server::Openflux]
            };
            for server in order {
                let s = loadgen::saturate(target_of(server), p.connections, warmup, duration)
                    .await?;
                eprintln!(
                    "webhook round {round}: {} saturated at {:.0} req/s ({} answers)",
                    server.name(),
                    s.per_second,
                    s.requests
                );
                match server {
                    Server::Openflux => &mut sat_of,
                    Server::Baseline => &mut sat_base,
                    Server::Static => &mut sat_static,
                }
                .push(s.per_second);
            }
            for server in order.into_iter().filter(|s| *s != Server::Static) {
                let is_openflux = server == Server::Openflux;
                let r = loadgen::paced(target_of(server), p.connections, p.rate, warmup, duration)
                    .await?;
                let s = summarize(r.latencies_ms.clone());
                eprintln!(
                    "webhook round {round}: {} at {:.0} req/s: p50 {:.3} ms, p99 {:.3} ms (answered {:.0} req/s)",
                    server.name(),
                    r.rate,
                    s.p50,
                    s.p99,
                    r.achieved
                );
                lag.extend(r.pacer_lag_ms);
                if is_openflux { &mut lat_of } else { &mut lat_base }.extend(r.latencies_ms);
            }
        }
        anyhow::Ok((sat_of, sat_base, sat_static, lat_of, lat_base, lag, direct))
    });
    let _ = stop.send(true);
    let _ = server.block_on(async {
        let _ = of_task.await;
        let _ = static_task.await;
        base_task.await
    });
    server.shutdown_timeout(Duration::from_secs(5));
    let (sat_of, sat_base, sat_static, lat_of, lat_base, lag, direct) = measured?;

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
    let t_static = mean(&sat_static);
    report.push(
        Figure::new(
            section,
            &format!(
                "static answer server (same bytes, no decision), saturated, {} connections",
                p.connections
            ),
            "req/s",
            t_static,
        )
        .baseline(t_base),
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
    report.samples(
        "webhook saturated throughput, static answer server (req/s per round)",
        &sat_static,
    );
    Ok(())
}
