//! The controllers of the elected leader: a mirror for every stock source
//! kind the cluster serves (kinds whose CRDs appear later are picked up), the
//! export controller with a watch of each export target served, the
//! consumers' watches and re-pointing ([`crate::consumers::controller`]), and the wakes
//! the router decided on. One task owns it all: nothing is shared or locked.

mod dispatch;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::StreamExt;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::hub::Hub;
use super::router::Event;
use crate::adopt;
use crate::api::{StockSource, STOCK_SOURCES};
use crate::cluster::target::Target;
use crate::consumers::controller::{Consumers, Look, Sinks};
use crate::consumers::references::References;
use crate::consumers::repoint::ObjectKey;
use crate::control::{Context, WakeHandle};
use crate::export::release::target_resource;
use crate::export::{self, ServedTarget, ServedTargets};
use crate::locks;
use crate::mirror::{self, Backlog, DiscoveryError, Mirror, SourceKind, Sources};
use crate::telemetry::Readiness;
use crate::watch::run::Watch;
use crate::watch::{keep_all, without_managed_fields, Scope};

/// How often the leader looks for source kinds the cluster did not serve yet.
pub const DISCOVERY_PERIOD: Duration = Duration::from_secs(10);

/// The running export controller.
struct Exporting {
    wake: export::Waker,
    /// The export targets it runs with.
    targets: BTreeSet<Target>,
    stop: CancellationToken,
    /// Owned by the leader: aborted when the leader's task ends or drops it.
    task: AbortOnDropHandle<()>,
}

type Channel<T> = (UnboundedSender<T>, UnboundedReceiver<T>);

/// What one discovery round found: each stock kind not mirrored yet, and
/// the resource it is served as (`None`: not served), or why that is unknown.
type Found = Vec<(
    &'static StockSource,
    Result<Option<ApiResource>, DiscoveryError>,
)>;

/// What the controllers keep from one term to the next, built once by the
/// wiring: their context, the export's own state, the consumers' references.
pub type Kept = (Arc<Context>, Arc<export::Kept>, Arc<RwLock<References>>);

/// Everything the leader runs.
pub struct Controllers {
    ctx: Arc<Context>,
    export_kept: Arc<export::Kept>,
    facts_seen: tokio::sync::watch::Receiver<u64>,
    hub: Hub,
    scope: Scope,
    concurrency: u16,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
    /// The running mirrors' wake handles, by stock kind.
    mirrors: HashMap<&'static str, mirror::Waker>,
    export: Option<Exporting>,
    targets: ServedTargets,
    reported_missing: BTreeSet<&'static str>,
    consumers: Consumers,
    /// Open Flux Artifact API groups being adopted.
    adopting: BTreeSet<&'static str>,
    /// Asks the re-pointing worker to look at a consumer.
    look: UnboundedSender<Look>,
    /// What the re-pointing worker takes when the leader starts it.
    looks: Option<UnboundedReceiver<Look>>,
    freed: Channel<Vec<ObjectKey>>,
    found: Channel<Found>,
    /// A discovery round is running.
    discovering: bool,
    /// Every task the leader starts: aborted, not detached, when the term
    /// ends (dropping a JoinSet aborts its tasks).
    tasks: JoinSet<()>,
}

impl Controllers {
    pub fn new(
        (ctx, export_kept, references): Kept,
        facts_seen: tokio::sync::watch::Receiver<u64>,
        hub: Hub,
        scope: Scope,
        concurrency: u16,
        readiness: Arc<Readiness>,
        shutdown: CancellationToken,
    ) -> Self {
        let (look, looks) = unbounded();
        Self {
            ctx,
            export_kept,
            facts_seen,
            hub,
            scope,
            concurrency,
            readiness,
            shutdown,
            mirrors: HashMap::new(),
            export: None,
            targets: ServedTargets::new(),
            reported_missing: BTreeSet::new(),
            consumers: Consumers::new(references),
            adopting: BTreeSet::new(),
            look,
            looks: Some(looks),
            freed: unbounded(),
            found: unbounded(),
            discovering: false,
            tasks: JoinSet::new(),
        }
    }

    /// The consumer kinds the leader watches, and their stores.
    pub fn consumers(&self) -> Consumers {
        self.consumers.clone()
    }

    /// Runs `task` as a task of this term: aborted with the others.
    pub fn also(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Runs until shutdown, then waits for every controller to stop.
    ///
    /// The loop itself awaits no API call: discovery, re-pointing and every
    /// controller run as tasks the leader owns, and report back here.
    pub async fn run(mut self) {
        let mut wakes = self.hub.subscribe();
        let mut discovery = tokio::time::interval(DISCOVERY_PERIOD);
        discovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if let Some(looks) = self.looks.take() {
            self.tasks.spawn(self.consumers.clone().repoint_all(
                self.ctx.clone(),
                looks,
                self.look.clone(),
                self.shutdown.clone(),
            ));
        }
        loop {
            tokio::select! {
                _ = discovery.tick() => self.start_discovery(),
                Some(found) = self.found.1.next() => {
                    self.discovering = false;
                    self.discovered(found);
                    self.follow_targets();
                }
                changed = self.facts_seen.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    // New export targets (and maybe newly served source
                    // kinds): export every Artifact anew, and move every
                    // consumer that should move.
                    self.start_discovery();
                    self.follow_targets();
                    self.wake_everything();
                }
                Some(freed) = self.freed.1.next() => self.wake_owners_of(&freed),
                batch = wakes.recv() => self.wake(&batch),
                _ = self.shutdown.cancelled() => break,
            }
        }
        if let Some(export) = self.export.take() {
            let _ = export.task.await;
        }
        while self.tasks.join_next().await.is_some() {}
    }

    /// Looks, in a task of its own, for the stock source kinds not mirrored
    /// yet; [`Self::discovered`] takes what it found.
    fn start_discovery(&mut self) {
        if self.discovering {
            return;
        }
        let missing: Vec<&'static StockSource> = STOCK_SOURCES
            .iter()
            .filter(|s| !self.mirrors.contains_key(s.kind))
            .collect();
        if missing.is_empty() {
            self.follow_targets();
            return;
        }
        self.discovering = true;
        let client = self.ctx.client.clone();
        let found = self.found.0.clone();
        self.tasks.spawn(async move {
            let mut out = Vec::with_capacity(missing.len());
            for stock in missing {
                out.push((stock, mirror::discover(&client, stock).await));
            }
            let _ = found.unbounded_send(out);
        });
    }

    /// Starts a mirror for each stock kind found served.
    fn discovered(&mut self, found: Found) {
        for (stock, served) in found {
            if self.mirrors.contains_key(stock.kind) {
                continue;
            }
            match served {
                Ok(Some(resource)) => {
                    tracing::info!(kind = stock.kind, version = %resource.version, "mirroring source kind");
                    self.start_mirror(stock, SourceKind::new(resource));
                }
                Ok(None) => {
                    if self.reported_missing.insert(stock.kind) {
                        tracing::info!(kind = stock.kind, "source kind not served by this cluster (CRD not installed); skipping until it appears");
                    }
                }
                Err(error) => {
                    tracing::error!(kind = stock.kind, %error, "cannot tell whether this source kind is served; not mirroring it until that works");
                }
            }
        }
    }

    /// Keeps a watch of each export target and consumer kind the survey
    /// found, and the export controller running with the served targets
    /// (started anew when they change).
    fn follow_targets(&mut self) {
        let (cluster, synced) = {
            let facts = locks::read(&self.ctx.facts);
            (facts.cluster.clone(), facts.synced)
        };
        if !synced {
            return;
        }
        let mut served = Vec::new();
        if cluster.external_artifact_served {
            served.push(Target::ExternalArtifact);
        }
        if let Some(version) = cluster.oci_repository {
            served.push(Target::Shadow(version));
        }
        for target in served {
            if !self.targets.contains_key(&target) {
                let resource = target_resource(target);
                let watched = self.watch_exports(&resource);
                self.consumers
                    .read_exports(&resource, watched.exports.clone());
                self.targets.insert(target, watched);
            }
        }
        self.adopt_open_flux();
        let sinks = Sinks {
            look: self.look.clone(),
            freed: self.freed.0.clone(),
        };
        self.consumers.start(
            (&self.ctx, &self.scope, &self.readiness),
            &sinks,
            &mut self.tasks,
            &self.shutdown,
        );
        let current: BTreeSet<Target> = self.targets.keys().copied().collect();
        match &self.export {
            Some(running) if running.targets == current => {}
            _ => {
                if let Some(old) = self.export.take() {
                    // Aborted, not drained: the new controller looks at
                    // every Artifact, so a reconcile cut short is redone.
                    old.stop.cancel();
                    drop(old);
                }
                self.start_export();
            }
        }
    }

    /// Starts adopting the Artifacts of each Open Flux Artifact API the
    /// cluster serves (see [`crate::adopt::plan`]).
    fn adopt_open_flux(&mut self) {
        let served = adopt::served_groups(&locks::read(&self.ctx.facts));
        for group in served {
            if !self.adopting.insert(group) {
                continue;
            }
            let name = format!("Open Flux Artifacts ({group})");
            self.tasks.spawn(adopt::run(
                self.ctx.clone(),
                group,
                self.scope.clone(),
                self.readiness.controller_watch(&name),
                self.shutdown.clone(),
            ));
        }
    }

    fn start_mirror(&mut self, stock: &'static StockSource, resource: SourceKind) {
        let sources = Sources::default();
        let keeper = sources.clone();
        let hub = self.hub.clone();
        let watch = Watch {
            api: self.scope.api_with(&self.ctx.client, &resource),
            config: self.scope.config(),
            slim: |_| {},
            keep: keep_all,
            what: format!("{} sources", stock.kind),
            hint: "can openflux list and watch this kind? see its ClusterRole",
            turns: self.ctx.list_turns.clone(),
            rejects: self.ctx.rejects.clone(),
        };
        let synced = self.readiness.controller_watch(&watch.what);
        // The mirror keeps its own store (what it reads of each source), so
        // the watch keeps none and hands every source on as it comes.
        self.tasks.spawn(watch.run(
            None,
            synced,
            move |change| keeper.take(change, |change| hub.take(Event::Source(stock, change))),
            self.shutdown.clone(),
        ));
        let backlog = Backlog::new(usize::from(self.concurrency));
        let mirror = Mirror {
            source: stock,
            resource,
        };
        self.tasks.spawn(mirror.run(
            self.ctx.clone(),
            sources.clone(),
            backlog.clone(),
            self.concurrency,
            self.shutdown.clone(),
        ));
        self.mirrors
            .insert(stock.kind, mirror::Waker::new(sources, backlog));
    }

    /// Watches the objects openflux exported, so the export controller sees
    /// their drift and deletion and compares without asking the API server.
    fn watch_exports(&mut self, resource: &ApiResource) -> ServedTarget {
        let writer = Writer::<DynamicObject>::new(resource.clone());
        let exports = writer.as_reader();
        let hub = self.hub.clone();
        let watch = Watch {
            api: self.scope.dynamic_api(&self.ctx.client, resource),
            config: crate::watch::streamed().labels(&export::managed_selector()),
            slim: without_managed_fields,
            keep: keep_all,
            what: "exported objects".to_string(),
            hint: "can openflux list and watch ExternalArtifacts and OCIRepositories? see its ClusterRole",
            turns: self.ctx.list_turns.clone(),
            rejects: self.ctx.rejects.clone(),
        };
        self.tasks.spawn(watch.run(
            Some(writer),
            self.readiness.controller_watch("exported objects"),
            move |change| hub.take(Event::Exported(change)),
            self.shutdown.clone(),
        ));
        ServedTarget {
            resource: resource.clone(),
            exports,
        }
    }

    fn start_export(&mut self) {
        let (wake, triggers) = export::Waker::channel(self.ctx.artifacts.clone());
        let stop = self.shutdown.child_token();
        let task = AbortOnDropHandle::new(tokio::spawn(export::run(
            self.ctx.clone(),
            self.export_kept.clone(),
            self.targets.clone(),
            triggers,
            self.concurrency,
            stop.clone().cancelled_owned(),
        )));
        let running = Exporting {
            wake,
            targets: self.targets.keys().copied().collect(),
            stop,
            task,
        };
        // What changed before this start woke nobody: look at every Artifact
        // once. Artifacts the watch has not listed yet come with its list.
        running.wake.every();
        self.export = Some(running);
    }
}
