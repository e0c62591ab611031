//! Retrying a failed reconcile as Flux does: per object, exponentially from
//! `--min-retry-delay` (750ms) to `--max-retry-delay` (15m), starting over
//! once the object reconciles (controller-runtime's per-item exponential
//! failure rate limiter, with `fluxcd/pkg/runtime/controller`'s flags).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use clap::Args;

use crate::duration;

fn parse_duration(s: &str) -> Result<Duration, String> {
    duration::parse(s).map_err(|e| e.to_string())
}

/// `--min-retry-delay` and `--max-retry-delay`.
#[derive(Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryArgs {
    /// The minimum amount of time to wait before retrying a failed
    /// reconcile of an object (duration string).
    #[arg(long, default_value = "750ms", value_parser = parse_duration)]
    pub min_retry_delay: Duration,
    /// The maximum amount of time to wait before retrying a failed
    /// reconcile of an object (duration string).
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub max_retry_delay: Duration,
}

impl Default for RetryArgs {
    fn default() -> Self {
        RetryArgs {
            min_retry_delay: Duration::from_millis(750),
            max_retry_delay: Duration::from_secs(15 * 60),
        }
    }
}

impl RetryArgs {
    /// The delay before the retry after `failures` failures in a row (1 for
    /// the first): `min * 2^(failures - 1)`, at most `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(63);
        let factor = 1u64 << doublings;
        let nanos = (self.min_retry_delay.as_nanos() as u64).saturating_mul(factor);
        Duration::from_nanos(nanos).min(self.max_retry_delay)
    }
}

/// The failures in a row of each object that is failing; an object leaves
/// it when it reconciles, so it holds only the objects failing now.
pub struct Retries<K> {
    args: RetryArgs,
    failing: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash> Retries<K> {
    pub fn new(args: RetryArgs) -> Self {
        Retries {
            args,
            failing: Mutex::default(),
        }
    }

    /// Records one more failure of `key`: the delay before its retry.
    pub fn failed(&self, key: K) -> Duration {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        let failures = failing.entry(key).or_insert(0);
        *failures = failures.saturating_add(1);
        self.args.delay(*failures)
    }

    /// `key` reconciled (or is gone): its next failure starts over.
    pub fn succeeded(&self, key: &K) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        failing.remove(key);
    }

    /// How many objects are failing now.
    pub fn len(&self) -> usize {
        self.failing.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The backoff of one loop that keeps one thing up to date (a Secret, a
/// webhook configuration): the wait after each failure in a row doubles
/// from [`Backoff::LOOP`]'s minimum (1 s) to its maximum (60 s), and starts
/// over after a success. The same rule as [`Retries`], for one key.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    args: RetryArgs,
    failures: u32,
}

impl Backoff {
    /// The delays of a loop: from 1 s to 60 s.
    pub const LOOP: RetryArgs = RetryArgs {
        min_retry_delay: Duration::from_secs(1),
        max_retry_delay: Duration::from_secs(60),
    };

    pub fn new(args: RetryArgs) -> Self {
        Backoff { args, failures: 0 }
    }

    /// Records one more failure: the wait before the next try.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.args.delay(self.failures)
    }

    /// A success: the next failure starts over.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// The longest wait.
    pub fn max(&self) -> Duration {
        self.args.max_retry_delay
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Backoff::LOOP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loops_backoff_doubles_to_a_minute_and_starts_over_after_a_success() {
        let mut backoff = Backoff::default();
        let secs = |d: Duration| d.as_secs();
        let waits: Vec<u64> = (0..8).map(|_| secs(backoff.failed())).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        backoff.succeeded();
        assert_eq!(secs(backoff.failed()), 1);
        assert_eq!(backoff.max(), Duration::from_secs(60));
    }

    #[test]
    fn delays_double_from_the_minimum_to_the_maximum() {
        let args = RetryArgs::default();
        let ms = |f| args.delay(f).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4)], [750, 1500, 3000, 6000]);
        assert_eq!(args.delay(11), Duration::from_millis(750 * 1024));
        assert_eq!(args.delay(12), Duration::from_secs(15 * 60), "capped");
        assert_eq!(args.delay(u32::MAX), Duration::from_secs(15 * 60));
    }

    #[test]
    fn each_object_backs_off_on_its_own_and_starts_over_after_a_success() {
        let retries = Retries::new(RetryArgs::default());
        assert_eq!(retries.failed("a"), Duration::from_millis(750));
        assert_eq!(retries.failed("a"), Duration::from_millis(1500));
        assert_eq!(
            retries.failed("b"),
            Duration::from_millis(750),
            "b is not a"
        );
        assert_eq!(retries.failed("a"), Duration::from_millis(3000));
        retries.succeeded(&"a");
        assert_eq!(retries.len(), 1, "only b is failing");
        assert_eq!(retries.failed("a"), Duration::from_millis(750));
    }

    #[test]
    fn the_flags_take_flux_names_and_go_durations() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            retry: RetryArgs,
        }
        let cli = Cli::parse_from(["c"]);
        assert_eq!(cli.retry, RetryArgs::default());
        let cli = Cli::parse_from(["c", "--min-retry-delay=2s", "--max-retry-delay", "1m30s"]);
        assert_eq!(cli.retry.min_retry_delay, Duration::from_secs(2));
        assert_eq!(cli.retry.max_retry_delay, Duration::from_secs(90));
    }
}
