//! `openflux run`: the wiring.
//!
//! Every replica watches Artifacts into the owner index (which the webhook
//! reads) and serves health and metrics; the elected leader also runs the
//! controllers. The parts:
//!
//! - [`router`]: what one watch event means (pure, tested as a table);
//! - [`watch`]: the one watcher loop every watched kind runs, and the hub
//!   that applies what the router decided;
//! - [`controllers`]: the leader's mirrors and export controller;
//! - [`flags`]: the command line.

pub mod adopter;
pub mod consumers;
pub mod controllers;
pub mod exports;
pub mod flags;
pub mod router;
pub mod survey;
pub mod watch;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::runtime::events::Reporter;
use kube::runtime::reflector::store::Writer;
use kube::Client;
use openflux_api::runtime::events::{Notifier, RetryPolicy};
use openflux_api::runtime::leader::Elector;
use openflux_api::runtime::{EventRecorder, RuntimeArgs};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub use flags::{RunArgs, LEADER_ELECTION_ID};

use self::controllers::Controllers;
use self::router::Event;
use self::watch::{without_managed_fields, Hub, Watch};
use crate::api::Artifact;
use crate::controller::{Context, WriteMemo};
use crate::export::verify::Verifier;
use crate::facts::Facts;
use crate::gate::{self, GateMetrics};
use crate::index::OwnerIndex;
use crate::telemetry::{self, Metrics, Readiness};

/// How often the leader checks Flux consumers for the ExternalArtifact gate.
const GATE_CHECK_PERIOD: Duration = Duration::from_secs(60);

/// Everything `run` sets up that the webhook needs too.
pub struct Shared {
    pub client: Client,
    pub index: Arc<RwLock<OwnerIndex>>,
    pub facts: Arc<RwLock<Facts>>,
    pub registry: Arc<Mutex<Registry>>,
    pub readiness: Arc<Readiness>,
    pub shutdown: CancellationToken,
}

/// Runs openflux until SIGTERM/SIGINT, or until leadership is lost.
/// `extra` starts further services (the webhook) beside the controllers; one
/// that fails stops the process with its error instead of leaving it half up.
pub async fn run<F, Fut>(args: RunArgs, client: Client, extra: F) -> anyhow::Result<()>
where
    F: FnOnce(&Shared) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let scope = args.scope()?;
    let runtime = &args.runtime;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let gate_metrics = GateMetrics::register(&mut registry);
    let target_metrics = survey::TargetMetrics::register(&mut registry);
    let shared = Shared {
        client: client.clone(),
        index: Arc::new(RwLock::new(OwnerIndex::new())),
        facts: Arc::new(RwLock::new(Facts::default())),
        registry: Arc::new(Mutex::new(registry)),
        readiness: Arc::new(Readiness::default()),
        shutdown: CancellationToken::new(),
    };
    let shutdown = shared.shutdown.clone();
    spawn_signal_handler(shutdown.clone());
    let extra = extra(&shared);
    let failed = shutdown.clone();
    let extra = tokio::spawn(async move {
        let result = extra.await;
        if result.is_err() {
            failed.cancel();
        }
        result
    });

    let artifacts = Writer::<Artifact>::default();
    let ctx = Arc::new(Context {
        client: client.clone(),
        artifacts: artifacts.as_reader(),
        index: shared.index.clone(),
        metrics: metrics.clone(),
        memo: WriteMemo::default(),
        events: event_recorder(&client, runtime)?,
        facts: shared.facts.clone(),
        references: Default::default(),
        verifier: Verifier::new(client.clone(), args.verify_artifact_writers).await,
    });
    let (facts_changed, facts_seen) = tokio::sync::watch::channel(0u64);
    let survey = survey::Survey {
        client: client.clone(),
        mode: args.export,
        flux_namespace: args.flux_namespace.clone(),
        facts: shared.facts.clone(),
        changed: facts_changed,
        metrics: target_metrics,
    };
    tokio::spawn(survey.run(shared.readiness.watch_started(), shutdown.clone()));
    let hub = Hub::new(shared.index.clone(), metrics.clone());
    let watch = Watch {
        api: scope.api::<Artifact>(&client),
        config: scope.config(),
        slim: without_managed_fields,
        what: "Artifacts".to_string(),
        hint: "is the openflux.dev CRD installed? `openflux crds | kubectl apply -f -`",
    };
    let artifact_hub = hub.clone();
    let watch = tokio::spawn(watch.run(
        artifacts,
        shared.readiness.watch_started(),
        move |change| artifact_hub.take(Event::Artifact(change)),
        shutdown.clone(),
    ));
    let health = tokio::spawn(telemetry::serve(
        runtime.metrics_addr.socket_addr(),
        runtime.health_addr.socket_addr(),
        shared.registry.clone(),
        shared.readiness.clone(),
        shutdown.clone(),
    ));

    let leader_election = &runtime.leader_election;
    let elector = match leader_election.enable_leader_election {
        true => Some(Elector::new(
            client.clone(),
            runtime.watch.runtime_namespace()?,
            LEADER_ELECTION_ID,
            leader_election,
        )),
        false => None,
    };
    if let Some(elector) = &elector {
        tokio::select! {
            _ = elector.acquire() => {}
            _ = shutdown.cancelled() => {}
        }
    }
    let mut lost_leadership = false;
    if !shutdown.is_cancelled() {
        metrics.leader.set(1);
        tokio::spawn(gate::run(
            client.clone(),
            scope.namespace.clone(),
            gate_metrics,
            GATE_CHECK_PERIOD,
            shutdown.clone(),
        ));
        let controllers = Controllers::new(
            ctx,
            facts_seen,
            hub,
            scope,
            runtime.concurrent,
            shared.readiness.clone(),
            shutdown.clone(),
        );
        let controllers = tokio::spawn(controllers.run());
        match &elector {
            Some(elector) => tokio::select! {
                lost = elector.keep() => {
                    tracing::error!(error = %lost, "leader election lost");
                    lost_leadership = true;
                    shutdown.cancel();
                }
                _ = shutdown.cancelled() => {}
            },
            None => shutdown.cancelled().await,
        }
        if let Err(e) = controllers.await {
            tracing::error!(error = %e, "controllers ended abnormally");
        }
    }
    if let (Some(elector), false) = (&elector, lost_leadership) {
        if leader_election.leader_election_release_on_cancel {
            elector.release().await;
        }
    }
    let _ = watch.await;
    if let Ok(Err(e)) = health.await {
        tracing::error!(error = %e, "health endpoints failed");
    }
    match extra.await {
        Ok(Err(e)) => return Err(e),
        Err(e) => tracing::error!(error = %e, "service ended abnormally"),
        Ok(Ok(())) => {}
    }
    if lost_leadership {
        anyhow::bail!(
            "lost the leader election Lease; exiting so a fresh start rejoins the election"
        );
    }
    tracing::info!("openflux stopped");
    Ok(())
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received; stopping");
        shutdown.cancel();
    });
}

/// Kubernetes Events as `openflux`, and with `--events-addr` the same posted
/// to notification-controller.
fn event_recorder(client: &Client, runtime: &RuntimeArgs) -> anyhow::Result<EventRecorder> {
    let notifier = match runtime.events_url() {
        Some(url) => {
            // The events receiver is plain HTTP in Flux's installs; HTTPS
            // needs a TLS provider.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let http = reqwest::Client::builder()
                .build()
                .map_err(|e| anyhow::anyhow!("cannot build the events client: {e}"))?;
            Some(Notifier::spawn(url, http, RetryPolicy::default()))
        }
        None => None,
    };
    let reporter = Reporter {
        controller: "openflux".into(),
        instance: std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok(),
    };
    Ok(EventRecorder::new(client.clone(), reporter, notifier))
}
