//! The scenarios of `make chaos`.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use openflux::index::OwnerIndex;
use openflux::webhook::server::{answer, MAX_BODY_BYTES};
use openflux::webhook::Options as DecisionOptions;
use serde_json::json;

use crate::client::{self, Load};
use crate::server::{Certs, Served};
use crate::{failover, restart, reviews, Options, Row};

/// This process's resident and peak resident memory, in MiB.
fn own_memory() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// (a) Generated reviews through the decision path, and a sample of them
/// through the HTTPS server.
pub async fn reviews(options: &Options) -> anyhow::Result<Vec<Row>> {
    let mut index = OwnerIndex::new();
    index.reset([]);
    let facts = openflux::cluster::facts::Facts::everywhere(
        openflux::cluster::target::Target::ExternalArtifact,
        &[],
    );
    let view = openflux::rewrite::View {
        index: &index,
        facts: &facts,
        policies: &openflux::policy::NONE,
    };
    let decision = DecisionOptions::default();
    let mut rng = reviews::Rng(0xc4a0_5eed);
    let (_, peak_before) = own_memory();
    let (mut panics, mut bad, mut bytes) = (0u64, 0u64, 0u64);
    let mut kinds = std::collections::BTreeMap::<&str, u64>::new();
    let started = Instant::now();
    for _ in 0..options.reviews {
        let body = reviews::body(&mut rng, MAX_BODY_BYTES);
        bytes += body.len() as u64;
        let Ok(answered) = std::panic::catch_unwind(|| answer(&body, view, &decision)) else {
            panics += 1;
            continue;
        };
        let text = match &answered.review {
            Ok(review) => review.clone(),
            Err(message) => message.clone().into_bytes(),
        };
        match reviews::check(&body, answered.status.as_u16(), &text) {
            Ok(kind) => *kinds.entry(kind).or_default() += 1,
            Err(_) => bad += 1,
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (_, peak_after) = own_memory();
    let mut rows = vec![
        Row::new(
            "reviews",
            "reviews through the decision path",
            options.reviews as f64,
            "count",
        ),
        Row::new("reviews", "panics", panics as f64, "count").at_most(0.0),
        Row::new(
            "reviews",
            "answers neither allowed, denied nor 400",
            bad as f64,
            "count",
        )
        .at_most(0.0),
        Row::new(
            "reviews",
            "reviews per second (one core)",
            options.reviews as f64 / elapsed,
            "1/s",
        ),
        Row::new(
            "reviews",
            "MiB of bodies generated",
            bytes as f64 / 1048576.0,
            "MiB",
        ),
        Row::new(
            "reviews",
            "peak RSS growth over the run",
            peak_after - peak_before,
            "MiB",
        )
        .at_most(64.0),
    ];
    for (kind, n) in kinds {
        rows.push(Row::new(
            "reviews",
            &format!("answered {kind}"),
            n as f64,
            "count",
        ));
    }
    // A sample through the real HTTPS server.
    let certs = Certs::new()?;
    let served = Served::start(certs.dir.path())?;
    let load = Load {
        addr: served.addr,
        tls: certs.client_config()?,
        body: Bytes::new(),
        reconnect_every: 1,
    };
    let sample = if options.quick { 200 } else { 5_000 };
    let (mut failed, mut wrong) = (0u64, 0u64);
    for _ in 0..sample {
        let body = reviews::body(&mut rng, 512 * 1024);
        match client::post_once(&load, Bytes::from(body.clone())).await {
            Ok((status, text)) if reviews::check(&body, status, &text).is_ok() => {}
            Ok(_) => wrong += 1,
            Err(_) => failed += 1,
        }
    }
    let (_, peak) = served.memory()?;
    served.stop()?;
    rows.push(Row::new(
        "reviews",
        "HTTPS sample: reviews sent",
        sample as f64,
        "count",
    ));
    rows.push(
        Row::new(
            "reviews",
            "HTTPS sample: wrong answers",
            wrong as f64,
            "count",
        )
        .at_most(0.0),
    );
    rows.push(
        Row::new(
            "reviews",
            "HTTPS sample: requests failed",
            failed as f64,
            "count",
        )
        .at_most(0.0),
    );
    rows.push(Row::new("reviews", "HTTPS sample: server peak RSS", peak, "MiB").at_most(256.0));
    Ok(rows)
}

/// A small review, as the API server sends for a Kustomization.
fn small_body() -> Bytes {
    Bytes::from_static(include_bytes!(
        "../../tests/fixtures/admission/kustomization-create-custom.json"
    ))
}

/// A valid HelmRelease review just under the body limit, its values a long
/// list of small objects (the worst case for a JSON tree).
fn max_body() -> anyhow::Result<Bytes> {
    let item = json!({"key": "value", "n": 1});
    let per = serde_json::to_vec(&item)?.len() + 1;
    let items = vec![item; (MAX_BODY_BYTES - 4096) / per];
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "max", "operation": "CREATE", "namespace": "apps",
            "resource": {"group": "helm.toolkit.fluxcd.io", "version": "v2", "resource": "helmreleases"},
            "object": {
                "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
                "metadata": {"name": "big", "namespace": "apps"},
                "spec": {"chartRef": {"kind": "HttpSource", "apiVersion": "sources.openflux.dev/v1alpha1", "name": "web"},
                         "values": {"items": items}}
            }
        }
    });
    let body = serde_json::to_vec(&review)?;
    anyhow::ensure!(
        body.len() <= MAX_BODY_BYTES,
        "the max body is {} bytes",
        body.len()
    );
    Ok(Bytes::from(body))
}

/// (b) The serving certificate rotated every 250 ms while clients keep
/// connecting: no request may fail.
pub async fn rotation(options: &Options) -> anyhow::Result<Vec<Row>> {
    let certs = Certs::new()?;
    let served = Served::start(certs.dir.path())?;
    let load = Load {
        addr: served.addr,
        tls: certs.client_config()?,
        body: small_body(),
        reconnect_every: 5,
    };
    let seconds = options.seconds.max(2);
    let until = Instant::now() + Duration::from_secs(seconds);
    let clients = tokio::spawn(async move { client::run_all(&[(load, 8)], until).await });
    let mut rotations = 0u64;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(250)).await;
        certs.rotate()?;
        rotations += 1;
    }
    let mut tally = clients.await?.remove(0);
    served.stop()?;
    if let Some(first) = tally.first_failures.first() {
        eprintln!("chaos: rotation: first failure: {first}");
    }
    Ok(vec![
        Row::new(
            "rotation",
            "certificate rotations",
            rotations as f64,
            "count",
        ),
        Row::new(
            "rotation",
            "requests answered",
            tally.answered() as f64,
            "count",
        ),
        Row::new(
            "rotation",
            "requests failed or not 200",
            tally.not_ok() as f64,
            "count",
        )
        .at_most(0.0),
        Row::new("rotation", "p99 latency", tally.quantile_ms(0.99), "ms"),
    ])
}

/// Peak RSS and small-request latency of the webhook process: small
/// requests alone (the baseline), then sixteen clients sending maximum-size
/// reviews beside them.
pub async fn memory(options: &Options) -> anyhow::Result<Vec<Row>> {
    let certs = Certs::new()?;
    let tls = certs.client_config()?;
    let small = small_body();
    let big = max_body()?;
    let seconds = Duration::from_secs(options.seconds.max(2));
    let mut phases = Vec::new();
    for big_clients in [0usize, 16] {
        let served = Served::start(certs.dir.path())?;
        let (idle, _) = served.memory()?;
        let small_load = Load {
            addr: served.addr,
            tls: tls.clone(),
            body: small.clone(),
            reconnect_every: 100,
        };
        let big_load = Load {
            body: big.clone(),
            ..small_load.clone()
        };
        let loads = [(small_load, 4), (big_load, big_clients)];
        let mut tallies = client::run_all(&loads, Instant::now() + seconds).await;
        let (_, peak) = served.memory()?;
        let stop = served.stop()?;
        let big_tally = tallies.pop().unwrap_or_default();
        let mut small_tally = tallies.pop().unwrap_or_default();
        phases.push((
            idle,
            peak,
            small_tally.quantile_ms(0.99),
            small_tally.quantile_ms(0.5),
            small_tally.not_ok(),
            big_tally,
            stop,
        ));
    }
    let (idle, base_peak, base_p99, base_p50, _, _, _) = &phases[0];
    let (_, peak, p99, p50, small_bad, big, stop) = &phases[1];
    let big_mib = big.answered() as f64 * MAX_BODY_BYTES as f64 / 1048576.0 / seconds.as_secs_f64();
    Ok(vec![
        Row::new("memory", "idle RSS", *idle, "MiB"),
        Row::new(
            "memory",
            "peak RSS, small requests only (baseline)",
            *base_peak,
            "MiB",
        ),
        Row::new(
            "memory",
            "peak RSS, 16 max-size clients + 4 small",
            *peak,
            "MiB",
        )
        .at_most(256.0),
        Row::new("memory", "small p50 under max-size load", *p50, "ms").baseline(*base_p50),
        Row::new("memory", "small p99 under max-size load", *p99, "ms").baseline(*base_p99),
        Row::new(
            "memory",
            "small requests failed or not 200",
            *small_bad as f64,
            "count",
        )
        .at_most(0.0),
        Row::new(
            "memory",
            "max-size reviews answered 200",
            big.statuses.get(&200).copied().unwrap_or(0) as f64,
            "count",
        ),
        Row::new(
            "memory",
            "max-size reviews answered 429 (busy)",
            big.statuses.get(&429).copied().unwrap_or(0) as f64,
            "count",
        ),
        Row::new("memory", "max-size MiB per second", big_mib, "MiB/s"),
        Row::new(
            "memory",
            "exit after stdin closed, under load",
            stop.as_secs_f64(),
            "s",
        )
        .at_most(10.0),
    ])
}

/// (c) The leader killed among two replicas during Artifact updates.
pub async fn failover(options: &Options) -> anyhow::Result<Vec<Row>> {
    let outcome = failover::run(options.updates).await?;
    Ok(vec![
        Row::new(
            "failover",
            "Artifact updates",
            outcome.updates as f64,
            "count",
        ),
        Row::new("failover", "updates per second", outcome.update_rate, "1/s"),
        Row::new("failover", "lost updates", outcome.lost as f64, "count").at_most(0.0),
        Row::new(
            "failover",
            "kill -9 to standby leading",
            outcome.failover_after.as_secs_f64(),
            "s",
        ),
        Row::new(
            "failover",
            "last update to converged",
            outcome.converged_after.as_secs_f64(),
            "s",
        )
        .at_most(failover::CONVERGENCE_BOUND.as_secs_f64()),
    ])
}

/// (d) etcd and kube-apiserver killed and started again during Artifact
/// updates: openflux recovers on its own.
pub async fn restart(options: &Options) -> anyhow::Result<Vec<Row>> {
    let outcome = restart::run(options.updates).await?;
    Ok(vec![
        Row::new(
            "restart",
            "Artifact updates",
            outcome.updates as f64,
            "count",
        ),
        Row::new(
            "restart",
            "kill -9 to API server ready again",
            outcome.down_for.as_secs_f64(),
            "s",
        ),
        Row::new(
            "restart",
            "openflux processes restarted",
            f64::from(u8::from(!outcome.same_processes)),
            "count",
        )
        .at_most(0.0),
        Row::new(
            "restart",
            "API server ready to openflux recovered",
            outcome.recovered_after.as_secs_f64(),
            "s",
        )
        .at_most(restart::RECOVERY_BOUND.as_secs_f64()),
        Row::new("restart", "lost updates", outcome.lost as f64, "count").at_most(0.0),
        Row::new(
            "restart",
            "last update to converged",
            outcome.converged_after.as_secs_f64(),
            "s",
        )
        .at_most(failover::CONVERGENCE_BOUND.as_secs_f64()),
    ])
}
