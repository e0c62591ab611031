//! One reconcile of an HttpSource: refuse a URL the network policy
//! refuses, heal the published artifact, decide whether a fetch is due,
//! fetch and publish, and write what happened into the status and Events.

use std::time::Instant;

use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use openflux_api::Artifact;
use tracing::{debug, info, warn};

use crate::api::{
    condition, reason, ArtifactSummary, HttpSource, MAX_INTERVAL, REQUESTED_AT_ANNOTATION,
};
use crate::artifact::{fetch_and_store, Request};
use crate::context::{Context, Error, Memory};
use crate::credentials::read_credentials;
use crate::fetch;
use crate::heal::{self, Healing};
use crate::plan::{artifact_spec, plan, Done, Failure, Retry};
use crate::redact::redact_url;
use crate::report::{write_outcome, write_status};
use crate::schedule::{self, Attempt, Triggers};

/// One reconcile.
pub async fn reconcile_source(hs: &HttpSource, ctx: &Context) -> Result<Done, Error> {
    let ns = hs.namespace().ok_or(Error::Incomplete)?;
    let name = hs.name_any();
    if hs.metadata.deletion_timestamp.is_some() {
        return Ok(Done::idle());
    }
    if hs.spec.suspend {
        debug!("suspended: not fetching");
        // The last artifact stays published: served while it is stored.
        let published = hs.status.as_ref().and_then(|s| s.artifact.as_ref());
        if let Some(a) = published {
            let own = heal::expected_path(&ns, &name, &a.digest).as_deref() == Some(&a.path);
            if own && ctx.storage.exists(&a.path).await {
                ctx.catalog.add(&a.path);
            }
        }
        return Ok(Done::idle());
    }
    let requested_at = hs.annotations().get(REQUESTED_AT_ANNOTATION).cloned();
    let requested_at = requested_at.as_deref();

    let plan = match plan(&hs.spec) {
        Ok(plan) => plan,
        Err(message) => {
            let failure = Failure::new(reason::INVALID_SPEC, message, Retry::Never);
            return stall(hs, ctx, requested_at, failure).await;
        }
    };
    // An address in the URL (or the API server's name) is refused without
    // a lookup: nothing but a change of the spec (or of the controller's
    // flags, which restarts it) can help.
    if let Err(blocked) = ctx.http.guard().check_static(&plan.url) {
        let message = format!("GET {}: {blocked}", redact_url(&plan.url));
        let failure = Failure::new(reason::BLOCKED_ADDRESS, message, Retry::Never);
        return stall(hs, ctx, requested_at, failure).await;
    }

    // The published artifact: this source's, stored here, at this address?
    let mut current = hs.status.clone();
    let published = current.as_ref().and_then(|s| s.artifact.as_ref());
    let stored = match published {
        Some(a) => ctx.storage.exists(&a.path).await,
        None => false,
    };
    let healing = heal::judge(published, &ns, &name, stored, |p| ctx.storage.url(p));
    match &healing {
        Healing::Rewrite(healed) => {
            info!(url = %healed.url, "advertising the artifact at the current storage address");
            if let Some(s) = current.as_mut() {
                s.artifact = Some(healed.clone());
            }
        }
        Healing::Lost(why) => {
            info!(why = %why, "the published artifact cannot be served: fetching it again");
            if let Some(s) = current.as_mut() {
                s.artifact = None;
            }
        }
        Healing::Keep | Healing::Nothing => {}
    }
    let published = current.as_ref().and_then(|s| s.artifact.clone());
    if let Some(a) = &published {
        ctx.catalog.add(&a.path);
    }

    let key = ObjectRef::from_obj(hs);
    let memory = ctx.memory_of(&key, hs.metadata.uid.as_ref());
    let previous_failures = memory.as_ref().map_or(0, |m| m.attempt.failures);

    let mut credentials = match read_credentials(&ctx.client, &ns, &hs.spec).await {
        Ok(c) => c,
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
            write_outcome(
                hs,
                ctx,
                current.as_ref(),
                requested_at,
                &Err(failure.clone()),
            )
            .await?;
            return Ok(Done::failed(&failure, failures, plan.interval));
        }
    };
    if credentials.auth.basic.is_none() {
        credentials.auth.basic = plan.userinfo.clone();
    }
    let fingerprint = fetch::fingerprint(
        &hs.spec.url,
        &credentials.auth,
        &credentials.transport,
        hs.spec.ignore.as_deref(),
        hs.spec.digest.as_deref(),
    );

    let status = hs.status.as_ref();
    let triggers = Triggers {
        requested: requested_at.is_some()
            && requested_at != status.and_then(|s| s.last_handled_reconcile_at.as_deref()),
        new_generation: memory.as_ref().map(|m| m.generation) != Some(hs.metadata.generation),
        stored: !matches!(healing, Healing::Lost(_)),
    };
    let last = memory.as_ref().map(|m| &m.attempt);
    if let Some(wait) =
        schedule::next_fetch(last, Instant::now(), plan.interval, &fingerprint, triggers)
    {
        // Not due: keep the Artifact as published (a no-op when unchanged;
        // restores it when it was deleted or edited, and moves it to the
        // current address).
        if let Some(summary) = &published {
            apply_artifact(hs, ctx, summary).await?;
        }
        if let Some(new) = &current {
            write_status(hs, ctx, new).await?;
        }
        return Ok(Done::not_due(wait));
    }

    let remembered = memory.as_ref().and_then(|m| m.remembered.clone());
    let client = match ctx.http.client_for(&credentials.transport) {
        Ok(client) => client,
        Err(e) => {
            let failure =
                Failure::new(reason::AUTHENTICATION_FAILED, e.to_string(), Retry::Backoff);
            write_outcome(
                hs,
                ctx,
                current.as_ref(),
                requested_at,
                &Err(failure.clone()),
            )
            .await?;
            return Ok(Done::failed(&failure, previous_failures + 1, plan.interval));
        }
    };
    let request = Request {
        plan: &plan,
        client: &client,
        credentials: &credentials,
        fingerprint: &fingerprint,
        remembered: remembered.as_ref(),
        published: published.as_ref(),
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
        Err(failure) => {
            // What is published stays published, at the current address.
            if let Some(summary) = &published {
                if let Err(e) = apply_artifact(hs, ctx, summary).await {
                    warn!(error = %e, "cannot write the Artifact");
                }
            }
            Err(failure)
        }
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
    if let Ok(summary) = &outcome {
        ctx.catalog.add(&summary.path);
    }
    write_outcome(hs, ctx, current.as_ref(), requested_at, &outcome).await?;
    match outcome {
        Ok(summary) => {
            if published.as_ref().map(|p| &p.digest) != Some(&summary.digest) {
                collect_garbage(hs, ctx, &ns, &summary).await;
            }
            Ok(Done::published(plan.interval))
        }
        Err(failure) => Ok(Done::failed(&failure, failures, plan.interval)),
    }
}

/// Records a failure that waits for a change of the spec.
async fn stall(
    hs: &HttpSource,
    ctx: &Context,
    requested_at: Option<&str>,
    failure: Failure,
) -> Result<Done, Error> {
    write_outcome(
        hs,
        ctx,
        hs.status.as_ref(),
        requested_at,
        &Err(failure.clone()),
    )
    .await?;
    Ok(Done::failed(&failure, 1, MAX_INTERVAL))
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

/// Whether the source is Ready, by its status.
pub fn is_ready(hs: &HttpSource) -> Option<bool> {
    hs.condition(condition::READY).map(|c| c.status == "True")
}
