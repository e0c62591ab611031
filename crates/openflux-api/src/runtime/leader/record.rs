//! The pure part of leader election: what to do with the Lease, given what
//! it says now, what this candidate saw before, and its own clock.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;

/// What to do with the Lease, given what it says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is none: create it, held by us.
    Create,
    /// Nobody holds it, or its holder stopped renewing: take it over.
    Take,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it and renews it.
    Wait { holder: String },
}

/// The Lease as last seen, and when (on the local clock) it was first seen
/// so. Any write to the Lease changes its resourceVersion, so a holder whose
/// renew time does not move (a frozen or coarse clock) still counts as
/// renewing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub holder: String,
    pub version: String,
    pub since: Duration,
}

/// The Lease as read: its spec (`None`: the object has no spec) and its
/// resourceVersion.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    pub spec: Option<&'a LeaseSpec>,
    pub version: &'a str,
}

/// Decides from the Lease (`None`: there is none), what was observed before,
/// and the local monotonic time `now`. Returns the new observation too.
///
/// A Lease held by another candidate is taken only when it has not changed
/// for its lease duration (the holder's `leaseDurationSeconds`, else
/// `lease_duration`) since this candidate first saw it: expiry is judged on
/// the local clock alone, so the clocks of the replicas may disagree.
pub fn decide(
    lease: Option<Seen<'_>>,
    me: &str,
    before: Option<&Observed>,
    now: Duration,
    lease_duration: Duration,
) -> (Decision, Option<Observed>) {
    let Some(lease) = lease else {
        return (Decision::Create, None);
    };
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default();
    let observed = match before {
        Some(b) if b.holder == holder && b.version == lease.version => b.clone(),
        _ => Observed {
            holder: holder.clone(),
            version: lease.version.to_string(),
            since: now,
        },
    };
    let duration = lease
        .spec
        .and_then(|s| s.lease_duration_seconds)
        .filter(|s| *s > 0)
        .map_or(lease_duration, |s| {
            Duration::from_secs(s.unsigned_abs().into())
        });
    let decision = if holder.is_empty() {
        Decision::Take
    } else if holder == me {
        Decision::Renew
    } else if now.saturating_sub(observed.since) >= duration {
        Decision::Take
    } else {
        Decision::Wait { holder }
    };
    (decision, Some(observed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    const DURATION: Duration = Duration::from_secs(35);

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..LeaseSpec::default()
        }
    }

    fn seen<'a>(spec: &'a LeaseSpec, version: &'a str) -> Option<Seen<'a>> {
        Some(Seen {
            spec: Some(spec),
            version,
        })
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn creates_a_missing_lease_and_renews_its_own() {
        let now = secs(1);
        assert_eq!(decide(None, "me", None, now, DURATION).0, Decision::Create);
        let mine = held_by("me", 100);
        let d = decide(seen(&mine, "1"), "me", None, now, DURATION).0;
        assert_eq!(d, Decision::Renew);
        let free = LeaseSpec::default();
        let d = decide(seen(&free, "1"), "me", None, now, DURATION).0;
        assert_eq!(d, Decision::Take);
    }

    #[test]
    fn takes_a_lease_only_after_it_stood_still_for_a_lease_duration() {
        let theirs = held_by("other", 100);
        let (d, seen1) = decide(seen(&theirs, "1"), "me", None, secs(0), DURATION);
        let waiting = Decision::Wait {
            holder: "other".into(),
        };
        assert_eq!(d, waiting);
        // Unchanged, but not for long enough yet.
        let (d, seen1) = decide(seen(&theirs, "1"), "me", seen1.as_ref(), secs(20), DURATION);
        assert_eq!(d, waiting);
        // The holder renewed: the clock starts again.
        let renewed = held_by("other", 120);
        let (d, seen2) = decide(
            seen(&renewed, "2"),
            "me",
            seen1.as_ref(),
            secs(40),
            DURATION,
        );
        assert_eq!(d, waiting);
        // Unchanged for a whole lease duration since: it is ours to take.
        let (d, _) = decide(
            seen(&renewed, "2"),
            "me",
            seen2.as_ref(),
            secs(75),
            DURATION,
        );
        assert_eq!(d, Decision::Take);
    }

    #[test]
    fn a_write_counts_as_renewal_even_with_the_same_renew_time() {
        // A holder whose wall clock stands still still renews: the
        // resourceVersion moves.
        let theirs = held_by("other", 100);
        let (_, seen1) = decide(seen(&theirs, "1"), "me", None, secs(0), DURATION);
        let (d, _) = decide(seen(&theirs, "2"), "me", seen1.as_ref(), secs(50), DURATION);
        assert!(matches!(d, Decision::Wait { .. }));
    }

    #[test]
    fn the_remote_clock_does_not_matter_and_its_lease_duration_does() {
        // A renew time far in the past is still a fresh record when first seen.
        let stale_looking = held_by("other", 1);
        let (d, _) = decide(seen(&stale_looking, "1"), "me", None, secs(0), DURATION);
        assert!(matches!(d, Decision::Wait { .. }));
        // The holder's own lease duration rules.
        let mut short = held_by("other", 1);
        short.lease_duration_seconds = Some(10);
        let (_, o) = decide(seen(&short, "1"), "me", None, secs(0), DURATION);
        let (d, _) = decide(seen(&short, "1"), "me", o.as_ref(), secs(10), DURATION);
        assert_eq!(d, Decision::Take);
    }
}
