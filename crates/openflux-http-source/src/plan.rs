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

use crate::api::{reason, ArtifactSummary, HttpSourceSpec, MAX_INTERVAL, MAX_TIMEOUT};
use crate::redirect::take_userinfo;
use crate::schedule;

/// A spec made usable.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `spec.url` without its userinfo.
    pub url: reqwest::Url,
    /// The userinfo of `spec.url`, decoded: basic auth credentials, sent
    /// only to the URL's origin.
    pub userinfo: Option<(String, String)>,
    /// At most [`MAX_INTERVAL`].
    pub interval: Duration,
    /// At most [`MAX_TIMEOUT`].
    pub timeout: Duration,
    pub ignore: IgnoreRules,
    /// The expected digest of the artifact.
    pub digest: Option<Digest>,
}

/// Validates a spec. The CRD schema checks most of it; this also covers
/// objects written while the schema was older.
///
/// Durations beyond the schema's bounds (objects written before the bounds
/// existed) are clamped to them, so no timer or deadline computed from them
/// can overflow.
pub fn plan(spec: &HttpSourceSpec) -> Result<Plan, String> {
    let mut url = reqwest::Url::parse(&spec.url).map_err(|e| format!("invalid url: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("unsupported url scheme {:?}", url.scheme()));
    }
    let userinfo = take_userinfo(&mut url);
    url.set_fragment(None);
    let interval = bounded(&spec.interval, MAX_INTERVAL).map_err(|e| format!("interval: {e}"))?;
    let timeout = bounded(&spec.timeout, MAX_TIMEOUT).map_err(|e| format!("timeout: {e}"))?;
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
        userinfo,
        interval,
        timeout,
        ignore,
        digest,
    })
}

/// A Go duration greater than zero, clamped to `max`.
fn bounded(text: &str, max: Duration) -> Result<Duration, String> {
    let d = duration::parse(text).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d.min(max))
}

/// Requeue after `delay`, never later than [`MAX_INTERVAL`] (a deadline
/// computed from it cannot overflow).
pub fn requeue(delay: Duration) -> Action {
    Action::requeue(delay.min(MAX_INTERVAL))
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
            Retry::Backoff => requeue(schedule::retry_delay(failures, interval)),
            Retry::Interval => requeue(interval),
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
            action: requeue(interval),
            result: ReconcileResult::RequeueAfter,
            ready: Some(true),
        }
    }

    /// Not due yet: the next run in `wait`.
    pub fn not_due(wait: Duration) -> Self {
        Done {
            action: requeue(wait),
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
        exported_inputs: None,
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
                serde_json::json!({"url": "http://e", "interval": "1m", "timeout": "0s"}),
                "timeout",
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
    fn takes_credentials_out_of_the_url() {
        let p = plan(&spec(serde_json::json!({
            "url": "https://user:pa%20ss@e.com/a.tgz#x", "interval": "1m"
        })))
        .unwrap();
        assert_eq!(p.url.as_str(), "https://e.com/a.tgz");
        assert_eq!(p.userinfo, Some(("user".into(), "pa ss".into())));
    }

    /// A huge interval (or timeout) in an object the schema did not check is
    /// clamped, and no requeue or deadline computed from it overflows.
    #[test]
    fn clamps_huge_durations() {
        let p = plan(&spec(serde_json::json!({
            "url": "https://e.com/a.tgz",
            "interval": "99999999999999h",
            "timeout": "5000000000h",
        })))
        .unwrap();
        assert_eq!(p.interval, MAX_INTERVAL);
        assert_eq!(p.timeout, MAX_TIMEOUT);
        let now = std::time::Instant::now();
        assert!(now.checked_add(p.interval).is_some());
        assert!(tokio::time::Instant::now().checked_add(p.timeout).is_some());
        assert_eq!(
            Done::published(p.interval).action,
            Action::requeue(MAX_INTERVAL)
        );
        assert_eq!(requeue(Duration::MAX), Action::requeue(MAX_INTERVAL));
        let f = Failure::new(reason::FETCH_FAILED, "x", Retry::Interval);
        assert_eq!(
            f.action(u32::MAX, Duration::MAX),
            Action::requeue(MAX_INTERVAL)
        );
        let b = Failure::new(reason::FETCH_FAILED, "x", Retry::Backoff);
        assert_eq!(
            b.action(u32::MAX, Duration::MAX),
            Action::requeue(schedule::MAX_RETRY_DELAY)
        );
        // Beyond what a Duration holds: rejected, not wrapped.
        assert!(plan(&spec(serde_json::json!({
            "url": "https://e.com/a.tgz", "interval": format!("{}h", "9".repeat(40))
        })))
        .is_err());
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
