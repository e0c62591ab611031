//! The status an outcome implies, and the Events a status change implies.
//! Plain functions: the controller writes what they return.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{condition, reason, ArtifactSummary, HttpSourceStatus};

/// How a reconcile ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// This artifact is published (new, or the same as before).
    Published(ArtifactSummary),
    /// Nothing could be published; the last artifact, if any, stays.
    Failed {
        reason: &'static str,
        message: String,
        /// Retrying cannot help until the spec changes.
        stalled: bool,
    },
}

/// Sets a condition, keeping its transition time when its status is unchanged.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" };
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time: transition,
    });
    conditions.sort_by_key(|c| order(&c.type_));
}

fn order(type_: &str) -> u8 {
    match type_ {
        condition::READY => 0,
        condition::RECONCILING => 1,
        condition::STALLED => 2,
        _ => 3,
    }
}

fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// The Ready message of a published artifact (Flux's wording).
pub fn stored_message(revision: &str) -> String {
    format!("stored artifact for revision '{revision}'")
}

/// The status after an outcome. `requested_at` is the current
/// `reconcile.fluxcd.io/requestedAt` value, recorded as handled.
pub fn next_status(
    current: Option<&HttpSourceStatus>,
    generation: Option<i64>,
    requested_at: Option<&str>,
    outcome: &Outcome,
    now: &Time,
) -> HttpSourceStatus {
    let mut status = current.cloned().unwrap_or_default();
    if requested_at.is_some() {
        status.last_handled_reconcile_at = requested_at.map(str::to_string);
    }
    let conditions = &mut status.conditions;
    match outcome {
        Outcome::Published(artifact) => {
            let message = stored_message(&artifact.revision);
            set_condition(
                conditions,
                condition::READY,
                true,
                reason::SUCCEEDED,
                &message,
                generation,
                now,
            );
            remove_condition(conditions, condition::RECONCILING);
            remove_condition(conditions, condition::STALLED);
            status.artifact = Some(artifact.clone());
            status.observed_generation = generation;
        }
        Outcome::Failed {
            reason,
            message,
            stalled,
        } => {
            set_condition(
                conditions,
                condition::READY,
                false,
                reason,
                message,
                generation,
                now,
            );
            if *stalled {
                set_condition(
                    conditions,
                    condition::STALLED,
                    true,
                    reason,
                    message,
                    generation,
                    now,
                );
                remove_condition(conditions, condition::RECONCILING);
                status.observed_generation = generation;
            } else {
                set_condition(
                    conditions,
                    condition::RECONCILING,
                    true,
                    reason::PROGRESSING_WITH_RETRY,
                    message,
                    generation,
                    now,
                );
                remove_condition(conditions, condition::STALLED);
            }
        }
    }
    status
}

/// An Event to emit.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub warning: bool,
    pub reason: String,
    pub message: String,
    /// The artifact a success is about (its revision and digest travel with
    /// the event, as Flux's do).
    pub artifact: Option<ArtifactSummary>,
}

/// The Events a status change deserves: a new revision, a new failure (not
/// the same failure again), and a recovery.
pub fn notices(old: Option<&HttpSourceStatus>, new: &HttpSourceStatus, url: &str) -> Vec<Notice> {
    let ready = |s: Option<&HttpSourceStatus>| {
        s.and_then(|s| s.conditions.iter().find(|c| c.type_ == condition::READY))
            .cloned()
    };
    let (was, is) = (ready(old), ready(Some(new)));
    let old_revision = old.and_then(|s| s.artifact.as_ref()).map(|a| &a.revision);
    let new_revision = new.artifact.as_ref().map(|a| &a.revision);
    let mut out = Vec::new();
    let Some(is) = is else { return out };
    if is.status == "True" {
        if new_revision != old_revision {
            if let Some(revision) = new_revision {
                out.push(Notice {
                    warning: false,
                    reason: reason::NEW_ARTIFACT.to_string(),
                    message: format!("stored artifact with revision '{revision}' from '{url}'"),
                    artifact: new.artifact.clone(),
                });
            }
        } else if was.as_ref().is_some_and(|w| w.status != "True") {
            out.push(Notice {
                warning: false,
                reason: is.reason.clone(),
                message: is.message.clone(),
                artifact: new.artifact.clone(),
            });
        }
    } else if was
        .as_ref()
        .is_none_or(|w| w.status == "True" || w.reason != is.reason || w.message != is.message)
    {
        out.push(Notice {
            warning: true,
            reason: is.reason.clone(),
            message: is.message.clone(),
            artifact: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn artifact(revision: &str) -> ArtifactSummary {
        ArtifactSummary {
            url: "http://storage/ns/a/x.tar.gz".into(),
            revision: revision.into(),
            digest: revision.into(),
            path: "ns/a/x.tar.gz".into(),
            size: 10,
            last_update_time: at(1),
        }
    }

    fn failed(stalled: bool) -> Outcome {
        Outcome::Failed {
            reason: reason::FETCH_FAILED,
            message: "GET http://x: connection refused".into(),
            stalled,
        }
    }

    fn cond<'a>(s: &'a HttpSourceStatus, t: &str) -> Option<&'a Condition> {
        s.conditions.iter().find(|c| c.type_ == t)
    }

    #[test]
    fn success_sets_ready_and_the_artifact() {
        let s = next_status(
            None,
            Some(2),
            Some("now"),
            &Outcome::Published(artifact("sha256:aa")),
            &at(10),
        );
        let ready = cond(&s, condition::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", reason::SUCCEEDED)
        );
        assert_eq!(ready.message, "stored artifact for revision 'sha256:aa'");
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(s.last_handled_reconcile_at.as_deref(), Some("now"));
        assert_eq!(s.artifact, Some(artifact("sha256:aa")));
        assert_eq!(s.conditions.len(), 1);
    }

    #[test]
    fn a_transient_failure_keeps_the_artifact_and_retries() {
        let good = next_status(
            None,
            Some(1),
            None,
            &Outcome::Published(artifact("sha256:aa")),
            &at(10),
        );
        let s = next_status(Some(&good), Some(2), None, &failed(false), &at(20));
        assert_eq!(s.artifact, Some(artifact("sha256:aa")));
        let ready = cond(&s, condition::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reason::FETCH_FAILED)
        );
        assert_eq!(ready.last_transition_time, at(20));
        assert_eq!(
            cond(&s, condition::RECONCILING).unwrap().reason,
            reason::PROGRESSING_WITH_RETRY
        );
        assert!(cond(&s, condition::STALLED).is_none());
        // A retrying failure does not claim the generation was handled.
        assert_eq!(s.observed_generation, Some(1));

        // The same failure again keeps its transition time; recovery clears it.
        let again = next_status(Some(&s), Some(2), None, &failed(false), &at(30));
        assert_eq!(
            cond(&again, condition::READY).unwrap().last_transition_time,
            at(20)
        );
        let back = next_status(
            Some(&again),
            Some(2),
            None,
            &Outcome::Published(artifact("sha256:aa")),
            &at(40),
        );
        assert_eq!(back.conditions.len(), 1);
        assert_eq!(
            cond(&back, condition::READY).unwrap().last_transition_time,
            at(40)
        );
    }

    #[test]
    fn a_stalling_failure_sets_stalled() {
        let s = next_status(None, Some(3), None, &failed(true), &at(10));
        assert_eq!(cond(&s, condition::STALLED).unwrap().status, "True");
        assert!(cond(&s, condition::RECONCILING).is_none());
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(
            s.conditions
                .iter()
                .map(|c| c.type_.as_str())
                .collect::<Vec<_>>(),
            ["Ready", "Stalled"]
        );
    }

    #[test]
    fn events_follow_changes_only() {
        let url = "http://x/a.tgz";
        let first = next_status(
            None,
            Some(1),
            None,
            &Outcome::Published(artifact("sha256:aa")),
            &at(1),
        );
        let n = notices(None, &first, url);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].reason, "NewArtifact");
        assert!(!n[0].warning);
        assert_eq!(n[0].artifact, Some(artifact("sha256:aa")));
        // Same revision again: nothing to say.
        assert!(notices(Some(&first), &first, url).is_empty());

        let down = next_status(Some(&first), Some(1), None, &failed(false), &at(2));
        let n = notices(Some(&first), &down, url);
        assert_eq!(n.len(), 1);
        assert!(n[0].warning);
        assert_eq!(n[0].reason, reason::FETCH_FAILED);
        assert_eq!(n[0].artifact, None);
        // The same failure again is not repeated.
        assert!(notices(Some(&down), &down, url).is_empty());

        let up = next_status(
            Some(&down),
            Some(1),
            None,
            &Outcome::Published(artifact("sha256:aa")),
            &at(3),
        );
        let n = notices(Some(&down), &up, url);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].reason, reason::SUCCEEDED);

        let changed = next_status(
            Some(&up),
            Some(1),
            None,
            &Outcome::Published(artifact("sha256:bb")),
            &at(4),
        );
        assert_eq!(
            notices(Some(&up), &changed, url)[0].message,
            "stored artifact with revision 'sha256:bb' from 'http://x/a.tgz'"
        );
    }
}
