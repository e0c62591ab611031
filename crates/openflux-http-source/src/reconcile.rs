//! One reconcile of an HttpSource: decide whether a fetch is due, fetch and
//! publish, and write what happened into the status and Events.

use std::time::Instant;

use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use openflux_api::producer::publish::exported_ref;
use openflux_api::runtime::events::{FluxEvent, META_DIGEST, META_REVISION};
use openflux_api::Artifact;
use tracing::{debug, warn};

use crate::api::{
    condition, reason, ArtifactSummary, HttpSource, HttpSourceStatus, API_VERSION, KIND,
    REQUESTED_AT_ANNOTATION,
};
use crate::artifact::{fetch_and_store, Request};
use crate::controller::{Context, Error, Memory, FIELD_MANAGER};
use crate::fetch::{self, Auth};
use crate::plan::{artifact_spec, plan, Done, Failure, Retry};
use crate::schedule::{self, Attempt, Triggers};
use crate::status::{self, Outcome};

/// One reconcile.
pub async fn reconcile_source(hs: &HttpSource, ctx: &Context) -> Result<Done, Error> {
    let ns = hs.namespace().ok_or(Error::Incomplete)?;
    if hs.metadata.deletion_timestamp.is_some() {
        return Ok(Done::idle());
    }
    if hs.spec.suspend {
        debug!("suspended: not fetching");
        return Ok(Done::idle());
    }
    let status = hs.status.as_ref();
    let requested_at = hs.annotations().get(REQUESTED_AT_ANNOTATION).cloned();
    let requested_at = requested_at.as_deref();

    let plan = match plan(&hs.spec) {
        Ok(plan) => plan,
        Err(message) => {
            let failure = Failure::new(reason::INVALID_SPEC, message, Retry::Never);
            write_outcome(hs, ctx, requested_at, &Err(failure.clone())).await?;
            return Ok(Done::failed(&failure, 1, std::time::Duration::MAX));
        }
    };

    let key = ObjectRef::from_obj(hs);
    let memory = ctx.memory_of(&key, hs.metadata.uid.as_ref());
    let previous_failures = memory.as_ref().map_or(0, |m| m.attempt.failures);
    let published = status.and_then(|s| s.artifact.as_ref());
    let stored = match published {
        Some(a) => ctx.storage.exists(&a.path).await,
        None => true,
    };

    let auth = match read_auth(hs, ctx, &ns).await {
        Ok(auth) => auth,
        Err(failure) => {
            let failures = previous_failures + 1;
            ctx.remember(
                key,
                Memory {
                    uid: hs.metadata.uid.clone(),
                    generation: hs.metadata.generation,
                    attempt: Attempt {
                        at: Instant::now(),
                        fingerprint: String::new(),
                        failures,
                    },
                    remembered: memory.and_then(|m| m.remembered),
                },
            );
            write_outcome(hs, ctx, requested_at, &Err(failure.clone())).await?;
            return Ok(Done::failed(&failure, failures, plan.interval));
        }
    };
    let fingerprint = fetch::fingerprint(
        &hs.spec.url,
        &auth,
        hs.spec.ignore.as_deref(),
        hs.spec.digest.as_deref(),
    );

    let triggers = Triggers {
        requested: requested_at.is_some()
            && requested_at != status.and_then(|s| s.last_handled_reconcile_at.as_deref()),
        new_generation: memory.as_ref().map(|m| m.generation) != Some(hs.metadata.generation),
        stored,
    };
    let last = memory.as_ref().map(|m| &m.attempt);
    if let Some(wait) =
        schedule::next_fetch(last, Instant::now(), plan.interval, &fingerprint, triggers)
    {
        // Not due: keep the Artifact as published (a no-op when unchanged;
        // restores it when it was deleted or edited).
        if let Some(summary) = published {
            apply_artifact(hs, ctx, summary).await?;
        }
        return Ok(Done::not_due(wait));
    }

    let remembered = memory.as_ref().and_then(|m| m.remembered.clone());
    let request = Request {
        plan: &plan,
        auth: &auth,
        fingerprint: &fingerprint,
        remembered: remembered.as_ref(),
        published: published.filter(|_| stored),
    };
    let result = match fetch_and_store(hs, ctx, &ns, request).await {
        Ok((summary, new_remembered)) => match apply_artifact(hs, ctx, &summary).await {
            Ok(_) => Ok((summary, new_remembered)),
            Err(e) => Err(Failure::new(
                reason::ARTIFACT_WRITE_FAILED,
                format!("cannot write Artifact: {e}"),
                Retry::Backoff,
            )),
        },
        Err(failure) => Err(failure),
    };

    let failures = if result.is_ok() {
        0
    } else {
        previous_failures + 1
    };
    let remembered = match &result {
        Ok((_, Some(new))) => Some(new.clone()),
        Ok((_, None)) | Err(_) => remembered,
    };
    ctx.remember(
        key,
        Memory {
            uid: hs.metadata.uid.clone(),
            generation: hs.metadata.generation,
            attempt: Attempt {
                at: Instant::now(),
                fingerprint,
                failures,
            },
            remembered,
        },
    );

    let outcome = result.map(|(summary, _)| summary);
    write_outcome(hs, ctx, requested_at, &outcome).await?;
    match outcome {
        Ok(summary) => {
            if published.map(|p| &p.digest) != Some(&summary.digest) {
                collect_garbage(hs, ctx, &ns, &summary).await;
            }
            Ok(Done::published(plan.interval))
        }
        Err(failure) => Ok(Done::failed(&failure, failures, plan.interval)),
    }
}

async fn collect_garbage(hs: &HttpSource, ctx: &Context, ns: &str, current: &ArtifactSummary) {
    let name = hs.name_any();
    match ctx
        .storage
        .collect_garbage(ns, &name, Some(&current.path), ctx.retention)
        .await
    {
        Ok(n) if n > 0 => debug!(removed = n, "collected old artifacts"),
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot collect old artifacts"),
    }
}

async fn read_auth(hs: &HttpSource, ctx: &Context, ns: &str) -> Result<Auth, Failure> {
    let Some(secret_ref) = &hs.spec.secret_ref else {
        return Ok(Auth::default());
    };
    let fail = |m: String| Failure::new(reason::AUTHENTICATION_FAILED, m, Retry::Backoff);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = secrets
        .get_opt(&secret_ref.name)
        .await
        .map_err(|e| fail(format!("cannot read secret '{}': {e}", secret_ref.name)))?
        .ok_or_else(|| fail(format!("secret '{}' not found", secret_ref.name)))?;
    let data = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    fetch::auth_from_secret(&data).map_err(|m| fail(format!("secret '{}': {m}", secret_ref.name)))
}

async fn apply_artifact(
    hs: &HttpSource,
    ctx: &Context,
    summary: &ArtifactSummary,
) -> Result<Artifact, Error> {
    let name = hs.name_any();
    Ok(ctx
        .publisher
        .publish(hs, &name, artifact_spec(summary))
        .await?)
}

/// Writes the status an outcome implies (when it differs) and emits Events.
async fn write_outcome(
    hs: &HttpSource,
    ctx: &Context,
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
    let old = hs.status.as_ref();
    let new: HttpSourceStatus =
        status::next_status(old, hs.metadata.generation, requested_at, &outcome, &now);
    if old != Some(&new) {
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
    }
    let notices = status::notices(old, &new, &hs.spec.url);
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

/// Whether the source is Ready, by its status.
pub fn is_ready(hs: &HttpSource) -> Option<bool> {
    hs.condition(condition::READY).map(|c| c.status == "True")
}
