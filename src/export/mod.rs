//! The export controller: every Artifact whose producer is not a stock Flux
//! source is kept as the objects the unchanged Flux consumers read: an
//! `ExternalArtifact` (source.toolkit.fluxcd.io/v1), a shadow
//! `OCIRepository`, or both, as [`crate::cluster::facts`] decided for the consumers
//! of this cluster.
//!
//! The exported objects live in the Artifact's namespace under the name the
//! owner index gives (see [`crate::index::OwnerIndex::export_name`]), are
//! owned by the Artifact, and carry the Artifact in `status.artifact` with a
//! `Ready` condition. An exported object no longer wanted (the target or the
//! name changed) is kept up to date until no consumer refers to it, then
//! deleted. [`plan`] decides; this module runs the controller that writes
//! what it decided.

pub mod census;
mod events;
pub mod message;
pub mod plan;
pub mod release;
mod request;
mod retire;
mod series;
pub mod shadow;
mod status;
pub mod trust;
pub mod verify;
mod wake;
pub mod write;

use series::{Series, SERIES_SWEEP};
pub use wake::Waker;
use write::Export;
pub use write::{ServedTarget, ServedTargets};

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::ResourceExt;

pub use message::{describe_choices, exported_message, failure_message, inputs_not_exported};
pub use plan::{
    conflict, desired_status, former_export_names, managed_selector, object_up_to_date,
    path_from_url, plan, ready, requested_at, status_up_to_date, ExportPlan, REQUESTED_AT,
};

use crate::api::runtime::{ControllerId, ControllerMetrics, ObjectLabels, Retries, RetryArgs};
use crate::api::{is_stock_source, reason, Artifact, ArtifactStatus, ObjectReference};
use crate::cluster::target::Target;
use crate::control::{
    caught, ended, reconcile_result, Context, Error, Reconciler, Referrals, Requeue,
};
use crate::export::trust::Verdict;
use crate::index::IndexedArtifact;
use crate::locks;

/// What the export controller keeps from one run to the next (it is
/// started anew when the served targets change), built once by the wiring.
pub struct Kept {
    /// Whether an Artifact's writer may speak for its source.
    pub verifier: verify::Verifier,
    /// Which exported objects consumers refer to, as the consumers'
    /// controller keeps them.
    pub referrals: Arc<dyn Referrals>,
}

/// When an Artifact the trust check refused is checked again: a minute
/// after the first refusal, doubling with each refusal in a row, at most
/// every 15 minutes.
pub const UNTRUSTED_RECHECK: RetryArgs = RetryArgs {
    min_retry_delay: Duration::from_secs(60),
    max_retry_delay: Duration::from_secs(15 * 60),
};

/// The export controller's context, built once per run of the controller.
struct Exporter {
    ctx: Arc<Context>,
    kept: Arc<Kept>,
    targets: ServedTargets,
    metrics: ControllerMetrics,
    /// The failures in a row of each Artifact failing now.
    retries: Retries<ObjectRef<Artifact>>,
    /// The checks in a row that refused each Artifact refused now: a
    /// refused Artifact is checked again after [`UNTRUSTED_RECHECK`]'s
    /// growing delays (its writer's rights may change unseen), not every
    /// minute for ever; one that changes is checked at once.
    refused: Retries<ObjectRef<Artifact>>,
    /// The Artifacts whose `gotk_*` series this controller recorded.
    series: Series,
}

/// Runs the export controller until `shutdown`, reconciling each Artifact
/// `triggers` names (its own changes, its exported object's changes, a
/// sibling's arrival or departure), with what `kept` holds across runs.
pub async fn run(
    ctx: Arc<Context>,
    kept: Arc<Kept>,
    targets: ServedTargets,
    triggers: impl futures::Stream<Item = ObjectRef<Artifact>> + Send + 'static,
    concurrency: u16,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let artifacts = ctx.artifacts.clone();
    // Every trigger comes from the router; the controller's own stream
    // stays empty.
    let nothing = futures::stream::pending::<Result<Artifact, watcher::Error>>();
    let exporter = Arc::new(Exporter {
        retries: Retries::new(ctx.retry),
        refused: Retries::new(UNTRUSTED_RECHECK),
        series: Series::default(),
        metrics: ctx
            .metrics
            .reconciles
            .controller(&ControllerId::of::<Artifact>(), concurrency),
        ctx,
        kept,
        targets,
    });
    let gone = exporter.clone();
    let controller = Controller::for_stream_with(nothing, artifacts, ())
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .reconcile_on(triggers)
        .graceful_shutdown_on(shutdown)
        .run(
            |artifact, exporter| async move {
                let requeue = caught(exporter.reconcile(&artifact)).await?;
                let key = ObjectRef::from(artifact.as_ref());
                let requeue = ended(&*exporter, &exporter.retries, &key, &artifact, Ok(requeue));
                Ok(action(requeue))
            },
            |artifact, error, exporter| {
                // kube's Controller keeps no backoff: the exporter does.
                let key = ObjectRef::from(artifact.as_ref());
                action(ended(
                    &*exporter,
                    &exporter.retries,
                    &key,
                    &artifact,
                    Err(error),
                ))
            },
            exporter.clone(),
        )
        // A wake for an Artifact no longer there (its export was collected
        // after it): its series go at once.
        .for_each(move |result| {
            if let Err(kube::runtime::controller::Error::ObjectNotFound(gone_ref)) = result {
                if let Some(namespace) = &gone_ref.namespace {
                    let key = ObjectRef::<Artifact>::new(&gone_ref.name).within(namespace);
                    gone.series.forget(&key, &gone.metrics);
                    gone.refused.succeeded(&key);
                }
            }
            futures::future::ready(())
        });
    let sweep = async {
        let mut tick = tokio::time::interval(SERIES_SWEEP);
        loop {
            tick.tick().await;
            exporter
                .series
                .sweep(&exporter.ctx.artifacts, &exporter.metrics);
        }
    };
    futures::pin_mut!(controller, sweep);
    futures::future::select(controller, sweep).await;
    tracing::info!("export controller stopped");
}

impl Reconciler for Exporter {
    type Object = Arc<Artifact>;

    #[tracing::instrument(skip_all, fields(namespace = artifact.namespace().unwrap_or_default(), name = %artifact.name_any()))]
    async fn reconcile(&self, artifact: &Arc<Artifact>) -> Result<Requeue, Error> {
        if !self.ctx.shard.owns(artifact.labels()) {
            // Another shard's: it exports it (every shard sees every Artifact).
            return Ok(None);
        }
        let mut guard = self.metrics.reconcile(ObjectLabels::of(artifact.as_ref()));
        let result = reconcile_inner(artifact, self).await;
        guard.set_result(reconcile_result(&result));
        // Recorded once the guard wrote the series (a sweep between the two
        // finds it on its next pass).
        drop(guard);
        self.series.record(ObjectRef::from(artifact.as_ref()));
        result
    }

    fn failed(&self, artifact: &Arc<Artifact>, error: &Error, retry_in: Duration) {
        tracing::warn!(name = %artifact.name_any(), namespace = artifact.namespace().unwrap_or_default(), %error, ?retry_in, "export reconcile failed");
    }
}

async fn reconcile_inner(artifact: &Artifact, exporter: &Exporter) -> Result<Requeue, Error> {
    let ctx = &exporter.ctx;
    let indexed =
        IndexedArtifact::from_artifact(artifact).ok_or(Error::MissingField("namespace"))?;
    if let Some(owner) = &indexed.owner {
        if is_stock_source(&owner.source.group, &owner.source.kind) {
            // Mirrored: Flux reads the source itself.
            return Ok(None);
        }
    }
    let source = indexed
        .owner
        .as_ref()
        .map(|o| format!("{}/{}", o.source.kind, o.source.name));
    let status =
        |ok: bool, reason: &str, message: &str, exported: Option<ObjectReference>| ArtifactStatus {
            observed_generation: artifact.metadata.generation,
            source: source.clone(),
            exported_ref: exported,
            conditions: vec![ready(artifact, ok, reason, message)],
        };

    let verdict = exporter.kept.verifier.check(artifact).await?;
    // The default rule weighs only Artifacts the check did not refuse: the
    // index learns the verdict before this Artifact's export name is taken
    // from it (its status carries it to the other replicas and restarts).
    locks::write(&ctx.index).record_verdict(
        &indexed.key,
        &indexed.uid,
        verdict == Verdict::Trusted,
    );
    let key = ObjectRef::from(artifact);
    if let Verdict::Untrusted(msg) = verdict {
        exporter
            .set_status(artifact, status(false, reason::UNTRUSTED, &msg, None))
            .await?;
        return Ok(Some(exporter.refused.failed(key)));
    }
    exporter.refused.succeeded(&key);
    let (order, reasons, inputs_served) = {
        let facts = locks::read(&ctx.facts);
        let inputs = facts.cluster.exported_inputs;
        (facts.export_order(), describe_choices(&facts), inputs)
    };
    let wanted: BTreeSet<Target> = order.iter().copied().collect();
    if wanted.is_empty() {
        let msg = format!("no Flux consumer in this cluster can read a custom source: {reasons}");
        exporter
            .set_status(
                artifact,
                status(false, reason::EXPORT_TARGET_MISSING, &msg, None),
            )
            .await?;
        return Ok(Some(Duration::from_secs(60)));
    }
    let failed = |what: &str, error: &Error| {
        let msg = failure_message(what, &api_message(error));
        status(false, reason::EXPORT_FAILED, &msg, None)
    };
    let export_name = locks::read(&ctx.index).export_name(&indexed);
    let namespace = &indexed.key.namespace;
    let uid = artifact.uid().unwrap_or_default();
    let mut exported: Vec<ObjectReference> = Vec::new();
    for target in &order {
        let Some(served) = exporter.targets.get(target) else {
            let msg = format!("{target} is not served by this cluster (yet); waiting for it");
            exporter
                .set_status(
                    artifact,
                    status(false, reason::EXPORT_TARGET_MISSING, &msg, None),
                )
                .await?;
            return Ok(Some(Duration::from_secs(10)));
        };
        let export = Export::new(ctx, served, namespace, &export_name);
        let what = format!("{} {namespace}/{export_name}", served.resource.kind);
        let current = match export.current().await {
            Ok(current) => current,
            Err(e) => {
                return exporter
                    .export_failed(artifact, &failed(&what, &e), e)
                    .await
            }
        };
        let requested = current
            .as_ref()
            .and_then(|c| requested_at(c).map(str::to_string));
        if let Some(requested) = &requested {
            request::forward(ctx, artifact, requested).await;
        }
        let plan = match plan(
            artifact,
            &export_name,
            *target,
            &served.resource,
            inputs_served,
        ) {
            Ok(p) => ExportPlan {
                handled: requested,
                ..p
            },
            Err(msg) => {
                exporter
                    .set_status(
                        artifact,
                        status(false, reason::INVALID_ARTIFACT, &msg, None),
                    )
                    .await?;
                return Ok(None);
            }
        };
        if let Some(msg) = current.as_ref().and_then(|c| conflict(c, &uid)) {
            exporter
                .set_status(artifact, status(false, reason::EXPORT_CONFLICT, &msg, None))
                .await?;
            return Ok(Some(Duration::from_secs(60)));
        }
        let latest = match export.write_object(&plan, current).await {
            Ok(latest) => latest,
            Err(e) => {
                return exporter
                    .export_failed(artifact, &failed(&what, &e), e)
                    .await
            }
        };
        match export.write_status(&plan, latest.as_ref()).await {
            Ok(true) => {
                tracing::info!(export = %export_name, kind = target.kind(), revision = %artifact.spec.revision, "exported artifact")
            }
            Ok(false) => {}
            Err(e) => {
                return exporter
                    .export_failed(artifact, &failed(&what, &e), e)
                    .await
            }
        }
        exported.push(ObjectReference {
            api_version: served.resource.api_version.clone(),
            kind: served.resource.kind.clone(),
            name: export_name.clone(),
            namespace: Some(namespace.to_string()),
        });
    }
    if let Err(e) = exporter
        .retire(artifact, &uid, namespace, &export_name, &wanted)
        .await
    {
        let what = format!("an earlier export of this Artifact in {namespace}");
        return exporter
            .export_failed(artifact, &failed(&what, &e), e)
            .await;
    }
    let note = inputs_not_exported(artifact, &wanted, inputs_served);
    let msg = exported_message(&exported, &export_name, artifact, &reasons, note);
    exporter
        .set_status(
            artifact,
            status(true, reason::EXPORTED, &msg, exported.into_iter().next()),
        )
        .await?;
    Ok(None)
}

/// What kube's `Controller` does after a reconcile that asked for `requeue`.
fn action(requeue: Requeue) -> Action {
    requeue.map_or_else(Action::await_change, Action::requeue)
}

/// What the API server said of a refused request (its message alone), or
/// the error itself when no answer came.
fn api_message(error: &Error) -> String {
    match error {
        Error::Kube(kube::Error::Api(status)) if !status.message.is_empty() => {
            status.message.clone()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused Artifact is checked again after a minute, then less and
    /// less often, at most every 15 minutes, and from the start once it
    /// passed.
    #[test]
    fn a_refused_artifact_is_checked_again_less_and_less_often() {
        let refused = Retries::new(UNTRUSTED_RECHECK);
        let key = ObjectRef::<Artifact>::new("forged").within("tenant");
        let delays: Vec<u64> = (0..6)
            .map(|_| refused.failed(key.clone()).as_secs())
            .collect();
        assert_eq!(delays, [60, 120, 240, 480, 900, 900]);
        refused.succeeded(&key);
        assert!(refused.is_empty());
        assert_eq!(refused.failed(key).as_secs(), 60);
    }
}
