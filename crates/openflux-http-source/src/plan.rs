//! Decisions a reconcile takes as plain functions: whether a spec can be
//! acted on, what a failure means for the status and the next attempt, and
//! how the reconcile counts in Flux's metrics.

use std::time::Duration;

use kube::runtime::controller::Action;
use openflux_api::duration;
use openflux_api::producer::archive::{ArchiveError, IgnoreRules};
use openflux_api::producer::digest::{Algorithm, Digest};
use openflux_api::runtime::ReconcileResult;
use openflux_api::ArtifactSpec;

use crate::api::{reason, ArtifactSummary, HttpSourceSpec};
use crate::schedule;

/// A spec made usable.
#[derive(Debug, Clone)]
pub struct Plan {
    pub url: reqwest::Url,
    pub interval: Duration,
    pub timeout: Duration,
    pub ignore: IgnoreRules,
    /// The expected digest of the artifact.
    pub digest: Option<Digest>,
}

/// Validates a spec. The CRD schema checks most of it; this also covers
/// objects written while the schema was older.
pub fn plan(spec: &HttpSourceSpec) -> Result<Plan, String> {
    let url = reqwest::Url::parse(&spec.url).map_err(|e| format!("invalid url: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("unsupported url scheme {:?}", url.scheme()));
    }
    let interval = duration::parse(&spec.interval).map_err(|e| format!("interval: {e}"))?;
    if interval.is_zero() {
        return Err("interval must be greater than zero".into());
    }
    let timeout = duration::parse(&spec.timeout).map_err(|e| format!("timeout: {e}"))?;
    if timeout.is_zero() {
        return Err("timeout must be greater than zero".into());
    }
    let digest = match &spec.digest {
        Some(d) => match d.parse::<Digest>() {
            Ok(digest) if digest.algorithm() == Algorithm::Sha256 => Some(digest),
            _ => return Err(format!("digest {d:?} is not sha256:<64 lowercase hex>")),
        },
        None => None,
    };
    let ignore = IgnoreRules::parse(spec.ignore.as_deref())?;
    Ok(Plan {
        url,
        interval,
        timeout,
        ignore,
        digest,
    })
}

/// When to try again after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Soon, with backoff: the cause is likely transient.
    Backoff,
    /// On the interval: the remote content is the problem.
    Interval,
    /// Not until the spec changes.
    Never,
}

/// Why nothing new could be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
    pub retry: Retry,
}

impl Failure {
    pub fn new(reason: &'static str, message: impl Into<String>, retry: Retry) -> Self {
        Failure {
            reason,
            message: message.into(),
            retry,
        }
    }

    /// When to reconcile again after `failures` consecutive failures.
    pub fn action(&self, failures: u32, interval: Duration) -> Action {
        match self.retry {
            Retry::Backoff => Action::requeue(schedule::retry_delay(failures, interval)),
            Retry::Interval => Action::requeue(interval),
            Retry::Never => Action::await_change(),
        }
    }

    /// How the reconcile counts: a failure that is retried is an error, as
    /// a Flux reconciler returns one; a stall is not (Flux returns no error
    /// and waits for a change of the spec).
    pub fn result(&self) -> ReconcileResult {
        match self.retry {
            Retry::Never => ReconcileResult::Success,
            Retry::Backoff | Retry::Interval => ReconcileResult::Error,
        }
    }
}

/// The failure an archive error means.
pub fn archive_failure(e: ArchiveError) -> Failure {
    match e {
        ArchiveError::Invalid(m) | ArchiveError::Unreadable(m) => {
            Failure::new(reason::INVALID_ARTIFACT, m, Retry::Interval)
        }
        ArchiveError::Rejected(m) => Failure::new(reason::ARCHIVE_REJECTED, m, Retry::Interval),
    }
}

/// How one reconcile ended.
#[derive(Debug, Clone)]
pub struct Done {
    pub action: Action,
    pub result: ReconcileResult,
    /// The Ready status afterwards, when the reconcile decided it.
    pub ready: Option<bool>,
}

impl Done {
    /// Nothing to do until the object changes.
    pub fn idle() -> Self {
        Done {
            action: Action::await_change(),
            result: ReconcileResult::Success,
            ready: None,
        }
    }

    /// Published; the next run is on the interval.
    pub fn published(interval: Duration) -> Self {
        Done {
            action: Action::requeue(interval),
            result: ReconcileResult::RequeueAfter,
            ready: Some(true),
        }
    }

    /// Not due yet: the next run in `wait`.
    pub fn not_due(wait: Duration) -> Self {
        Done {
            action: Action::requeue(wait),
            result: ReconcileResult::RequeueAfter,
            ready: None,
        }
    }

    /// Failed; see [`Failure::action`] and [`Failure::result`].
    pub fn failed(failure: &Failure, failures: u32, interval: Duration) -> Self {
        Done {
            action: failure.action(failures, interval),
            result: failure.result(),
            ready: Some(false),
        }
    }
}

/// The Artifact spec an HttpSource publishes (under its own name, owned by
/// it: see `openflux_api::producer::publish`).
pub fn artifact_spec(summary: &ArtifactSummary) -> ArtifactSpec {
    ArtifactSpec {
        url: summary.url.clone(),
        revision: summary.revision.clone(),
        digest: Some(summary.digest.clone()),
        path: Some(summary.path.clone()),
        size: Some(summary.size),
        last_update_time: Some(summary.last_update_time.clone()),
        metadata: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> HttpSourceSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn plans_valid_specs_and_explains_invalid_ones() {
        let ok = plan(&spec(
            serde_json::json!({"url": "https://e.com/a.tgz", "interval": "1m30s"}),
        ))
        .unwrap();
        assert_eq!(ok.interval, Duration::from_secs(90));
        assert_eq!(ok.timeout, Duration::from_secs(60));
        assert!(ok.digest.is_none());

        for (json, needle) in [
            (
                serde_json::json!({"url": "ftp://e.com/a", "interval": "1m"}),
                "scheme",
            ),
            (
                serde_json::json!({"url": "not a url", "interval": "1m"}),
                "invalid url",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "1d"}),
                "interval",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "0s"}),
                "greater than zero",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "1m", "digest": "sha256:XY"}),
                "digest",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "1m", "digest": format!("sha512:{}", "a".repeat(128))}),
                "digest",
            ),
            (
                serde_json::json!({"url": "http://e", "interval": "1m", "ignore": "a{b\n[z-a]\n"}),
                "ignore",
            ),
        ] {
            let err = plan(&spec(json.clone())).unwrap_err();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn failures_count_as_flux_counts_them() {
        let interval = Duration::from_secs(600);
        let transient = Failure::new(reason::FETCH_FAILED, "refused", Retry::Backoff);
        let done = Done::failed(&transient, 3, interval);
        assert_eq!(done.result, ReconcileResult::Error);
        assert_eq!(done.ready, Some(false));
        assert_eq!(
            done.action,
            Action::requeue(schedule::retry_delay(3, interval))
        );
        let content = Failure::new(reason::DIGEST_MISMATCH, "differs", Retry::Interval);
        assert_eq!(
            Done::failed(&content, 1, interval).action,
            Action::requeue(interval)
        );
        let stalled = Failure::new(reason::INVALID_SPEC, "bad url", Retry::Never);
        let done = Done::failed(&stalled, 1, interval);
        assert_eq!(done.result, ReconcileResult::Success);
        assert_eq!(done.action, Action::await_change());
        assert_eq!(
            Done::published(interval).result,
            ReconcileResult::RequeueAfter
        );
    }

    #[test]
    fn archive_errors_become_reasons() {
        let rejected = archive_failure(ArchiveError::Rejected("link".into()));
        assert_eq!(rejected.reason, reason::ARCHIVE_REJECTED);
        let invalid = archive_failure(ArchiveError::Invalid("html".into()));
        assert_eq!(invalid.reason, reason::INVALID_ARTIFACT);
        assert_eq!(invalid.retry, Retry::Interval);
    }
}
