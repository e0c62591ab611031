//! The webhook server's edges: which connections keep a place (those that
//! sent a request; one that has not makes room for a newer one), what each
//! connection asks and when it was last busy, and the shutdown drain
//! (answers that ask HTTP/1.1 clients to close).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::Response;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::locks;

/// After the shutdown signal, how long the webhook keeps accepting and
/// answering, each answer asking its client to close the connection
/// (`Connection: close`), before it closes the connections left idle. An
/// API server whose endpoints have not caught up yet still sends here;
/// closing an idle kept-alive connection at once races its next request,
/// which then fails as a broken pipe instead of being answered.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(3);

/// While draining, every answer asks its HTTP/1.1 client to close the
/// connection after reading it, so no client reuses a connection this
/// webhook is about to close. (HTTP/2 clients are told by the GOAWAY of
/// the graceful shutdown, which they retry on.)
pub async fn close_when_draining(
    State(draining): State<Arc<AtomicBool>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let http1 = request.version() <= axum::http::Version::HTTP_11;
    let mut response = next.run(request).await;
    if http1 && draining.load(Ordering::SeqCst) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The connections that have not sent a request yet, oldest first: the
/// ones a new connection may take the place of.
#[derive(Clone, Debug, Default)]
pub struct Waiting(Arc<Mutex<WaitingList>>);

#[derive(Debug, Default)]
struct WaitingList {
    next: u64,
    /// By age: each one's signal to close.
    connections: BTreeMap<u64, CancellationToken>,
}

impl Waiting {
    /// Registers a new connection as waiting for its first request.
    pub fn enter(&self) -> FirstRequest {
        let mut list = locks::lock(&self.0);
        let id = list.next;
        list.next += 1;
        let evict = CancellationToken::new();
        list.connections.insert(id, evict.clone());
        FirstRequest {
            id,
            evict,
            waiting: self.clone(),
        }
    }

    /// Whether no connection is waiting for its first request.
    pub fn is_empty(&self) -> bool {
        locks::lock(&self.0).connections.is_empty()
    }

    /// Tells the oldest connection without a request to close; false when
    /// there is none.
    pub fn evict_oldest(&self) -> bool {
        match locks::lock(&self.0).connections.pop_first() {
            Some((_, evict)) => {
                evict.cancel();
                true
            }
            None => false,
        }
    }

    fn leave(&self, id: u64) {
        locks::lock(&self.0).connections.remove(&id);
    }
}

/// One connection's place among the [`Waiting`] ones, left at its first
/// request or when it ends.
#[derive(Debug)]
pub struct FirstRequest {
    id: u64,
    evict: CancellationToken,
    waiting: Waiting,
}

impl FirstRequest {
    /// Completes when a newer connection takes this one's place.
    pub async fn evicted(&self) {
        self.evict.cancelled().await;
    }

    fn asked(&self) {
        self.waiting.leave(self.id);
    }
}

impl Drop for FirstRequest {
    fn drop(&mut self) {
        self.waiting.leave(self.id);
    }
}

/// What one connection has asked: whether it sent a request yet, how many
/// are in flight, and since when none has been.
#[derive(Clone, Debug)]
pub struct Activity(Arc<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    first: FirstRequest,
    asked: AtomicBool,
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection began).
    since: Mutex<Instant>,
}

impl Activity {
    pub fn new(first: FirstRequest) -> Self {
        Activity(Arc::new(ActivityState {
            first,
            asked: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        }))
    }

    /// `app`, noting each request of this connection.
    pub fn track(&self, app: Router) -> Router {
        app.layer(axum::middleware::from_fn_with_state(self.clone(), note))
    }

    /// Whether the connection has sent a request.
    pub fn asked(&self) -> bool {
        self.0.asked.load(Ordering::SeqCst)
    }

    /// Completes when a newer connection takes this one's place (only
    /// before its first request).
    pub async fn evicted(&self) {
        self.0.first.evicted().await;
    }

    /// How long no request has been in flight (zero while one is).
    pub fn idle_for(&self) -> Duration {
        if self.0.in_flight.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        locks::lock(&self.0.since).elapsed()
    }
}

async fn note(
    State(activity): State<Activity>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let state = &activity.0;
    if !state.asked.swap(true, Ordering::SeqCst) {
        state.first.asked();
    }
    state.in_flight.fetch_add(1, Ordering::SeqCst);
    let response = next.run(request).await;
    *locks::lock(&state.since) = Instant::now();
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_connection_without_a_request_makes_room() {
        let waiting = Waiting::default();
        let (a, b, c) = (waiting.enter(), waiting.enter(), waiting.enter());
        b.asked();
        assert!(waiting.evict_oldest());
        assert!(a.evict.is_cancelled() && !c.evict.is_cancelled());
        // b asked and is no longer waiting: c goes next, then nobody.
        assert!(waiting.evict_oldest());
        assert!(c.evict.is_cancelled() && !b.evict.is_cancelled());
        assert!(!waiting.evict_oldest());
        drop((a, b, c));
        let d = waiting.enter();
        drop(d);
        assert!(waiting.is_empty());
    }
}
