//! When to fetch: on the interval after a success, sooner (with a capped
//! exponential backoff) after a failure, and at once when the request
//! changed, a reconcile was requested, or the artifact file is missing.

use std::time::{Duration, Instant};

/// The last fetch attempt of a source, kept in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub at: Instant,
    /// The request fingerprint of that attempt.
    pub fingerprint: String,
    /// Consecutive failures up to and including that attempt (0: it succeeded).
    pub failures: u32,
}

/// What triggers a fetch regardless of timing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Triggers {
    /// `reconcile.fluxcd.io/requestedAt` holds a value not yet handled.
    pub requested: bool,
    /// The spec's generation was not handled yet.
    pub new_generation: bool,
    /// The published artifact's file is in storage (or none is published).
    pub stored: bool,
}

/// Longest wait between retries after failures.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);

/// Delay before retrying after `failures` consecutive failures: 1s, 2s, 4s...
/// capped at [`MAX_RETRY_DELAY`], and never longer than the interval.
pub fn retry_delay(failures: u32, interval: Duration) -> Duration {
    let backoff = Duration::from_secs(1u64 << failures.saturating_sub(1).min(16));
    backoff.min(MAX_RETRY_DELAY).min(interval)
}

/// `None`: fetch now. `Some(d)`: the next fetch is due in `d`.
pub fn next_fetch(
    last: Option<&Attempt>,
    now: Instant,
    interval: Duration,
    fingerprint: &str,
    triggers: Triggers,
) -> Option<Duration> {
    let last = last?;
    if triggers.requested
        || triggers.new_generation
        || !triggers.stored
        || last.fingerprint != fingerprint
    {
        return None;
    }
    let period = if last.failures == 0 {
        interval
    } else {
        retry_delay(last.failures, interval)
    };
    let elapsed = now.saturating_duration_since(last.at);
    if elapsed >= period {
        None
    } else {
        Some(period - elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn steady() -> Triggers {
        Triggers {
            stored: true,
            ..Triggers::default()
        }
    }

    fn attempt(at: Instant, failures: u32) -> Attempt {
        Attempt {
            at,
            fingerprint: "f".into(),
            failures,
        }
    }

    #[test]
    fn fetches_first_then_on_the_interval() {
        let t0 = Instant::now();
        assert_eq!(next_fetch(None, t0, MIN, "f", steady()), None);
        let last = attempt(t0, 0);
        assert_eq!(
            next_fetch(
                Some(&last),
                t0 + Duration::from_secs(20),
                MIN,
                "f",
                steady()
            ),
            Some(Duration::from_secs(40))
        );
        assert_eq!(next_fetch(Some(&last), t0 + MIN, MIN, "f", steady()), None);
    }

    #[test]
    fn fetches_at_once_on_triggers() {
        let t0 = Instant::now();
        let last = attempt(t0, 0);
        let soon = t0 + Duration::from_secs(1);
        for triggers in [
            Triggers {
                requested: true,
                ..steady()
            },
            Triggers {
                new_generation: true,
                ..steady()
            },
            Triggers {
                stored: false,
                ..steady()
            },
        ] {
            assert_eq!(next_fetch(Some(&last), soon, MIN, "f", triggers), None);
        }
        assert_eq!(next_fetch(Some(&last), soon, MIN, "other", steady()), None);
    }

    #[test]
    fn retries_failures_with_backoff() {
        assert_eq!(retry_delay(1, MIN), Duration::from_secs(1));
        assert_eq!(retry_delay(2, MIN), Duration::from_secs(2));
        assert_eq!(retry_delay(5, MIN), Duration::from_secs(16));
        assert_eq!(retry_delay(10, MIN), MIN);
        assert_eq!(retry_delay(40, Duration::from_secs(3600)), MAX_RETRY_DELAY);
        let t0 = Instant::now();
        let failed = attempt(t0, 3);
        assert_eq!(
            next_fetch(
                Some(&failed),
                t0 + Duration::from_secs(1),
                MIN,
                "f",
                steady()
            ),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            next_fetch(
                Some(&failed),
                t0 + Duration::from_secs(4),
                MIN,
                "f",
                steady()
            ),
            None
        );
    }
}
