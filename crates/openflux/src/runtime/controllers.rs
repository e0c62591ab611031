//! The controllers of the elected leader: a mirror for every stock source
//! kind the cluster serves (kinds whose CRDs appear later are picked up),
//! the export controller, and the wakes the router decided on, handed to
//! them. One task owns all of it, so nothing here is shared or locked.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedSender};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::router::{Event, Wake};
use super::watch::{without_managed_fields, Hub, Scope, Watch};
use crate::api::{Artifact, StockSource, STOCK_SOURCES};
use crate::controller::Context;
use crate::export::{self, ExportTarget};
use crate::mirror::{self, Mirror};
use crate::telemetry::Readiness;

/// How often the leader looks for source kinds the cluster did not serve yet.
pub const DISCOVERY_PERIOD: Duration = Duration::from_secs(10);

/// A running mirror: where its sources are, and how to wake it.
struct Mirrored {
    resource: ApiResource,
    sources: Store<DynamicObject>,
    wake: UnboundedSender<ObjectRef<DynamicObject>>,
}

/// The running export controller.
struct Exporting {
    wake: UnboundedSender<ObjectRef<Artifact>>,
    /// Whether it runs with the export target (or only reports it missing).
    has_target: bool,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Everything the leader runs.
pub struct Controllers {
    ctx: Arc<Context>,
    hub: Hub,
    scope: Scope,
    concurrency: u16,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
    mirrors: HashMap<&'static str, Mirrored>,
    export: Option<Exporting>,
    target: Option<ExportTarget>,
    reported_missing: BTreeSet<&'static str>,
    tasks: JoinSet<()>,
}

impl Controllers {
    pub fn new(
        ctx: Arc<Context>,
        hub: Hub,
        scope: Scope,
        concurrency: u16,
        readiness: Arc<Readiness>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            ctx,
            hub,
            scope,
            concurrency,
            readiness,
            shutdown,
            mirrors: HashMap::new(),
            export: None,
            target: None,
            reported_missing: BTreeSet::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Runs until shutdown, then waits for every controller to stop.
    pub async fn run(mut self) {
        let mut wakes = self.hub.subscribe();
        let mut discovery = tokio::time::interval(DISCOVERY_PERIOD);
        discovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let everything_found = self.mirrors.len() == STOCK_SOURCES.len();
            tokio::select! {
                _ = discovery.tick(), if !everything_found => self.discover().await,
                batch = wakes.recv() => match batch {
                    Ok(batch) => self.wake(&batch),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "fell behind the watches; looking at every object again");
                        self.wake_everything();
                    }
                    Err(RecvError::Closed) => break,
                },
                _ = self.shutdown.cancelled() => break,
            }
        }
        if let Some(export) = self.export.take() {
            let _ = export.task.await;
        }
        while self.tasks.join_next().await.is_some() {}
    }

    /// Starts a mirror for each stock kind the cluster serves now, and the
    /// export controller once the first pass knows whether its target is
    /// served (again when the target appears later).
    async fn discover(&mut self) {
        for stock in STOCK_SOURCES.iter() {
            if self.mirrors.contains_key(stock.kind) {
                continue;
            }
            let Some(resource) = mirror::discover(&self.ctx.client, stock).await else {
                if self.reported_missing.insert(stock.kind) {
                    tracing::info!(kind = stock.kind, "source kind not served by this cluster (CRD not installed); skipping until it appears");
                }
                continue;
            };
            tracing::info!(kind = stock.kind, version = %resource.version, "mirroring source kind");
            if *stock == StockSource::EXTERNAL_ARTIFACT {
                self.target = Some(self.watch_exports(&resource));
            }
            self.start_mirror(stock, resource);
        }
        match &self.export {
            None => self.start_export(),
            Some(running) if !running.has_target && self.target.is_some() => {
                if let Some(old) = self.export.take() {
                    old.stop.cancel();
                    let _ = old.task.await;
                }
                self.start_export();
            }
            Some(_) => {}
        }
    }

    fn start_mirror(&mut self, stock: &'static StockSource, resource: ApiResource) {
        let writer = Writer::<DynamicObject>::new(resource.clone());
        let sources = writer.as_reader();
        let hub = self.hub.clone();
        let watch = Watch {
            api: self.scope.dynamic_api(&self.ctx.client, &resource),
            config: self.scope.config(),
            // The mirror needs a source's identity and status.artifact only;
            // keeping nothing else keeps memory flat with thousands of sources.
            slim: mirror::slim,
            what: format!("{} sources", stock.kind),
            hint: "can openflux list and watch this kind? see its ClusterRole",
        };
        self.tasks.spawn(watch.run(
            writer,
            self.readiness.watch_started(),
            move |change| hub.take(Event::Source(stock, change)),
            self.shutdown.clone(),
        ));
        let (wake, triggers) = unbounded();
        let mirror = Mirror {
            source: stock,
            resource: resource.clone(),
        };
        self.tasks.spawn(mirror.run(
            self.ctx.clone(),
            sources.clone(),
            triggers,
            self.concurrency,
            self.shutdown.clone().cancelled_owned(),
        ));
        let mirrored = Mirrored {
            resource,
            sources,
            wake,
        };
        self.mirrors.insert(stock.kind, mirrored);
    }

    /// Watches the objects openflux exported, so the export controller sees
    /// their drift and deletion and compares without asking the API server.
    fn watch_exports(&mut self, resource: &ApiResource) -> ExportTarget {
        let writer = Writer::<DynamicObject>::new(resource.clone());
        let exports = writer.as_reader();
        let hub = self.hub.clone();
        let watch = Watch {
            api: self.scope.dynamic_api(&self.ctx.client, resource),
            config: watcher::Config::default()
                .labels(&export::managed_selector())
                .any_semantic(),
            slim: without_managed_fields,
            what: "exported objects".to_string(),
            hint: "can openflux list and watch ExternalArtifacts? see its ClusterRole",
        };
        self.tasks.spawn(watch.run(
            writer,
            self.readiness.watch_started(),
            move |change| hub.take(Event::Exported(change)),
            self.shutdown.clone(),
        ));
        ExportTarget {
            resource: resource.clone(),
            exports,
        }
    }

    fn start_export(&mut self) {
        let (wake, triggers) = unbounded();
        let stop = self.shutdown.child_token();
        let task = tokio::spawn(export::run(
            self.ctx.clone(),
            self.target.clone(),
            triggers,
            self.concurrency,
            stop.clone().cancelled_owned(),
        ));
        let running = Exporting {
            wake,
            has_target: self.target.is_some(),
            stop,
            task,
        };
        // What changed before this start woke nobody: look at every Artifact
        // once. Artifacts the watch has not listed yet come with its list.
        for artifact in self.ctx.artifacts.state() {
            let _ = running.wake.unbounded_send(ObjectRef::from(&*artifact));
        }
        self.export = Some(running);
    }

    /// Hands each wake to the controller it names; a controller that does
    /// not run (yet) looks at everything when it starts.
    fn wake(&self, batch: &[Wake]) {
        for wake in batch {
            match wake {
                Wake::Export(key) => {
                    if let Some(export) = &self.export {
                        let artifact = ObjectRef::new(&key.name).within(&key.namespace);
                        let _ = export.wake.unbounded_send(artifact);
                    }
                }
                Wake::Mirror {
                    source,
                    namespace,
                    name,
                } => {
                    if let Some(mirror) = self.mirrors.get(source) {
                        let source =
                            ObjectRef::new_with(name, mirror.resource.clone()).within(namespace);
                        let _ = mirror.wake.unbounded_send(source);
                    }
                }
            }
        }
    }

    /// Wakes every controller for every object it keeps.
    fn wake_everything(&self) {
        if let Some(export) = &self.export {
            for artifact in self.ctx.artifacts.state() {
                let _ = export.wake.unbounded_send(ObjectRef::from(&*artifact));
            }
        }
        for mirror in self.mirrors.values() {
            for source in mirror.sources.state() {
                let _ = mirror
                    .wake
                    .unbounded_send(ObjectRef::from_obj_with(&*source, mirror.resource.clone()));
            }
        }
    }
}
