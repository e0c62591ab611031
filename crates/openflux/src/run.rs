//! `openflux run`: the Artifact watch and owner index (every replica), the
//! health and metrics endpoints, and, on the elected leader, the mirror and
//! export controllers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedSender};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::api::{is_stock_source, Artifact, StockSource, STOCK_SOURCES};
use crate::controller::{Context, WriteMemo};
use crate::index::{IndexedArtifact, OwnerIndex};
use crate::leader::{Elector, LeaseTimings};
use crate::locks;
use crate::mirror::{self, Mirror};
use crate::telemetry::{self, Metrics, Readiness};

/// Flags of `openflux run`, named as Flux controllers name theirs.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Address the Prometheus metrics endpoint binds to.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Address the /healthz and /readyz endpoints bind to.
    #[arg(long, default_value = "0.0.0.0:9440")]
    pub health_addr: SocketAddr,
    /// Watch sources and Artifacts in all namespaces; when false, only in --namespace.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_all_namespaces: bool,
    /// The namespace openflux runs in (its leader Lease lives there).
    #[arg(long, env = "RUNTIME_NAMESPACE", default_value = "openflux-system")]
    pub namespace: String,
    /// Reconciles each controller runs at once.
    #[arg(long, default_value_t = 4)]
    pub concurrent: u16,
    /// Elect a leader among replicas before running the controllers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_leader_election: bool,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "openflux-leader-election")]
    pub leader_election_id: String,
    /// Log filter: error, warn, info, debug, trace, or a tracing directive.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log encoding: console or json.
    #[arg(long, default_value = "console", value_parser = ["console", "json"])]
    pub log_encoding: String,
}

/// The resource of a mirrored kind and the way to ask its mirror for a reconcile.
type MirrorTrigger = (ApiResource, UnboundedSender<ObjectRef<DynamicObject>>);

/// Where controllers wait for work coming from the Artifact watch.
#[derive(Default)]
struct Hub {
    mirrors: RwLock<HashMap<String, MirrorTrigger>>,
    export: RwLock<Option<UnboundedSender<Arc<Artifact>>>>,
}

impl Hub {
    fn send_export(&self, artifact: Arc<Artifact>) {
        if let Some(tx) = locks::read(&self.export).as_ref() {
            let _ = tx.unbounded_send(artifact);
        }
    }

    /// Routes one Artifact change to the controller that keeps it.
    fn dispatch(
        &self,
        artifact: &Artifact,
        deleted: bool,
        store: &Store<Artifact>,
        index: &RwLock<OwnerIndex>,
    ) {
        let Some(indexed) = IndexedArtifact::from_artifact(artifact) else {
            return;
        };
        match &indexed.owner {
            Some(owner) if is_stock_source(&owner.source.group, &owner.source.kind) => {
                if let Some((ar, tx)) = locks::read(&self.mirrors).get(&owner.source.kind) {
                    let r = ObjectRef::new_with(&owner.source.name, ar.clone())
                        .within(&owner.source.namespace);
                    let _ = tx.unbounded_send(r);
                }
            }
            owner => {
                if !deleted {
                    if let Some(a) = store.get(&ObjectRef::from(artifact)) {
                        self.send_export(a);
                    }
                }
                // The export name of siblings depends on how many there are.
                if let Some(owner) = owner {
                    let siblings: Vec<_> = locks::read(index)
                        .artifacts_of_owner_uid(&owner.uid)
                        .into_iter()
                        .map(|s| s.key.clone())
                        .collect();
                    for key in siblings.into_iter().filter(|k| k != &indexed.key) {
                        if let Some(a) =
                            store.get(&ObjectRef::new(&key.name).within(&key.namespace))
                        {
                            self.send_export(a);
                        }
                    }
                }
            }
        }
    }
}

/// Everything `run` sets up that the webhook needs too.
pub struct Shared {
    pub client: Client,
    pub index: Arc<RwLock<OwnerIndex>>,
    pub registry: Arc<Mutex<Registry>>,
    pub readiness: Arc<Readiness>,
    pub shutdown: CancellationToken,
}

/// Runs openflux until SIGTERM/SIGINT, or until leadership is lost.
/// `extra` starts further services (the webhook) beside the controllers.
pub async fn run<F, Fut>(args: RunArgs, client: Client, extra: F) -> anyhow::Result<()>
where
    F: FnOnce(&Shared) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let gate_metrics = crate::gate::GateMetrics::register(&mut registry);
    let registry = Arc::new(Mutex::new(registry));
    let readiness = Arc::new(Readiness::default());
    let index = Arc::new(RwLock::new(OwnerIndex::new()));
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());

    let shared = Shared {
        client: client.clone(),
        index: index.clone(),
        registry: registry.clone(),
        readiness: readiness.clone(),
        shutdown: shutdown.clone(),
    };
    // A service that cannot run (the webhook cannot bind, say) stops the
    // process with its error instead of leaving it half up.
    let extra = extra(&shared);
    let failed = shutdown.clone();
    let extra = tokio::spawn(async move {
        let result = extra.await;
        if result.is_err() {
            failed.cancel();
        }
        result
    });

    let (store, writer) = reflector::store::<Artifact>();
    let (artifacts_synced_tx, artifacts_synced) = tokio::sync::watch::channel(false);
    let hub = Arc::new(Hub::default());
    let artifacts: Api<Artifact> = if args.watch_all_namespaces {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), &args.namespace)
    };
    let watch = tokio::spawn(watch_artifacts(
        artifacts,
        writer,
        store.clone(),
        index.clone(),
        hub.clone(),
        metrics.clone(),
        readiness.watch_started(),
        artifacts_synced_tx,
        shutdown.clone(),
    ));

    let health = tokio::spawn(telemetry::serve(
        args.metrics_addr,
        args.health_addr,
        registry.clone(),
        readiness.clone(),
        shutdown.clone(),
    ));

    let ctx = Arc::new(Context {
        client: client.clone(),
        artifacts: store.clone(),
        index: index.clone(),
        metrics: metrics.clone(),
        export_target: RwLock::new(None),
        exports: RwLock::new(None),
        memo: WriteMemo::default(),
    });

    let elector = if args.enable_leader_election {
        let identity = identity();
        let elector = Elector::new(
            Api::<Lease>::namespaced(client.clone(), &args.namespace),
            &args.leader_election_id,
            &identity,
            LeaseTimings::default(),
        );
        tokio::select! {
            _ = elector.acquire() => {}
            _ = shutdown.cancelled() => {}
        }
        Some(elector)
    } else {
        None
    };

    let mut lost_leadership = false;
    if !shutdown.is_cancelled() {
        metrics.leader.set(1);
        tokio::spawn(crate::gate::run(
            client.clone(),
            (!args.watch_all_namespaces).then(|| args.namespace.clone()),
            gate_metrics,
            Duration::from_secs(60),
            shutdown.clone(),
        ));
        let controllers = tokio::spawn(run_controllers(
            args.clone(),
            ctx.clone(),
            hub.clone(),
            readiness.clone(),
            artifacts_synced.clone(),
            shutdown.clone(),
        ));
        match &elector {
            Some(elector) => {
                tokio::select! {
                    _ = elector.hold() => {
                        lost_leadership = true;
                        shutdown.cancel();
                    }
                    _ = shutdown.cancelled() => {}
                }
            }
            None => shutdown.cancelled().await,
        }
        if let Err(e) = controllers.await {
            tracing::error!(error = %e, "controllers ended abnormally");
        }
    }
    if let Some(elector) = &elector {
        if !lost_leadership {
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

/// This replica's identity in the leader election.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "openflux".to_string());
    format!("{host}_{}", std::process::id())
}

#[allow(clippy::too_many_arguments)]
async fn watch_artifacts(
    api: Api<Artifact>,
    mut writer: reflector::store::Writer<Artifact>,
    store: Store<Artifact>,
    index: Arc<RwLock<OwnerIndex>>,
    hub: Arc<Hub>,
    metrics: Metrics,
    mut synced: telemetry::SyncGuard,
    synced_tx: tokio::sync::watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let mut events = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|a: &mut Artifact| a.metadata.managed_fields = None)
        .boxed();
    let mut warned = false;
    loop {
        let event = tokio::select! {
            e = events.try_next() => e,
            _ = shutdown.cancelled() => return,
        };
        let event = match event {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => {
                if !warned {
                    tracing::warn!(error = %e, "watching Artifacts failed (is the openflux.dev CRD installed? `openflux crds | kubectl apply -f -`); retrying");
                    warned = true;
                }
                continue;
            }
        };
        warned = false;
        writer.apply_watcher_event(&event);
        {
            let mut idx = locks::write(&index);
            idx.apply_event(&event);
            metrics.indexed_artifacts.set(idx.len() as i64);
        }
        match &event {
            watcher::Event::Apply(a) => hub.dispatch(a, false, &store, &index),
            watcher::Event::Delete(a) => hub.dispatch(a, true, &store, &index),
            watcher::Event::InitDone => {
                synced.synced();
                synced_tx.send_replace(true);
                // After a restart, look at everything once more.
                for a in store.state() {
                    hub.dispatch(&a, false, &store, &index);
                }
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

/// Runs on the leader: finds the Flux source kinds the cluster serves,
/// starts a mirror for each (and picks up kinds whose CRDs appear later),
/// and runs the export controller.
async fn run_controllers(
    args: RunArgs,
    ctx: Arc<Context>,
    hub: Arc<Hub>,
    readiness: Arc<Readiness>,
    artifacts_synced: tokio::sync::watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let mut tasks = Vec::new();
    let mut export_started = false;
    let mut started: HashMap<&'static str, ()> = HashMap::new();
    let mut reported_missing: HashMap<&'static str, ()> = HashMap::new();
    loop {
        for kind in STOCK_SOURCES.iter() {
            if started.contains_key(kind.kind) {
                continue;
            }
            match mirror::discover(&ctx.client, kind).await {
                Some(ar) => {
                    started.insert(kind.kind, ());
                    tracing::info!(kind = kind.kind, version = %ar.version, "mirroring source kind");
                    if *kind == StockSource::EXTERNAL_ARTIFACT {
                        start_export_watch(&args, &ctx, &hub, &ar, &readiness, &shutdown);
                        if export_started {
                            // The export target appeared late: look again.
                            for a in ctx.artifacts.state() {
                                hub.send_export(a);
                            }
                        }
                    }
                    let (tx, rx) = unbounded();
                    locks::write(&hub.mirrors).insert(kind.kind.to_string(), (ar.clone(), tx));
                    let api: Api<DynamicObject> = if args.watch_all_namespaces {
                        Api::all_with(ctx.client.clone(), &ar)
                    } else {
                        Api::namespaced_with(ctx.client.clone(), &args.namespace, &ar)
                    };
                    let m = Mirror {
                        source: kind,
                        resource: ar,
                    };
                    tasks.push(tokio::spawn(m.run(
                        ctx.clone(),
                        api,
                        rx,
                        args.concurrent,
                        readiness.watch_started(),
                        shutdown.clone().cancelled_owned(),
                    )));
                }
                None => {
                    if reported_missing.insert(kind.kind, ()).is_none() {
                        tracing::info!(kind = kind.kind, "source kind not served by this cluster (CRD not installed); skipping until it appears");
                    }
                }
            }
        }
        // The export controller starts once the first discovery pass found
        // (or not) the export target, so nothing waits on a stale answer.
        if !export_started {
            export_started = true;
            start_export_controller(
                &args,
                &ctx,
                &hub,
                artifacts_synced.clone(),
                &shutdown,
                &mut tasks,
            );
        }
        if started.len() == STOCK_SOURCES.len() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// Starts the export controller and gives every known Artifact a first look
/// once the Artifact watch has synced.
fn start_export_controller(
    args: &RunArgs,
    ctx: &Arc<Context>,
    hub: &Arc<Hub>,
    mut artifacts_synced: tokio::sync::watch::Receiver<bool>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    let (export_tx, export_rx) = unbounded();
    *locks::write(&hub.export) = Some(export_tx);
    tasks.push(tokio::spawn(crate::export::run(
        ctx.clone(),
        ctx.artifacts.clone(),
        export_rx,
        args.concurrent,
        shutdown.clone().cancelled_owned(),
    )));
    let store = ctx.artifacts.clone();
    let first_look = hub.clone();
    tokio::spawn(async move {
        if artifacts_synced.wait_for(|synced| *synced).await.is_ok() {
            for a in store.state() {
                first_look.send_export(a);
            }
        }
    });
}

/// Watches the objects openflux exported, so the export controller sees
/// their drift and deletion, and can compare without asking the API server.
fn start_export_watch(
    args: &RunArgs,
    ctx: &Arc<Context>,
    hub: &Arc<Hub>,
    ar: &ApiResource,
    readiness: &Arc<Readiness>,
    shutdown: &CancellationToken,
) {
    *locks::write(&ctx.export_target) = Some(ar.clone());
    let api: Api<DynamicObject> = if args.watch_all_namespaces {
        Api::all_with(ctx.client.clone(), ar)
    } else {
        Api::namespaced_with(ctx.client.clone(), &args.namespace, ar)
    };
    let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    *locks::write(&ctx.exports) = Some(writer.as_reader());
    let wc = watcher::Config::default()
        .labels(&crate::export::managed_selector())
        .any_semantic();
    let ctx = ctx.clone();
    let hub = hub.clone();
    let mut synced = readiness.watch_started();
    let shutdown = shutdown.clone();
    let reader = writer.as_reader();
    tokio::spawn(async move {
        let mut writer = writer;
        let mut events = watcher(api, wc)
            .default_backoff()
            .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None)
            .boxed();
        loop {
            let event = tokio::select! {
                e = events.try_next() => e,
                _ = shutdown.cancelled() => return,
            };
            let event = match event {
                Ok(Some(e)) => e,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "watching exported objects failed; retrying");
                    continue;
                }
            };
            writer.apply_watcher_event(&event);
            let touched: Vec<DynamicObject> = match event {
                watcher::Event::Apply(o) | watcher::Event::Delete(o) => vec![o],
                watcher::Event::InitDone => {
                    synced.synced();
                    reader.state().iter().map(|o| (**o).clone()).collect()
                }
                _ => vec![],
            };
            for o in touched {
                let ns = o.namespace().unwrap_or_default();
                for owner in o.metadata.owner_references.iter().flatten() {
                    if owner.kind == crate::api::KIND
                        && owner.api_version == crate::api::API_VERSION
                    {
                        if let Some(a) = ctx.artifacts.get(&ObjectRef::new(&owner.name).within(&ns))
                        {
                            hub.send_export(a);
                        }
                    }
                }
            }
        }
    });
}
