//! The webhook with the API server in the loop: Kustomization creates
//! through the local API server, which calls a registered mutating webhook
//! over HTTPS on loopback as it calls openflux in a cluster. The creates
//! are dry runs: admitted in full (webhooks, schema validation), never
//! stored, so etcd stays out of the figures.
//!
//! - openflux: its webhook router (the webhook benchmark's owner index
//!   plus this namespace's custom sources) behind a
//!   MutatingWebhookConfiguration for one namespace; every create names a
//!   custom source, which openflux's patch rewrites to its export;
//! - baseline: the least a webhook the API server accepts does (read the
//!   request's uid, answer "allowed" for it) on the same TLS server, behind
//!   a configuration for a second namespace; every create names a
//!   GitRepository, valid as sent;
//! - no webhook: the same creates in a third namespace no webhook is
//!   called for;
//! - patching baseline: the least a webhook that rewrites does (read the
//!   request's uid and name, answer openflux's own patch for that create,
//!   computed before the run), behind a configuration for a fourth
//!   namespace; every create names a custom source, as openflux's do. The
//!   API server applies the same patch as for openflux, so the difference
//!   between the two is openflux's own cost, and the difference between
//!   this one and the allowing baseline the API server's cost of a patch.
//!
//! Beside the client's view, the API server's own account of each call to
//! the three webhooks: `apiserver_admission_webhook_admission_duration_seconds`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use base64::Engine as _;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, PostParams};
use kube::core::DynamicObject;
use openflux::webhook::server::{router, MUTATE_PATH};
use serde_json::json;
use tokio::sync::watch;

mod baselines;

use baselines::{allowing_router, patches_of, patching_router};

use crate::cluster;
use crate::observe::string_at;
use crate::process::{self, label};
use crate::report::{Figure, Report};
use crate::stats::{mean, ms, summarize};
use crate::support::Env;
use crate::webhook_setup::{
    loopback_tls, serve_loopback, state_for, HTTP_SOURCE, SOURCES_PER_NAMESPACE,
};

const SECTION: &str = "webhook via API server";
const DURATION: &str = "apiserver_admission_webhook_admission_duration_seconds";

/// The three ways a create is admitted, numbered as the arrays of
/// [`Measured`] hold them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Openflux = 0,
    Baseline = 1,
    NoWebhook = 2,
    Patching = 3,
}

pub async fn run(
    env: &Env,
    quick: bool,
    in_flight: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let (requests, rounds) = if quick { (50, 1) } else { (2000, 3) };
    let namespaces = [
        env.namespace("bench-admit").await,
        env.namespace("bench-admit-base").await,
        env.namespace("bench-admit-none").await,
        env.namespace("bench-admit-patch").await,
    ];
    let [of_ns, base_ns, none_ns, patch_ns] = namespaces.each_ref().map(|n| n.name().to_string());
    let result = measure(
        env,
        [&of_ns, &base_ns, &none_ns, &patch_ns],
        requests,
        rounds,
        in_flight,
    )
    .await;
    for ns in namespaces {
        cluster::delete_namespace(env, ns, None).await;
    }
    let m = result?;

    report.param("admission.requests_per_round", requests);
    report.param("admission.rounds", rounds);
    report.param("admission.in_flight", in_flight);
    let (t_of, t_base, t_none) = (mean(&m.rate[0]), mean(&m.rate[1]), mean(&m.rate[2]));
    let t_patch = mean(&m.rate[3]);
    report.push(
        Figure::new(
            SECTION,
            &format!("creates per second, {in_flight} in flight"),
            "req/s",
            t_of,
        )
        .baseline(t_base),
    );
    report.push(
        Figure::new(SECTION, "creates per second, vs. no webhook", "req/s", t_of).baseline(t_none),
    );
    report.push(
        Figure::new(
            SECTION,
            "creates per second, vs. a webhook answering the same patch",
            "req/s",
            t_of,
        )
        .baseline(t_patch),
    );
    report.push(
        Figure::new(
            SECTION,
            "a webhook answering the same patch: creates per second, vs. an allowing webhook",
            "req/s",
            t_patch,
        )
        .baseline(t_base),
    );
    let (of, base) = (
        summarize(m.latency[0].clone()),
        summarize(m.latency[1].clone()),
    );
    report.push(Figure::new(SECTION, "create p50 latency", "ms", of.p50).baseline(base.p50));
    report.push(Figure::new(SECTION, "create p99 latency", "ms", of.p99).baseline(base.p99));
    let patching = summarize(m.latency[3].clone());
    report.push(
        Figure::new(
            SECTION,
            "create p99 latency, vs. a webhook answering the same patch",
            "ms",
            of.p99,
        )
        .baseline(patching.p99),
    );
    report.push(
        Figure::new(
            SECTION,
            "the API server's webhook call, mean (admission_duration_seconds)",
            "ms",
            m.call_mean[0],
        )
        .baseline(m.call_mean[1]),
    );
    report.push(
        Figure::new(
            SECTION,
            "the API server's webhook call, mean, vs. a webhook answering the same patch",
            "ms",
            m.call_mean[0],
        )
        .baseline(m.call_mean[2]),
    );
    let none = summarize(m.latency[2].clone());
    report.note(format!(
        "{SECTION}: no webhook, p50 {:.3} ms, p99 {:.3} ms per create",
        none.p50, none.p99
    ));
    Ok(())
}

/// Per path (openflux, baseline, no webhook, patching baseline): creates
/// per second of each round, every create's latency (ms); the API server's
/// mean call (ms) to each of the three webhooks (openflux, baseline,
/// patching baseline).
struct Measured {
    rate: [Vec<f64>; 4],
    latency: [Vec<f64>; 4],
    call_mean: [f64; 3],
}

async fn measure(
    env: &Env,
    [of_ns, base_ns, none_ns, patch_ns]: [&str; 4],
    requests: usize,
    rounds: usize,
    in_flight: usize,
) -> anyhow::Result<Measured> {
    let (_keeper, tls, ca) = loopback_tls()?;
    let (state, _) = state_for(&[of_ns.to_string()]);
    let (stop, stopped) = watch::channel(false);
    let openflux = router(state);
    let patches = Arc::new(patches_of(&openflux, of_ns).await?);
    let (of_addr, _) = serve_loopback(tls.clone(), openflux, stopped.clone()).await?;
    let (base_addr, _) = serve_loopback(tls.clone(), allowing_router(), stopped.clone()).await?;
    let (patch_addr, _) = serve_loopback(tls, patching_router(patches), stopped).await?;
    let hooks = [
        register(env, "openflux", of_ns, of_addr, &ca).await?,
        register(env, "baseline", base_ns, base_addr, &ca).await?,
        register(env, "patching", patch_ns, patch_addr, &ca).await?,
    ];
    let result = async {
        let apis = [of_ns, base_ns, none_ns, patch_ns]
            .map(|ns| cluster::api(&env.client, ns, &cluster::kustomizations()));
        let bodies = |path| (0..requests).map(move |i| kustomization(path, i));
        // openflux's patch is applied before the create is answered: wait
        // (bounded) until the API server calls it, as a new configuration
        // takes effect within seconds.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let created = apis[0].create(&dry_run(), &kustomization(Path::Openflux, 0)).await;
            let rewritten = created
                .as_ref()
                .ok()
                .and_then(|o| string_at(o, "/spec/sourceRef/kind"));
            if rewritten.as_deref() == Some("ExternalArtifact") {
                break;
            }
            if Instant::now() >= deadline {
                bail!("the API server did not call openflux's webhook within 30s (last create: {created:?})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let before = process::apiserver_metrics(&env.client).await?;
        let mut m = Measured {
            rate: Default::default(),
            latency: Default::default(),
            call_mean: [f64::NAN; 3],
        };
        let paths = [
            Path::Openflux,
            Path::Baseline,
            Path::NoWebhook,
            Path::Patching,
        ];
        for round in 0..rounds {
            let mut order = paths;
            if round % 2 == 1 {
                order.reverse();
            }
            for path in order {
                let i = path as usize;
                let started = Instant::now();
                let latencies = creates(&apis[i], bodies(path), in_flight).await?;
                m.rate[i].push(requests as f64 / started.elapsed().as_secs_f64());
                m.latency[i].extend(latencies);
            }
        }
        let after = process::apiserver_metrics(&env.client).await?;
        for (i, hook) in hooks.iter().enumerate() {
            let calls = calls(&after, hook) - calls(&before, hook);
            let want = (requests * rounds) as f64;
            if calls < want {
                bail!("the API server counted {calls} calls to {hook}, {want} creates were sent");
            }
            m.call_mean[i] = 1000.0 * (seconds(&after, hook) - seconds(&before, hook)) / calls;
        }
        anyhow::Ok(m)
    }
    .await;
    let _ = stop.send(true);
    let api: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    for hook in &hooks {
        let _ = api.delete(hook, &DeleteParams::default()).await;
    }
    result
}

/// Registers a mutating webhook `<who>.bench.openflux.dev` for
/// Kustomization creates in `ns`, called at `addr`; returns its name (the
/// configuration's and the webhook's, as the API server's metrics name it).
async fn register(
    env: &Env,
    who: &str,
    ns: &str,
    addr: SocketAddr,
    ca: &[u8],
) -> anyhow::Result<String> {
    let name = format!("{who}.{ns}.bench.openflux.dev");
    let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": name,
            "clientConfig": {
                "url": format!("https://{addr}{MUTATE_PATH}"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
            },
            "rules": [{
                "apiGroups": ["kustomize.toolkit.fluxcd.io"],
                "apiVersions": ["*"],
                "resources": ["kustomizations"],
                "operations": ["CREATE"],
            }],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    api.create(&PostParams::default(), &config)
        .await
        .with_context(|| format!("creating MutatingWebhookConfiguration {name}"))?;
    Ok(name)
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        field_manager: None,
    }
}

/// The `i`th Kustomization of a path: a custom source for openflux to
/// rewrite, a GitRepository (valid as sent) for the others.
fn kustomization(path: Path, i: usize) -> DynamicObject {
    let source = format!("src-{:03}", i % SOURCES_PER_NAMESPACE);
    let source_ref = match path {
        Path::Openflux | Path::Patching => {
            json!({"apiVersion": HTTP_SOURCE.0, "kind": HTTP_SOURCE.1, "name": source})
        }
        Path::Baseline | Path::NoWebhook => json!({"kind": "GitRepository", "name": source}),
    };
    DynamicObject::new(&format!("app-{i}"), &cluster::kustomizations()).data(json!({
        "spec": {"interval": "10m", "prune": true, "path": "./", "sourceRef": source_ref},
    }))
}

/// Sends `bodies` as dry-run creates, `in_flight` at a time; returns each
/// one's latency in milliseconds.
async fn creates(
    api: &Api<DynamicObject>,
    bodies: impl Iterator<Item = DynamicObject>,
    in_flight: usize,
) -> anyhow::Result<Vec<f64>> {
    let params = dry_run();
    let timed: Vec<anyhow::Result<f64>> = futures::stream::iter(bodies)
        .map(|body| {
            let params = &params;
            async move {
                let started = Instant::now();
                api.create(params, &body).await.with_context(|| {
                    format!(
                        "dry-run create of Kustomization {}",
                        body.metadata.name.as_deref().unwrap_or("")
                    )
                })?;
                Ok(ms(started.elapsed()))
            }
        })
        .buffer_unordered(in_flight.max(1))
        .collect()
        .await;
    timed.into_iter().collect()
}

/// Calls of webhook `name` the API server counted, and their seconds.
fn calls(metrics: &str, name: &str) -> f64 {
    process::metric_sum(metrics, &format!("{DURATION}_count"), |l| {
        label(l, "name") == Some(name)
    })
}

fn seconds(metrics: &str, name: &str) -> f64 {
    process::metric_sum(metrics, &format!("{DURATION}_sum"), |l| {
        label(l, "name") == Some(name)
    })
}
