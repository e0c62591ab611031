//! What bounds the webhook's use of memory, CPU and the log, whatever its
//! clients send:
//!
//! - [`read_body`]: no body over [`MAX_BODY_BYTES`] is buffered, and a body
//!   must arrive within [`BODY_READ_TIMEOUT`] of its headers (the API
//!   server sends it at once);
//! - [`Admission`]: a body is read only within a byte budget, bodies up to
//!   [`SMALL_BODY_BYTES`] in [`SMALL_BODY_BUDGET`], larger ones (or of
//!   unknown size) in [`LARGE_BODY_BUDGET`] (two maximum-size reviews: one
//!   parsed while the next is read); one peer address holds or waits for
//!   at most [`PEER_SHARE`] of each, so however slowly one client sends,
//!   another's bodies are read at once. Once read, at most
//!   [`MAX_IN_FLIGHT`] requests are parsed and decided at once;
//! - [`discard`]: a request answered before its body was read whole (too
//!   large, no room, too slow, not answered in time) has what is still
//!   arriving read and dropped for as long as it keeps coming at
//!   [`DRAIN_MIN_RATE`] after a [`DRAIN_GRACE`], within [`DRAIN_MAX_TIME`]
//!   and [`DRAIN_MAX_BYTES`], so its client reads the answer instead of a
//!   reset in the middle of its body;
//! - [`LogBudget`]: lines about what one client sent (a malformed review, a
//!   denial) are written at most [`LOG_LINES_PER_WINDOW`] per
//!   [`LOG_WINDOW`]; the next line written says how many were left out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use futures::StreamExt;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Requests parsed and decided at once (their bodies have arrived).
pub const MAX_IN_FLIGHT: usize = 64;
/// Bodies up to this size are read in [`SMALL_BODY_BUDGET`].
pub const SMALL_BODY_BYTES: u64 = 64 * 1024;
/// Bytes of small bodies read at once: 512 reviews of the largest small
/// size, thousands of ordinary ones.
pub const SMALL_BODY_BUDGET: u64 = 32 * 1024 * 1024;
/// Bytes of larger bodies read at once: two maximum-size reviews.
pub const LARGE_BODY_BUDGET: u64 = 6 * 1024 * 1024;
/// The share of each body budget one peer address may hold or wait for:
/// one half, so that one client, however many connections it opens and
/// however slowly it sends, leaves the other half to the others (the API
/// server among them).
pub const PEER_SHARE: u64 = 2;
/// Time a body over [`SMALL_BODY_BYTES`] (or of unknown size) waits for
/// room before it is answered 429: shorter than for small ones, so a flood
/// of large reviews is told to come back later at once rather than held
/// while the CPU goes to them.
pub const LARGE_QUEUE_WAIT: Duration = Duration::from_millis(500);
/// Time a body gets to arrive once its headers have: the API server sends
/// a review at once, so only a client that trickles its body hits it.
/// Past it the answer is 408.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// What a refused request's body may take to arrive and be dropped before
/// any of it counts: past it, the body must keep arriving at
/// [`DRAIN_MIN_RATE`] or the answer is sent anyway (and the connection
/// closed).
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// Bytes a second a refused request's body must arrive at, on average
/// after [`DRAIN_GRACE`], to be read to its end: a maximum-size review
/// takes at most 12 s at this rate, a body trickled a byte a second is cut
/// at the grace.
pub const DRAIN_MIN_RATE: u64 = 256 * 1024;
/// Time a refused request's body is read and dropped at most, however
/// fast it arrives.
pub const DRAIN_MAX_TIME: Duration = Duration::from_secs(15);
/// Bytes of a refused request's body read and dropped at most.
pub const DRAIN_MAX_BYTES: u64 = 2 * MAX_BODY_BYTES as u64;
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
    read_stream(&mut body.into_data_stream(), max).await
}

/// [`read_body`] of a body's stream, which is left where reading stopped
/// (so that the rest of a body over the limit can be [`discard`]ed).
pub async fn read_stream(
    stream: &mut axum::body::BodyDataStream,
    max: usize,
) -> Result<Bytes, BodyError> {
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

/// Reads what is left of a request's body once its answer is decided
/// without it, and drops it: whether it ended. The body may take
/// [`DRAIN_GRACE`] plus a second for each [`DRAIN_MIN_RATE`] bytes that
/// arrived, at most [`DRAIN_MAX_TIME`] and [`DRAIN_MAX_BYTES`]: a client
/// that keeps writing reads its answer, one that trickles is cut. A client
/// still writing its body when the connection closes would see it reset
/// under it, which the API server counts as a failed call, not as an
/// answer to retry. A body already read to its end returns at once.
pub async fn discard(stream: &mut axum::body::BodyDataStream) -> bool {
    let started = Instant::now();
    let last = started + DRAIN_MAX_TIME;
    let mut read = 0u64;
    loop {
        let earned = Duration::from_secs_f64(read as f64 / DRAIN_MIN_RATE as f64);
        let deadline = (started + DRAIN_GRACE + earned).min(last);
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) | Ok(Some(Err(_))) => return false,
            Ok(None) => return true,
            Ok(Some(Ok(chunk))) => {
                read += chunk.len() as u64;
                if read > DRAIN_MAX_BYTES {
                    return false;
                }
            }
        }
    }
}

pub(super) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Room for requests: bodies being read, within byte budgets shared fairly
/// between peer addresses, and decisions under way.
#[derive(Clone)]
pub struct Admission {
    in_flight: Arc<Semaphore>,
    small: FairBudget,
    large: FairBudget,
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(MAX_IN_FLIGHT, SMALL_BODY_BUDGET, LARGE_BODY_BUDGET)
    }
}

/// Held while a body is read and until its request is decided.
pub struct Reservation {
    _grant: Grant,
}

/// Held while a request is parsed and decided.
pub struct Permit {
    _in_flight: OwnedSemaphorePermit,
}

/// Budgets count KiB.
const UNIT: u64 = 1024;

impl Admission {
    pub fn new(max_in_flight: usize, small_budget_bytes: u64, large_budget_bytes: u64) -> Self {
        Admission {
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            small: FairBudget::new(small_budget_bytes / UNIT),
            large: FairBudget::new(large_budget_bytes / UNIT),
        }
    }

    /// Whether a body of `declared` bytes (`None`: unknown) is read in the
    /// large budget.
    pub fn is_large(declared: Option<u64>) -> bool {
        declared.is_none_or(|n| n > SMALL_BODY_BYTES)
    }

    /// Room to read a body of `declared` bytes (`None`: unknown, counted
    /// as `max` bytes) from `peer`, waiting at most `wait`; `None` when
    /// there was none in time. Room now (the common case) arms no timer.
    pub async fn reserve(
        &self,
        peer: Option<IpAddr>,
        declared: Option<u64>,
        max: u64,
        wait: Duration,
    ) -> Option<Reservation> {
        let size = declared.unwrap_or(max).min(max);
        let budget = if Admission::is_large(declared) {
            &self.large
        } else {
            &self.small
        };
        let grant = budget.take(peer, size.div_ceil(UNIT), wait).await?;
        Some(Reservation { _grant: grant })
    }

    /// A place among the requests decided at once, within `wait`.
    pub async fn enter(&self, wait: Duration) -> Option<Permit> {
        let permit = match self.in_flight.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => tokio::time::timeout(wait, self.in_flight.clone().acquire_owned())
                .await
                .ok()?
                .ok()?,
        };
        Some(Permit { _in_flight: permit })
    }

    /// Requests that could be decided now.
    pub fn available(&self) -> usize {
        self.in_flight.available_permits()
    }
}

/// A budget of units (KiB) of which one peer address holds or waits for at
/// most `1 / PEER_SHARE`. The peer's share is taken before the budget
/// itself, so one peer's waiters never queue ahead of more than its share.
#[derive(Clone)]
struct FairBudget {
    units: Arc<Semaphore>,
    total: u64,
    per_peer: u64,
    shares: Arc<Shares>,
}

#[derive(Default)]
struct Shares {
    /// Units each peer holds or waits for (`None`: a request whose peer is
    /// unknown, as in tests that call the router directly).
    held: Mutex<HashMap<Option<IpAddr>, u64>>,
    released: Notify,
}

/// Units of a [`FairBudget`] held; returned when dropped.
struct Grant {
    _units: Option<OwnedSemaphorePermit>,
    _share: Share,
}

/// A peer's part of its share, given back when dropped.
struct Share {
    shares: Arc<Shares>,
    peer: Option<IpAddr>,
    units: u64,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut held = crate::locks::lock(&self.shares.held);
        if let Some(n) = held.get_mut(&self.peer) {
            *n = n.saturating_sub(self.units);
            if *n == 0 {
                held.remove(&self.peer);
            }
        }
        drop(held);
        self.shares.released.notify_waiters();
    }
}

impl FairBudget {
    fn new(total_units: u64) -> Self {
        let total = total_units.clamp(1, Semaphore::MAX_PERMITS as u64 / 2);
        FairBudget {
            units: Arc::new(Semaphore::new(total as usize)),
            total,
            per_peer: (total / PEER_SHARE).max(1),
            shares: Arc::default(),
        }
    }

    /// Takes the peer's share of `units`, then the units, within `wait`.
    async fn take(&self, peer: Option<IpAddr>, units: u64, wait: Duration) -> Option<Grant> {
        let peer = peer.map(|ip| ip.to_canonical());
        let units = units.clamp(1, self.per_peer);
        let deadline = Instant::now() + wait;
        let share = loop {
            let released = self.shares.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(share) = self.try_share(peer, units) {
                break share;
            }
            tokio::time::timeout_at(deadline, released).await.ok()?;
        };
        let count = u32::try_from(units.min(self.total)).unwrap_or(u32::MAX);
        let permit = match self.units.clone().try_acquire_many_owned(count) {
            Ok(permit) => permit,
            Err(_) => {
                tokio::time::timeout_at(deadline, self.units.clone().acquire_many_owned(count))
                    .await
                    .ok()?
                    .ok()?
            }
        };
        Some(Grant {
            _units: Some(permit),
            _share: share,
        })
    }

    fn try_share(&self, peer: Option<IpAddr>, units: u64) -> Option<Share> {
        let mut held = crate::locks::lock(&self.shares.held);
        let mine = held.entry(peer).or_insert(0);
        if *mine + units > self.per_peer {
            return None;
        }
        *mine += units;
        Some(Share {
            shares: self.shares.clone(),
            peer,
            units,
        })
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

    const MAX: u64 = 3 * 1024 * 1024;

    fn peer(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    #[tokio::test(start_paused = true)]
    async fn large_bodies_share_a_budget_small_ones_do_not() {
        let admission = Admission::new(4, 1 << 20, 4 * 1024 * 1024);
        let wait = Duration::from_secs(1);
        let big = admission.reserve(peer(1), Some(2 << 20), MAX, wait).await;
        let big2 = admission.reserve(peer(2), Some(2 << 20), MAX, wait).await;
        assert!(big.is_some() && big2.is_some());
        // The budget is spent: a third large body waits and is refused ...
        assert!(admission.reserve(peer(3), None, MAX, wait).await.is_none());
        // ... a small one is not.
        assert!(admission
            .reserve(peer(3), Some(100), MAX, wait)
            .await
            .is_some());
        drop(big);
        assert!(admission
            .reserve(peer(3), Some(1 << 20), MAX, wait)
            .await
            .is_some());
    }

    /// One peer holds or waits for at most half of a budget, however many
    /// requests it sends: another peer's body still finds room at once.
    #[tokio::test(start_paused = true)]
    async fn one_peer_holds_at_most_its_share() {
        let admission = Admission::new(4, 64 * 1024, 4 * 1024 * 1024);
        let wait = Duration::from_secs(1);
        let mut held = Vec::new();
        for _ in 0..32 {
            if let Some(r) = admission.reserve(peer(9), Some(1024), MAX, wait).await {
                held.push(r);
            }
        }
        assert_eq!(held.len(), 32, "half of 64 KiB in 1 KiB bodies");
        assert!(admission
            .reserve(peer(9), Some(1024), MAX, wait)
            .await
            .is_none());
        for _ in 0..32 {
            let other = admission.reserve(peer(1), Some(1024), MAX, Duration::ZERO);
            assert!(other.await.is_some(), "another peer waited");
        }
        // A body as large as the whole small budget takes the peer's share.
        drop(held);
        assert!(admission
            .reserve(peer(9), Some(64 * 1024), MAX, Duration::ZERO)
            .await
            .is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_peer_gets_room_when_its_own_requests_end() {
        let admission = Admission::new(4, 2 * 1024, 4 * 1024 * 1024);
        let first = admission
            .reserve(peer(1), Some(1024), MAX, Duration::ZERO)
            .await;
        assert!(first.is_some());
        let second = tokio::spawn({
            let admission = admission.clone();
            async move {
                admission
                    .reserve(peer(1), Some(1024), MAX, Duration::from_secs(1))
                    .await
                    .is_some()
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(first);
        assert!(second.await.unwrap());
    }

    #[tokio::test]
    async fn decisions_take_places_within_the_wait() {
        let admission = Admission::new(1, 1 << 20, 1 << 20);
        let one = admission.enter(Duration::ZERO).await;
        assert!(one.is_some());
        assert_eq!(admission.available(), 0);
        assert!(admission.enter(Duration::from_millis(20)).await.is_none());
        drop(one);
        assert!(admission.enter(Duration::from_millis(20)).await.is_some());
    }
}
