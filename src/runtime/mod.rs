//! `openflux run`: the wiring.
//!
//! Every replica watches Artifacts into the owner index (which the webhook
//! reads) and serves health and metrics; the elected leader also runs the
//! controllers. With `--watch-label-selector` the replica belongs to a shard
//! ([`crate::shard`]): its controllers reconcile that shard's objects under
//! that shard's Lease, while the index still holds every Artifact. The
//! parts:
//!
//! - [`router`]: what one watch event means (pure, tested as a table);
//! - [`watch`]: the one watcher loop every watched kind runs (on
//!   [`streaming`]'s watcher), and the hub that applies what the router decided;
//! - [`wakes`]: the queue of wakes for the leader, without loss, each once;
//! - [`controllers`]: the leader's mirrors and export controller;
//! - [`decoded`]: objects that cannot be decoded, set aside one at a time;
//! - [`process`]: the signal handler and the Event recorder;
//! - [`flags`]: the command line.

pub mod allocator;
pub mod controllers;
pub mod flags;
pub mod hub;
pub mod process;
pub mod router;
pub mod wakes;

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::runtime::reflector::store::Writer;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use flags::{RunArgs, LEADER_ELECTION_ID};

use self::controllers::Controllers;
use self::hub::Hub;
use self::router::Event;
use crate::api::runtime::leader::Elector;
use crate::api::runtime::EventRecorder;
use crate::api::runtime::LeaderElectionArgs;
use crate::api::Artifact;
use crate::cluster::facts::Facts;
use crate::cluster::gate::{self, GateMetrics};
use crate::cluster::survey;
use crate::consumers::references::References;
use crate::control::{Context, WriteMemo};
use crate::export::verify::Verifier;
use crate::index::OwnerIndex;
use crate::telemetry::{self, Metrics, Readiness};
use crate::watch::decoded;
use crate::watch::run::Watch;
use crate::watch::{without_managed_fields, Scope};

/// How often the leader checks Flux consumers for the ExternalArtifact gate
/// (in its watches' stores: no API call).
const GATE_CHECK_PERIOD: Duration = Duration::from_secs(10);
/// Time the controllers get to finish their reconciles once stopped (at
/// shutdown, or when the Lease is lost) before they are aborted.
pub const CONTROLLERS_STOP_GRACE: Duration = Duration::from_secs(4);
/// Time the health and metrics servers get to close their connections.
pub const SERVER_STOP_GRACE: Duration = Duration::from_secs(1);

/// Everything `run` sets up that the webhook needs too.
pub struct Shared {
    pub client: Client,
    pub index: Arc<RwLock<OwnerIndex>>,
    pub facts: Arc<RwLock<Facts>>,
    pub registry: Arc<Mutex<Registry>>,
    pub readiness: Arc<Readiness>,
    pub shutdown: CancellationToken,
    /// The current term while this replica runs the controllers (cancelled
    /// when it ends): what else the leader alone does runs by it.
    pub leading: tokio::sync::watch::Receiver<Option<CancellationToken>>,
    /// Kubernetes Events (and notifications) as openflux.
    pub events: EventRecorder,
    /// Asks the survey for a reading of the cluster now.
    pub fresh: survey::Fresh,
}

/// Runs openflux until SIGTERM/SIGINT. Every replica keeps the owner index
/// and serves the webhook; with `--enable-leader-election` the controllers
/// run only while this replica holds the Lease, and a replica that loses it
/// stops its controllers and campaigns again without exiting.
/// `extra` starts further services (the webhook) beside the controllers; one
/// that fails stops the process with its error instead of leaving it half up.
/// The metrics and health ports are bound before anything starts, so a
/// taken one ends `run` at once with an error naming its flag.
pub async fn run<F, Fut>(args: RunArgs, client: Client, extra: F) -> anyhow::Result<()>
where
    F: FnOnce(&Shared) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let scope = args.scope()?;
    let runtime = &args.runtime;
    if runtime.leader_election.enable_leader_election {
        runtime.leader_election.validate()?;
    }
    let endpoints = telemetry::Endpoints::bind(
        runtime.metrics_addr.socket_addr(),
        runtime.health_addr.socket_addr(),
    )
    .await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let gate_metrics = GateMetrics::register(&mut registry);
    let target_metrics = survey::TargetMetrics::register(&mut registry);
    let readiness = Arc::new(Readiness::default());
    readiness.register(&mut registry);
    let (terms, leading) = tokio::sync::watch::channel(None);
    let events = process::event_recorder(&client, runtime)?;
    let (rejects, rejected) = decoded::Rejects::channel(&mut registry);
    let (asked, fresh) = survey::asking();
    let shared = Shared {
        client: client.clone(),
        index: Arc::new(RwLock::new(OwnerIndex::new())),
        facts: Arc::new(RwLock::new(Facts::default())),
        registry: Arc::new(Mutex::new(registry)),
        readiness,
        shutdown: CancellationToken::new(),
        leading,
        events: events.clone(),
        fresh,
    };
    let shutdown = shared.shutdown.clone();
    process::spawn_signal_handler(shutdown.clone());
    tokio::spawn(rejected.run(events.clone(), shutdown.clone()));
    let extra = spawn_service(extra(&shared), shutdown.clone());

    let artifacts = Writer::<Artifact>::default();
    crate::locks::lock(&shared.registry).register_collector(Box::new(
        crate::export::census::Census::new(artifacts.as_reader()),
    ));
    // The consumers' watches keep the references; the export controller
    // reads them.
    let references = Arc::new(RwLock::new(References::default()));
    let export = Arc::new(crate::export::Kept {
        verifier: Verifier::new(client.clone(), args.verify_artifact_writers).await,
        referrals: references.clone(),
    });
    let ctx = Arc::new(Context {
        client: client.clone(),
        artifacts: artifacts.as_reader(),
        index: shared.index.clone(),
        metrics: metrics.clone(),
        memo: WriteMemo::default(),
        events,
        facts: shared.facts.clone(),
        shard: args.shard()?,
        retry: runtime.retry,
        list_turns: Default::default(),
        rejects,
    });
    let (facts_changed, facts_seen) = tokio::sync::watch::channel(0u64);
    let survey = survey::Survey {
        client: client.clone(),
        mode: args.export,
        flux_namespace: args.flux_namespace.clone(),
        facts: shared.facts.clone(),
        changed: facts_changed,
        metrics: target_metrics,
        asked,
    };
    tokio::spawn(survey.run(
        shared.readiness.serving_watch("export targets"),
        shutdown.clone(),
    ));
    let hub = Hub::new(shared.index.clone(), metrics.clone());
    let watch = Watch {
        api: scope.api::<Artifact>(&client),
        // Every shard's webhook answers for the Artifacts of all shards.
        config: scope.whole(),
        slim: without_managed_fields,
        // The mirror reads its Artifacts from the owner index.
        keep: |artifact| !crate::mirror::is_mirrored(artifact),
        what: "Artifacts".to_string(),
        hint: "is the openflux.dev CRD installed? `openflux crds | kubectl apply -f -`",
        turns: ctx.list_turns.clone(),
        rejects: ctx.rejects.clone(),
    };
    let artifact_hub = hub.clone();
    let watch = tokio::spawn(watch.run(
        Some(artifacts),
        shared.readiness.serving_watch("Artifacts"),
        move |change| artifact_hub.take(Event::Artifact(change)),
        shutdown.clone(),
    ));
    let health = spawn_service(
        endpoints.serve(
            shared.registry.clone(),
            shared.readiness.clone(),
            shutdown.clone(),
        ),
        shutdown.clone(),
    );

    let leader_election = &runtime.leader_election;
    let leading = Leading {
        kept: (ctx, export, references),
        facts_seen,
        hub,
        scope,
        gate_metrics,
        metrics: metrics.clone(),
        concurrency: runtime.concurrent,
        readiness: shared.readiness.clone(),
        terms,
    };
    match leader_election.enable_leader_election {
        true => {
            let elector = Elector::new(
                client.clone(),
                runtime.watch.runtime_namespace()?,
                &args.lease_name(),
                leader_election,
            );
            campaign(&elector, &leading, &shutdown, leader_election).await;
        }
        false => {
            let controllers = leading.start(shutdown.clone());
            shutdown.cancelled().await;
            stop_controllers(controllers, false).await;
        }
    }
    let _ = watch.await;
    let health = match tokio::time::timeout(SERVER_STOP_GRACE, health).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(anyhow::anyhow!("health endpoints ended abnormally: {e}")),
        Err(_) => {
            tracing::warn!("health endpoints did not stop in time");
            Ok(())
        }
    };
    match extra.await {
        Ok(Err(e)) => return Err(e),
        Err(e) => tracing::error!(error = %e, "service ended abnormally"),
        Ok(Ok(())) => {}
    }
    health?;
    tracing::info!("openflux stopped");
    Ok(())
}

/// What the leader runs, started anew each time this replica wins the Lease.
struct Leading {
    kept: controllers::Kept,
    /// Changes of the export targets (the survey runs on every replica).
    facts_seen: tokio::sync::watch::Receiver<u64>,
    hub: Hub,
    scope: Scope,
    gate_metrics: GateMetrics,
    metrics: Metrics,
    concurrency: u16,
    readiness: Arc<Readiness>,
    /// Tells the rest of the process which term is current.
    terms: tokio::sync::watch::Sender<Option<CancellationToken>>,
}

impl Leading {
    /// Starts the controllers and the gate check until `term` is cancelled.
    fn start(&self, term: CancellationToken) -> JoinHandle<()> {
        self.metrics.leader.set(1);
        self.terms.send_replace(Some(term.clone()));
        let mut controllers = Controllers::new(
            self.kept.clone(),
            self.facts_seen.clone(),
            self.hub.clone(),
            self.scope.clone(),
            self.concurrency,
            self.readiness.clone(),
            term.clone(),
        );
        // The gate check reads the consumers the leader watches.
        let consumers = controllers.consumers();
        controllers.also(gate::run(
            move |c| consumers.objects(c),
            self.gate_metrics.clone(),
            GATE_CHECK_PERIOD,
            term,
        ));
        tokio::spawn(controllers.run())
    }
}

/// Stops the controllers of a term. When the Lease was lost another replica
/// may lead already, so every task of the term is aborted at once, not
/// drained: no write of this term starts after that (a write already sent
/// cannot be called back). At shutdown, with the Lease still held, waits
/// (bounded) for them to finish what they were doing.
/// Runs `service` in a task of its own; one that fails stops the process
/// (cancels `shutdown`) and hands its error back through the task.
fn spawn_service(
    service: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    shutdown: CancellationToken,
) -> JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let result = service.await;
        if result.is_err() {
            shutdown.cancel();
        }
        result
    })
}

async fn stop_controllers(mut controllers: JoinHandle<()>, lease_lost: bool) {
    if lease_lost {
        // The leader's task owns every task it started (a JoinSet, the
        // export controller's abort-on-drop handle): aborting it aborts them.
        controllers.abort();
        let _ = controllers.await;
        return;
    }
    match tokio::time::timeout(CONTROLLERS_STOP_GRACE, &mut controllers).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "controllers ended abnormally"),
        Err(_) => {
            tracing::warn!(grace = ?CONTROLLERS_STOP_GRACE, "controllers did not stop in time; aborting them");
            controllers.abort();
        }
    }
}

/// Takes part in the leader election until shutdown: runs the controllers
/// while leading; when the Lease is lost, stops them (the watches feeding
/// the webhook and the webhook itself keep running) and campaigns again.
/// At shutdown, gives the Lease up once the controllers stopped.
async fn campaign(
    elector: &Elector,
    leading: &Leading,
    shutdown: &CancellationToken,
    args: &LeaderElectionArgs,
) {
    tracing::info!(
        identity = elector.identity(),
        "attempting to acquire the leader lease"
    );
    loop {
        tokio::select! {
            () = elector.acquire() => {}
            () = shutdown.cancelled() => return,
        }
        let term = shutdown.child_token();
        let controllers = leading.start(term.clone());
        let lost = tokio::select! {
            lost = elector.keep() => Some(lost),
            () = shutdown.cancelled() => None,
        };
        term.cancel();
        leading.metrics.leader.set(0);
        if let Some(lost) = &lost {
            tracing::error!(error = %lost, "stopping the controllers; the webhook keeps serving");
        }
        stop_controllers(controllers, lost.is_some()).await;
        if lost.is_none() {
            if args.leader_election_release_on_cancel {
                elector.release().await;
            }
            return;
        }
        tracing::info!(
            identity = elector.identity(),
            "rejoining the leader election"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts forever, one tick a millisecond.
    async fn count(ticks: Arc<AtomicU64>) {
        let mut every = tokio::time::interval(Duration::from_millis(1));
        loop {
            every.tick().await;
            ticks.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_stops_every_task_of_the_term_at_once() {
        let (in_set, owned) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (a, b) = (in_set.clone(), owned.clone());
        // A term as the leader runs one: tasks in its JoinSet, the export
        // controller behind an abort-on-drop handle, and a loop that does
        // not stop on its own.
        let term = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            tasks.spawn(count(a));
            let _export = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(count(b)));
            std::future::pending::<()>().await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(in_set.load(Ordering::SeqCst) > 0 && owned.load(Ordering::SeqCst) > 0);
        let started = tokio::time::Instant::now();
        stop_controllers(term, true).await;
        assert!(started.elapsed() < CONTROLLERS_STOP_GRACE, "not drained");
        let (x, y) = (in_set.load(Ordering::SeqCst), owned.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            in_set.load(Ordering::SeqCst),
            x,
            "the JoinSet's tasks stopped"
        );
        assert_eq!(owned.load(Ordering::SeqCst), y, "the owned task stopped");
    }
}
