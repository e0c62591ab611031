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
//! writes what it decided, for each source [`runner`] gives it from the
//! [`backlog`] and the [`store`] the source watch keeps.

pub mod backlog;
pub mod plan;
mod runner;
pub mod source;
pub mod store;
mod wake;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, Preconditions};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

pub use backlog::Backlog;
pub use plan::{fingerprint, is_mirrored, is_own_export, memo_key, plan, InvalidSource, Plan};
use plan::{Stored, StoredArtifact, StoredOwner};
pub use source::{FluxSource, Source, SourceKind};
pub use store::Sources;
pub use wake::Waker;

use crate::api::runtime::{ControllerId, ControllerMetrics};
use crate::api::{Artifact, StockSource, FLUX_SOURCE_GROUP};
use crate::control::{apply_params, reconcile_result, Context, Error, Reconciler, Requeue};
use crate::locks;
use crate::telemetry::KindLabels;
use crate::vocabulary::uid::Uid;

/// Why openflux cannot tell whether a source kind is served.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("openflux may not read API group {group_version} (HTTP {code}: {message}); it needs discovery access (the shipped ClusterRole binding of system:discovery)")]
    Forbidden {
        group_version: String,
        code: u16,
        message: String,
    },
    #[error("reading API group {group_version}: {source}")]
    Api {
        group_version: String,
        source: kube::Error,
    },
}

/// What an error reading an API group means: not served (`Ok`), or a
/// failure to report (missing permission apart from the rest).
pub fn served_or_error(group_version: &str, error: kube::Error) -> Result<(), DiscoveryError> {
    match error {
        kube::Error::Api(status) if status.code == 404 => Ok(()),
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => {
            Err(DiscoveryError::Forbidden {
                group_version: group_version.to_string(),
                code: status.code,
                message: status.message,
            })
        }
        source => Err(DiscoveryError::Api {
            group_version: group_version.to_string(),
            source,
        }),
    }
}

/// Finds the first version of `kind` the API server serves: `None` when it
/// serves none (the CRD is not installed).
pub async fn discover(
    client: &Client,
    kind: &StockSource,
) -> Result<Option<ApiResource>, DiscoveryError> {
    for version in kind.versions {
        let gv = format!("{FLUX_SOURCE_GROUP}/{version}");
        let list = match client.list_api_group_resources(&gv).await {
            Ok(list) => list,
            Err(error) => {
                served_or_error(&gv, error)?;
                continue;
            }
        };
        if list
            .resources
            .iter()
            .any(|r| r.kind == kind.kind && r.name == kind.plural)
        {
            let gvk = GroupVersionKind::gvk(FLUX_SOURCE_GROUP, version, kind.kind);
            return Ok(Some(ApiResource::from_gvk_with_plural(&gvk, kind.plural)));
        }
    }
    Ok(None)
}

/// One mirror for one source kind.
pub struct Mirror {
    pub source: &'static StockSource,
    pub resource: SourceKind,
}

impl Mirror {
    /// Runs until `shutdown`, reconciling each source `backlog` gives (at
    /// most `concurrency` at a time, the backlog's room) from what
    /// `sources` holds then; then waits for the reconciles under way.
    pub async fn run(
        self,
        ctx: Arc<Context>,
        sources: Sources,
        backlog: Arc<Backlog>,
        concurrency: u16,
        shutdown: CancellationToken,
    ) {
        let stock = self.source;
        let retry = ctx.retry;
        let metrics = ctx
            .metrics
            .reconciles
            .controller(&controller_id(stock), concurrency);
        let mirroring = Arc::new(Mirroring {
            ctx,
            stock,
            resource: self.resource,
            metrics,
        });
        runner::run(sources, backlog, retry, mirroring, shutdown).await;
        tracing::info!(kind = stock.kind, "mirror controller stopped");
    }
}

/// One source kind's mirror, as its runner drives it.
struct Mirroring {
    ctx: Arc<Context>,
    stock: &'static StockSource,
    resource: SourceKind,
    metrics: ControllerMetrics,
}

impl Reconciler for Mirroring {
    type Object = Arc<Source>;

    #[tracing::instrument(skip_all, fields(kind = self.stock.kind, namespace = %source.namespace, name = %source.name))]
    async fn reconcile(&self, source: &Arc<Source>) -> Result<Requeue, Error> {
        // Counted per controller only: a mirrored Artifact is a copy of a
        // Flux source, which source-controller already records, and a
        // series per object would grow with every source in the cluster.
        let mut guard = self.metrics.reconcile_unlabelled();
        let result = reconcile_inner(source, &self.ctx, self.stock, &self.resource).await;
        guard.set_result(reconcile_result(&result));
        result
    }

    fn failed(&self, source: &Arc<Source>, error: &Error, retry_in: Duration) {
        let kind = self.stock.kind;
        tracing::warn!(kind, namespace = %source.namespace, name = %source.name, %error, ?retry_in, "mirror reconcile failed");
    }
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
    source: &Source,
    ctx: &Context,
    stock: &'static StockSource,
    ar: &SourceKind,
) -> Result<Requeue, Error> {
    if source.namespace.is_empty() {
        return Err(Error::MissingField("namespace"));
    }
    match plan(stock, &ar.0.api_version, source) {
        Err(invalid) => {
            // Not retried: the source must change first.
            tracing::warn!(error = %invalid, "not mirroring");
        }
        Ok(Plan::Skip) => {}
        Ok(Plan::Remove { name }) => remove(ctx, source, &name).await?,
        Ok(Plan::Mirror(desired)) => return write(ctx, stock, ar, source, &desired).await,
    }
    Ok(None)
}

/// Deletes the Artifact `name` if `source` controls it.
async fn remove(ctx: &Context, source: &Source, name: &str) -> Result<(), Error> {
    let namespace = &*source.namespace;
    let uid = {
        let index = locks::read(&ctx.index);
        let Some(current) = index.artifact(namespace, name) else {
            return Ok(());
        };
        let ours = current.owner.as_ref().is_some_and(|o| match &source.uid {
            Some(uid) => o.uid == *uid,
            None => o.uid.is_empty(),
        });
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
    ctx.memo.forget(&memo_key(namespace, name));
    Ok(())
}

/// What the owner index knows of the Artifact `name` in `namespace`,
/// decided on by [`plan::stored`] for source `source` of kind `stock`.
fn stored(
    ctx: &Context,
    stock: &StockSource,
    namespace: &str,
    source: &str,
    name: &str,
    wanted: u64,
) -> Stored {
    let index = locks::read(&ctx.index);
    let current = index.artifact(namespace, name).map(|a| StoredArtifact {
        owner: a.owner.as_ref().map(|o| StoredOwner {
            group: &o.source.group,
            kind: &o.source.kind,
            name: &o.source.name,
        }),
        mirrored: a
            .mirrored
            .as_ref()
            .map(|m| (m.fingerprint, m.resource_version.as_deref())),
    });
    plan::stored(current, stock, source, wanted)
}

/// How long the mirror waits before looking again at a source whose
/// Artifact name another object holds (a rename of that object, which
/// wakes nothing here, is seen within this time).
pub const TAKEN_RETRY: Duration = Duration::from_secs(300);

/// Applies `desired` unless the Artifact already says it, or is not the
/// mirror's to write.
async fn write(
    ctx: &Context,
    stock: &'static StockSource,
    ar: &SourceKind,
    source: &Source,
    desired: &Artifact,
) -> Result<Requeue, Error> {
    let name = desired.name_any();
    let namespace = &*source.namespace;
    let key = memo_key(namespace, &name);
    let taken_key = format!("taken/{namespace}/{name}");
    let wanted = fingerprint(desired);
    // The resource version to remember the write against.
    let remember = match stored(ctx, stock, namespace, &source.name, &name, wanted) {
        Stored::UpToDate => {
            // The cache shows the last write: nothing left to remember.
            ctx.memo.forget(&key);
            ctx.memo.forget(&taken_key);
            return Ok(None);
        }
        Stored::Differs(rv) => {
            if ctx.memo.already_written(&key, rv.as_deref(), wanted) {
                return Ok(None);
            }
            rv
        }
        Stored::Taken(whose) => {
            taken(ctx, stock, ar, source, &name, &whose).await;
            return Ok(Some(TAKEN_RETRY));
        }
    };
    // Remembered before it is sent: the write's echo may come through the
    // watch before its answer does, and is only told apart by the memo.
    ctx.memo.record(key.clone(), remember, wanted);
    let written = ctx
        .artifact_api(namespace)
        .patch(&name, &apply_params(), &Patch::Apply(desired))
        .await;
    if let Err(error) = written {
        ctx.memo.forget(&key);
        return Err(error.into());
    }
    ctx.memo.forget(&taken_key);
    let kind = stock.kind.to_string();
    ctx.metrics
        .mirrored
        .get_or_create(&KindLabels { kind })
        .inc();
    tracing::info!(artifact = %name, revision = %desired.spec.revision, "mirrored artifact");
    Ok(None)
}

/// Reports, once a conflict, that the Artifact name the mirror gives
/// `source` is held by an Artifact it does not own: a Warning Event on the
/// source (openflux does not write Flux's status conditions), a log line
/// and a count. The other Artifact keeps its content.
async fn taken(
    ctx: &Context,
    stock: &'static StockSource,
    ar: &SourceKind,
    source: &Source,
    name: &str,
    whose: &str,
) {
    let namespace = &*source.namespace;
    let message = format!(
        "openflux mirrors this {kind}'s artifact as Artifact {namespace}/{name}, but an Artifact of that \
         name belongs to {whose}; openflux does not write over it, so consumers of custom sources cannot \
         name this {kind} through openflux until that Artifact is renamed (or this {kind} is)",
        kind = stock.kind
    );
    let key = format!("taken/{namespace}/{name}");
    let hash = crate::control::hash_of(&message).unwrap_or_default();
    let uid = source.uid.as_ref().map(Uid::to_string);
    if ctx.memo.already_written(&key, uid.as_deref(), hash) {
        return;
    }
    tracing::warn!(artifact = %name, owner = %whose, "the mirrored Artifact's name is taken; not writing over it");
    ctx.metrics
        .mirror_conflicts
        .get_or_create(&KindLabels {
            kind: stock.kind.to_string(),
        })
        .inc();
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(ar.0.api_version.clone()),
        kind: Some(ar.0.kind.clone()),
        name: Some(source.name.to_string()),
        namespace: Some(namespace.to_string()),
        uid: uid.clone(),
        ..Default::default()
    };
    let event = crate::api::runtime::FluxEvent::warning(ARTIFACT_NAME_TAKEN, message);
    // The mirror keeps none of a source's annotations (Flux's event metadata
    // among them): the Event carries none.
    ctx.events
        .publish_on(reference, &BTreeMap::new(), &event, None)
        .await;
    ctx.memo.record(key, uid, hash);
}

/// Reason of the Event on a source whose Artifact name is taken.
pub const ARTIFACT_NAME_TAKEN: &str = "ArtifactNameTaken";

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        let mut status = Status::failure(&format!("status {code}"), "");
        status.code = code;
        kube::Error::Api(status.boxed())
    }

    #[test]
    fn a_missing_permission_is_not_read_as_a_missing_kind() {
        let gv = "source.toolkit.fluxcd.io/v1";
        assert!(served_or_error(gv, api_error(404)).is_ok(), "not served");
        for code in [401, 403] {
            let error = served_or_error(gv, api_error(code)).unwrap_err();
            assert!(matches!(error, DiscoveryError::Forbidden { .. }), "{code}");
            assert!(
                error.to_string().contains("may not read API group"),
                "{error}"
            );
        }
        assert!(matches!(
            served_or_error(gv, api_error(500)),
            Err(DiscoveryError::Api { .. })
        ));
    }
}
