//! Writing what a reconcile found: the status (by server-side apply, only
//! when it changed) and the Events a change deserves. URLs in them are
//! redacted.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use openflux_api::producer::publish::exported_ref;
use openflux_api::runtime::events::{FluxEvent, META_DIGEST, META_REVISION};
use tracing::{debug, warn};

use crate::api::{ArtifactSummary, HttpSource, HttpSourceStatus, API_VERSION, KIND};
use crate::context::{Context, Error, FIELD_MANAGER};
use crate::plan::{Failure, Retry};
use crate::redact::redact;
use crate::status::{self, Outcome};

/// Writes the status an outcome implies, starting from `current` (the
/// status as this reconcile corrected it), when it differs from the
/// object's, and emits the Events the change deserves.
pub async fn write_outcome(
    hs: &HttpSource,
    ctx: &Context,
    current: Option<&HttpSourceStatus>,
    requested_at: Option<&str>,
    outcome: &Result<ArtifactSummary, Failure>,
) -> Result<(), Error> {
    let outcome = match outcome {
        Ok(summary) => Outcome::Published(summary.clone()),
        Err(f) => {
            warn!(reason = f.reason, error = %f.message, "reconcile failed");
            Outcome::Failed {
                reason: f.reason,
                message: f.message.clone(),
                stalled: f.retry == Retry::Never,
            }
        }
    };
    let now = Time(Timestamp::now());
    let new = status::next_status(
        current,
        hs.metadata.generation,
        requested_at,
        &outcome,
        &now,
    );
    write_status(hs, ctx, &new).await?;
    let notices = status::notices(hs.status.as_ref(), &new, &redact(&hs.spec.url));
    if notices.is_empty() {
        return Ok(());
    }
    let alert_target = alert_target(hs, ctx).await;
    for notice in notices {
        let mut event = if notice.warning {
            FluxEvent::warning(notice.reason, notice.message)
        } else {
            FluxEvent::normal(notice.reason, notice.message)
        };
        if let Some(artifact) = &notice.artifact {
            event = event
                .with_metadata(META_REVISION, &artifact.revision)
                .with_metadata(META_DIGEST, &artifact.digest);
        }
        ctx.events.publish(hs, &event, alert_target.as_ref()).await;
    }
    Ok(())
}

/// Writes `new` as the status, unless the object has it already.
pub async fn write_status(
    hs: &HttpSource,
    ctx: &Context,
    new: &HttpSourceStatus,
) -> Result<(), Error> {
    if hs.status.as_ref() == Some(new) {
        return Ok(());
    }
    let ns = hs.namespace().ok_or(Error::Incomplete)?;
    let api: Api<HttpSource> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "status": new,
    });
    api.patch_status(
        &hs.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// The object notification-controller is told an event is about: the one
/// openflux exported this source's Artifact to, which an Alert can select
/// (an Alert cannot name the HttpSource kind). `None` before the export, or
/// when events are not posted at all.
async fn alert_target(hs: &HttpSource, ctx: &Context) -> Option<ObjectReference> {
    if !ctx.events.notifies() {
        return None;
    }
    let ns = hs.namespace()?;
    match ctx.publisher.get(&ns, &hs.name_any()).await {
        Ok(artifact) => artifact.as_ref().and_then(exported_ref),
        Err(e) => {
            debug!(error = %e, "cannot read the Artifact for its exported object");
            None
        }
    }
}
