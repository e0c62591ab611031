//! The mirror controller: one Artifact for every stock Flux source that has
//! an artifact in its status.
//!
//! The Artifact is named after the source's kind and name, controlled by the
//! source (so garbage collection removes it with the source), and written by
//! server-side apply only when it differs from what the source says. That
//! apply is the only write: a mirrored Artifact has no status (it is a copy
//! of its source's, whose own `Ready` tells whether it is usable; kstatus
//! reads an object without conditions as current), so a new source costs one
//! API write and so does each new revision. [`plan`] decides; this module
//! runs the controller that writes what it decided.

pub mod plan;
pub mod source;

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{DeleteParams, Patch, Preconditions};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, Controller};
use kube::{Client, ResourceExt};
use openflux_api::runtime::{ControllerId, ControllerMetrics, Retries};

pub use plan::{fingerprint, is_mirrored, is_own_export, plan, slim, InvalidSource, Plan};
pub use source::{FluxSource, SourceKind};

use crate::api::{Artifact, StockSource, FLUX_SOURCE_GROUP};
use crate::context::{apply_params, reconcile_result, Context, Error};
use crate::locks;
use crate::telemetry::KindLabels;

/// Finds the first version of `kind` the API server serves.
pub async fn discover(client: &Client, kind: &StockSource) -> Option<ApiResource> {
    for version in kind.versions {
        let gv = format!("{FLUX_SOURCE_GROUP}/{version}");
        let Ok(list) = client.list_api_group_resources(&gv).await else {
            continue;
        };
        if list
            .resources
            .iter()
            .any(|r| r.kind == kind.kind && r.name == kind.plural)
        {
            let gvk = GroupVersionKind::gvk(FLUX_SOURCE_GROUP, version, kind.kind);
            return Some(ApiResource::from_gvk_with_plural(&gvk, kind.plural));
        }
    }
    None
}

/// One mirror controller for one source kind.
pub struct Mirror {
    pub source: &'static StockSource,
    pub resource: SourceKind,
}

impl Mirror {
    /// Runs until `shutdown`, reconciling each source `triggers` names.
    /// `sources` is the store the watch of this kind keeps (slimmed by
    /// [`slim`]); the controller waits until that watch listed everything.
    pub async fn run(
        self,
        ctx: Arc<Context>,
        sources: Store<FluxSource>,
        triggers: impl futures::Stream<Item = ObjectRef<FluxSource>> + Send + 'static,
        concurrency: u16,
        shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    ) {
        let stock = self.source;
        let kind = stock.kind;
        let ar = self.resource.clone();
        let metrics = ctx
            .metrics
            .reconciles
            .controller(&controller_id(stock), concurrency);
        // Every trigger comes from the router; the controller's own stream
        // stays empty.
        let nothing = futures::stream::pending::<Result<FluxSource, watcher::Error>>();
        let retries = Arc::new(Retries::new(ctx.retry));
        let failed = retries.clone();
        Controller::for_stream_with(nothing, sources, self.resource)
            .with_config(ControllerConfig::default().concurrency(concurrency))
            .reconcile_on(triggers)
            .graceful_shutdown_on(shutdown)
            .run(
                move |source, ctx| {
                    let retries = retries.clone();
                    let metrics = metrics.clone();
                    let ar = ar.clone();
                    async move {
                        let key = (source.namespace().unwrap_or_default(), source.name_any());
                        let result = reconcile(source, ctx, stock, ar, metrics).await;
                        if result.is_ok() {
                            retries.succeeded(&key);
                        }
                        result
                    }
                },
                move |source, error, _ctx| {
                    let key = (source.namespace().unwrap_or_default(), source.name_any());
                    let delay = failed.failed(key);
                    tracing::warn!(kind, name = %source.name_any(), namespace = source.namespace().unwrap_or_default(), %error, retry_in = ?delay, "mirror reconcile failed");
                    Action::requeue(delay)
                },
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
            .await;
        tracing::info!(kind, "mirror controller stopped");
    }
}

#[tracing::instrument(skip_all, fields(kind = stock.kind, namespace = source.namespace().unwrap_or_default(), name = %source.name_any()))]
async fn reconcile(
    source: Arc<FluxSource>,
    ctx: Arc<Context>,
    stock: &'static StockSource,
    ar: SourceKind,
    metrics: ControllerMetrics,
) -> Result<Action, Error> {
    // Counted per controller only: a mirrored Artifact is a copy of a Flux
    // source, which source-controller already records, and a series per
    // object would grow with every source in the cluster.
    let mut guard = metrics.reconcile_unlabelled();
    let result = reconcile_inner(&source, &ctx, stock, &ar).await;
    guard.set_result(reconcile_result(&result));
    result
}

/// The mirror of one source kind, as its reconcile metrics name it:
/// `gitrepository-mirror`, ...
pub fn controller_id(stock: &StockSource) -> ControllerId {
    ControllerId {
        name: format!("{}-mirror", stock.kind.to_ascii_lowercase()),
        group: FLUX_SOURCE_GROUP.to_string(),
        kind: stock.kind.to_string(),
    }
}

async fn reconcile_inner(
    source: &FluxSource,
    ctx: &Context,
    stock: &'static StockSource,
    ar: &SourceKind,
) -> Result<Action, Error> {
    let namespace = source.namespace().ok_or(Error::MissingField("namespace"))?;
    match plan(stock, &ar.0.api_version, source) {
        Err(invalid) => {
            // Not retried: the source must change first.
            tracing::warn!(error = %invalid, "not mirroring");
        }
        Ok(Plan::Skip) => {}
        Ok(Plan::Remove { name }) => remove(ctx, source, &namespace, &name).await?,
        Ok(Plan::Mirror(desired)) => write(ctx, stock, &namespace, &desired).await?,
    }
    Ok(Action::await_change())
}

/// Deletes the Artifact `name` if `source` controls it.
async fn remove(
    ctx: &Context,
    source: &FluxSource,
    namespace: &str,
    name: &str,
) -> Result<(), Error> {
    let source_uid = source.uid().unwrap_or_default();
    let uid = {
        let index = locks::read(&ctx.index);
        let Some(current) = index.artifact(namespace, name) else {
            return Ok(());
        };
        let ours = current
            .owner
            .as_ref()
            .is_some_and(|o| *o.uid == *source_uid);
        if !ours {
            return Ok(());
        }
        current.uid.to_string()
    };
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match ctx.artifact_api(namespace).delete(name, &dp).await {
        Ok(_) => {
            tracing::info!(artifact = %name, "source has no artifact any more; deleted its Artifact")
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.memo.forget(&format!("artifact/{namespace}/{name}"));
    Ok(())
}

/// What the owner index says of the stored Artifact `name`: whether it is
/// the mirror of `desired`'s fingerprint, and the resource version to
/// remember a write against (none when absent, or not a mirror at all).
enum Stored {
    UpToDate,
    Differs(Option<String>),
    Foreign,
}

fn stored(ctx: &Context, namespace: &str, name: &str, wanted: u64) -> Stored {
    let index = locks::read(&ctx.index);
    match index.artifact(namespace, name).map(|a| a.mirrored.as_ref()) {
        None => Stored::Differs(None),
        Some(None) => Stored::Foreign,
        Some(Some(m)) if m.fingerprint == wanted => Stored::UpToDate,
        Some(Some(m)) => Stored::Differs(m.resource_version.as_deref().map(str::to_string)),
    }
}

/// Applies `desired` unless the Artifact already says it.
async fn write(
    ctx: &Context,
    stock: &'static StockSource,
    namespace: &str,
    desired: &Artifact,
) -> Result<(), Error> {
    let name = desired.name_any();
    let key = format!("artifact/{namespace}/{name}");
    let wanted = fingerprint(desired);
    // The resource version to remember the write against.
    let remember = match stored(ctx, namespace, &name, wanted) {
        Stored::UpToDate => {
            // The cache shows the last write: nothing left to remember.
            ctx.memo.forget(&key);
            return Ok(());
        }
        Stored::Differs(rv) => {
            if ctx.memo.already_written(&key, rv.as_deref(), wanted) {
                return Ok(());
            }
            Some(rv)
        }
        // An Artifact of that name the mirror did not write: taken over,
        // without the memo (the index keeps no resource version of it).
        Stored::Foreign => None,
    };
    ctx.artifact_api(namespace)
        .patch(&name, &apply_params(), &Patch::Apply(desired))
        .await?;
    if let Some(rv) = remember {
        ctx.memo.record(key, rv, wanted);
    }
    let kind = stock.kind.to_string();
    ctx.metrics
        .mirrored
        .get_or_create(&KindLabels { kind })
        .inc();
    tracing::info!(artifact = %name, revision = %desired.spec.revision, "mirrored artifact");
    Ok(())
}
