//! One artifact: fetch the URL, build the normalized tar.gz, check it
//! against `spec.digest` and store it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tracing::{debug, info};

use crate::api::{reason, ArtifactSummary, HttpSource};
use crate::archive;
use crate::context::Context;
use crate::credentials::Credentials;
use crate::fetch::{self, FetchError, Fetched, Remembered};
use crate::http::Get;
use crate::metrics;
use crate::plan::{archive_failure, Failure, Plan, Retry};

/// What a fetch is made with.
pub struct Request<'a> {
    pub plan: &'a Plan,
    /// The client for the source's TLS and proxy settings.
    pub client: &'a reqwest::Client,
    pub credentials: &'a Credentials,
    /// The request fingerprint (see `fetch::fingerprint`).
    pub fingerprint: &'a str,
    /// Validators of the response the published artifact was built from.
    pub remembered: Option<&'a Remembered>,
    /// The published artifact (its file is in storage, see `heal`).
    pub published: Option<&'a ArtifactSummary>,
}

/// Fetches, builds, verifies and stores. Returns the artifact to publish and,
/// after a full download, the validators to remember.
pub async fn fetch_and_store(
    hs: &HttpSource,
    ctx: &Context,
    ns: &str,
    request: Request<'_>,
) -> Result<(ArtifactSummary, Option<Remembered>), Failure> {
    let Request {
        plan,
        client,
        credentials,
        fingerprint,
        remembered,
        published,
    } = request;
    let conditional = fetch::conditional_headers(
        remembered,
        fingerprint,
        published.map(|a| a.digest.as_str()),
        published.is_some(),
    );
    let proxy = credentials.transport.proxy.as_ref().map(|p| &p.url);
    let get = Get {
        url: &plan.url,
        auth: &credentials.auth,
        proxy,
        conditional: &conditional,
        timeout: plan.timeout,
        max_size: ctx.max_size,
    };
    let fetched = ctx.http.fetch(client, get).await;
    let (bytes, validators) = match fetched {
        Ok(Fetched::NotModified) => {
            ctx.source_metrics.fetch(metrics::NOT_MODIFIED);
            let Some(published) = published else {
                return Err(Failure::new(
                    reason::FETCH_FAILED,
                    "unexpected 304 Not Modified",
                    Retry::Backoff,
                ));
            };
            debug!(revision = %published.revision, "not modified");
            let summary = ArtifactSummary {
                url: ctx.storage.url(&published.path),
                ..published.clone()
            };
            return Ok((summary, None));
        }
        Ok(Fetched::Body { bytes, validators }) => {
            ctx.source_metrics.fetch(metrics::DOWNLOADED);
            ctx.source_metrics
                .downloaded_bytes
                .inc_by(bytes.len() as u64);
            (bytes, validators)
        }
        Err(FetchError::TooLarge(limit)) => {
            ctx.source_metrics.fetch(metrics::FAILED);
            return Err(Failure::new(
                reason::ARCHIVE_REJECTED,
                format!("download exceeds the maximum size of {limit} bytes"),
                Retry::Interval,
            ));
        }
        Err(FetchError::Failed(message)) => {
            ctx.source_metrics.fetch(metrics::FAILED);
            return Err(Failure::new(reason::FETCH_FAILED, message, Retry::Backoff));
        }
        Err(FetchError::Blocked(message)) => {
            ctx.source_metrics.fetch(metrics::FAILED);
            return Err(Failure::new(
                reason::BLOCKED_ADDRESS,
                message,
                Retry::Interval,
            ));
        }
    };

    let url_path = plan.url.path().to_string();
    let ignore = plan.ignore.clone();
    let max_size = ctx.max_size;
    let packed =
        tokio::task::spawn_blocking(move || archive::build(&bytes, &url_path, &ignore, max_size))
            .await
            .map_err(|e| {
                Failure::new(
                    reason::INVALID_ARTIFACT,
                    format!("building the artifact failed: {e}"),
                    Retry::Interval,
                )
            })?
            .map_err(archive_failure)?;
    if let Some(expected) = &plan.digest {
        expected
            .verify(&packed.bytes)
            .map_err(|e| Failure::new(reason::DIGEST_MISMATCH, e.to_string(), Retry::Interval))?;
    }

    let path = ctx
        .storage
        .store_packed(ns, &hs.name_any(), &packed)
        .await
        .map_err(|e| {
            Failure::new(
                reason::STORAGE_OPERATION_FAILED,
                format!("cannot store artifact: {e}"),
                Retry::Backoff,
            )
        })?;
    let unchanged = published.filter(|p| p.digest == packed.digest);
    if unchanged.is_none() {
        ctx.source_metrics.artifacts_stored.inc();
        info!(revision = %packed.digest, files = packed.files, size = packed.bytes.len(), "stored new artifact");
    }
    let summary = ArtifactSummary {
        url: ctx.storage.url(&path),
        revision: packed.digest.clone(),
        digest: packed.digest.clone(),
        path,
        size: packed.bytes.len() as i64,
        last_update_time: unchanged
            .map(|p| p.last_update_time.clone())
            .unwrap_or_else(|| Time(Timestamp::now())),
    };
    let remembered = (!validators.is_empty()).then(|| Remembered {
        fingerprint: fingerprint.to_string(),
        validators,
        digest: packed.digest,
    });
    Ok((summary, remembered))
}
