//! What bounds the webhook's use of memory, CPU and the log, whatever its
//! clients send:
//!
//! - [`read_body`]: no body over [`MAX_BODY_BYTES`] is buffered;
//! - [`Admission`]: at most [`MAX_IN_FLIGHT`] requests are read and decided
//!   at once; bodies over [`SMALL_BODY_BYTES`] also share a budget of
//!   [`LARGE_BODY_BUDGET`] bytes (two maximum-size reviews: one parsed
//!   while the next is read), so a flood of maximum-size reviews can take
//!   neither the CPU nor more memory than the budget from the small ones;
//! - [`LogBudget`]: lines about what one client sent (a malformed review, a
//!   denial) are written at most [`LOG_LINES_PER_WINDOW`] per
//!   [`LOG_WINDOW`]; the next line written says how many were left out.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Requests read and decided at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Bodies up to this size only count against [`MAX_IN_FLIGHT`].
pub const SMALL_BODY_BYTES: u64 = 64 * 1024;
/// Bytes of larger bodies read at once: two maximum-size reviews.
pub const LARGE_BODY_BUDGET: u64 = 6 * 1024 * 1024;
/// Time a body over [`SMALL_BODY_BYTES`] (or of unknown size) waits for
/// room before it is answered 429: shorter than for small ones, so a flood
/// of large reviews is told to come back later at once rather than held
/// while the CPU goes to them.
pub const LARGE_QUEUE_WAIT: Duration = Duration::from_millis(500);
/// Log lines about client input per window.
pub const LOG_LINES_PER_WINDOW: u32 = 20;
pub const LOG_WINDOW: Duration = Duration::from_secs(10);

/// Largest request body accepted: the API server's own request limit.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Time one request gets, from its headers to the answer: the webhook
/// configuration's `timeoutSeconds` (5). Past it the answer is 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("reading the request body: {0}")]
    Read(#[from] axum::Error),
}

/// Reads a body, refusing it as soon as it passes `max` bytes: nothing over
/// the limit is ever buffered. A body that arrives in one piece (a small
/// review usually does) is kept as it came, without a copy.
pub async fn read_body(body: axum::body::Body, max: usize) -> Result<Bytes, BodyError> {
    let mut stream = body.into_data_stream();
    let (mut first, mut out) = (Bytes::new(), Vec::new());
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if first.len() + out.len() + chunk.len() > max {
            return Err(BodyError::TooLarge);
        }
        if out.is_empty() && first.is_empty() {
            first = chunk;
        } else {
            out.extend_from_slice(&std::mem::take(&mut first));
            out.extend_from_slice(&chunk);
        }
    }
    Ok(if out.is_empty() {
        first
    } else {
        Bytes::from(out)
    })
}

pub(super) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Permits for requests in flight.
#[derive(Clone)]
pub struct Admission {
    in_flight: Arc<Semaphore>,
    large: Arc<Semaphore>,
    /// The whole large-body budget, in units.
    large_units: u64,
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(MAX_IN_FLIGHT, LARGE_BODY_BUDGET)
    }
}

/// Held while a request is read and decided.
pub struct Permit {
    _in_flight: OwnedSemaphorePermit,
    _large: Option<OwnedSemaphorePermit>,
}

/// Permits of the large-body budget count KiB.
const UNIT: u64 = 1024;

impl Admission {
    pub fn new(max_in_flight: usize, large_budget_bytes: u64) -> Self {
        let units = usize::try_from(large_budget_bytes / UNIT).unwrap_or(usize::MAX);
        let units = units.clamp(1, Semaphore::MAX_PERMITS);
        Admission {
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            large: Arc::new(Semaphore::new(units)),
            large_units: units as u64,
        }
    }

    /// Units of the large-body budget a body of `declared` bytes takes
    /// (`None`: unknown, counted as `max` bytes); `None` for a small body.
    fn large_units_for(&self, declared: Option<u64>, max: u64) -> Option<u32> {
        let size = declared.unwrap_or(max).min(max);
        (size > SMALL_BODY_BYTES).then(|| {
            let units = size.div_ceil(UNIT).min(self.large_units);
            u32::try_from(units).unwrap_or(u32::MAX)
        })
    }

    /// Waits for room for a body of `declared` bytes (`None`: unknown,
    /// counted as `max` bytes); bodies over the budget are refused before.
    pub async fn admit(&self, declared: Option<u64>, max: u64) -> Permit {
        let large = match self.large_units_for(declared, max) {
            // Never closed: acquiring cannot fail.
            Some(units) => self.large.clone().acquire_many_owned(units).await.ok(),
            None => None,
        };
        let in_flight = self.in_flight.clone().acquire_owned().await;
        Permit {
            _in_flight: in_flight.unwrap_or_else(|_| unreachable!("the semaphore is never closed")),
            _large: large,
        }
    }

    /// [`Self::admit`] when there is room now, without waiting: the
    /// common case, which then arms no timer for the wait.
    pub fn try_admit(&self, declared: Option<u64>, max: u64) -> Option<Permit> {
        let large = match self.large_units_for(declared, max) {
            Some(units) => Some(self.large.clone().try_acquire_many_owned(units).ok()?),
            None => None,
        };
        let in_flight = self.in_flight.clone().try_acquire_owned().ok()?;
        Some(Permit {
            _in_flight: in_flight,
            _large: large,
        })
    }

    /// [`Self::admit`] within `wait`; `None` when there was no room in
    /// time. Room now (the common case) arms no timer.
    pub async fn enter(&self, declared: Option<u64>, max: u64, wait: Duration) -> Option<Permit> {
        match self.try_admit(declared, max) {
            Some(permit) => Some(permit),
            None => tokio::time::timeout(wait, self.admit(declared, max))
                .await
                .ok(),
        }
    }

    /// Requests that could start now.
    pub fn available(&self) -> usize {
        self.in_flight.available_permits()
    }
}

/// A budget of log lines per window.
pub struct LogBudget {
    state: Mutex<(Instant, u32, u64)>,
    per_window: u32,
    window: Duration,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget::new(LOG_LINES_PER_WINDOW, LOG_WINDOW)
    }
}

impl LogBudget {
    pub fn new(per_window: u32, window: Duration) -> Self {
        LogBudget {
            state: Mutex::new((Instant::now(), 0, 0)),
            per_window,
            window,
        }
    }

    /// `Some(left out since the last line written)` when a line may be
    /// written now; `None` when it is to be left out (and counted).
    pub fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (start, used, suppressed) = &mut *state;
        if start.elapsed() >= self.window {
            *start = Instant::now();
            *used = 0;
        }
        if *used >= self.per_window {
            *suppressed += 1;
            return None;
        }
        *used += 1;
        Some(std::mem::take(suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_log_budget_refills_and_counts_what_it_left_out() {
        let budget = LogBudget::new(2, Duration::from_secs(10));
        assert_eq!(budget.allow(), Some(0));
        assert_eq!(budget.allow(), Some(0));
        for _ in 0..1000 {
            assert_eq!(budget.allow(), None);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(budget.allow(), Some(1000));
        assert_eq!(budget.allow(), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn large_bodies_share_a_budget_small_ones_do_not() {
        let admission = Admission::new(4, 2 * 1024 * 1024);
        let max = 3 * 1024 * 1024;
        let big = admission.admit(Some(1024 * 1024), max).await;
        let _big2 = admission.admit(Some(1024 * 1024), max).await;
        // The budget is spent: a third large body waits ...
        let third = tokio::time::timeout(Duration::from_secs(1), admission.admit(None, max)).await;
        assert!(third.is_err());
        // ... a small one does not.
        let _small = admission.admit(Some(100), max).await;
        drop(big);
        let _third =
            tokio::time::timeout(Duration::from_secs(1), admission.admit(Some(1 << 20), max))
                .await
                .expect("room again");
        // The count of requests is bounded too.
        assert_eq!(admission.available(), 1);
        let _fourth = admission.admit(Some(1), max).await;
        let fifth =
            tokio::time::timeout(Duration::from_secs(1), admission.admit(Some(1), max)).await;
        assert!(fifth.is_err());
        assert!(admission.try_admit(Some(1), max).is_none());
    }

    #[tokio::test]
    async fn try_admit_takes_room_that_is_there_and_waits_for_none() {
        let admission = Admission::new(2, 2 * 1024 * 1024);
        let max = 3 * 1024 * 1024;
        let big = admission
            .try_admit(Some(2 * 1024 * 1024), max)
            .expect("room");
        // The large budget is spent, the count is not.
        assert!(admission.try_admit(Some(1024 * 1024), max).is_none());
        assert!(admission.try_admit(None, max).is_none());
        assert_eq!(admission.available(), 1);
        let small = admission.try_admit(Some(10), max).expect("a small one");
        assert!(admission.try_admit(Some(10), max).is_none());
        let waited = admission.enter(Some(10), max, Duration::from_millis(20));
        assert!(waited.await.is_none());
        drop((big, small));
        let entered = admission.enter(Some(10), max, Duration::from_millis(20));
        assert!(entered.await.is_some());
        assert_eq!(admission.available(), 2);
        let _again = admission
            .try_admit(Some(1024 * 1024), max)
            .expect("room again");
    }
}
