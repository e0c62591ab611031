//! How a failed watch is retried: soon, and again from the first step
//! only once it works.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The first delay before a failed watch is retried.
pub const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest delay between retries of a failed watch. Short, so that a
/// watch is back within seconds of the API server's return: kube's default
/// (up to 30 s, reset only after 2 min without errors) left the owner index
/// and the controllers that long behind an API server restart. A retry
/// every few seconds per watch costs a dead API server nothing.
pub const BACKOFF_MAX: Duration = Duration::from_secs(4);

/// Exponential backoff from [`BACKOFF_MIN`] to [`BACKOFF_MAX`], each delay
/// between half and all of its step (so replicas do not retry in step),
/// reset by [`WatchBackoff::worked`] ([`super::retry::retrying`] calls it
/// when the watch [`works`](super::retry::works) again). kube resets a
/// backoff on every item its stream yields, and its watcher yields an Init before each attempt
/// at a list, so a list that kept failing would be retried at the first
/// step forever; that reset does nothing here.
#[derive(Clone, Debug, Default)]
pub struct WatchBackoff {
    failures: Arc<AtomicU32>,
}

impl WatchBackoff {
    /// The watch works again: the next failure waits the first step.
    pub fn worked(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let failures = self
            .failures
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                Some(f.saturating_add(1))
            })
            .unwrap_or_else(|f| f);
        let step = BACKOFF_MIN
            .saturating_mul(1 << failures.min(16))
            .min(BACKOFF_MAX);
        // Jitter from the clock's nanoseconds: good enough to spread retries.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let half = step / 2;
        Some(half + half.mul_f64(f64::from(nanos % 1000) / 1000.0))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_grows_to_its_bound_and_resets() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = backoff.by_ref().take(12).collect();
        assert!(delays[0] >= BACKOFF_MIN / 2 && delays[0] <= BACKOFF_MIN);
        assert!(delays.iter().all(|d| *d <= BACKOFF_MAX));
        assert!(delays[11] >= BACKOFF_MAX / 2, "{delays:?}");
        backoff.reset();
        assert!(
            backoff.next().is_some_and(|d| d >= BACKOFF_MAX / 2),
            "kube's reset on every item is ignored"
        );
        backoff.worked();
        assert!(backoff.next().is_some_and(|d| d <= BACKOFF_MIN));
    }
}
