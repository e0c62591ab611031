//! The webhook server's edges: which connections keep a place (those that
//! sent a request; one that has not makes room for a newer one), what each
//! connection asks and when it was last busy, and the shutdown drain
//! (answers that ask HTTP/1.1 clients to close).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
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

/// The address a request came from, set by the connection it came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer(pub IpAddr);
/// The connections a new one may take the place of when the server is
/// full: those of the peer address with the most connections open, first
/// those that have not sent a request yet, oldest first, then those with
/// no request in flight, idle the longest first. One client opening
/// connections by the thousand thus closes its own, not the API server's.
#[derive(Clone, Debug, Default)]
pub struct Waiting(Arc<Mutex<WaitingList>>);

#[derive(Debug, Default)]
struct WaitingList {
    next: u64,
    peers: HashMap<IpAddr, PeerPlaces>,
    /// Each connection's peer and, while it is idle, its stamp in `idle`.
    places: HashMap<u64, (IpAddr, Option<u64>)>,
    /// Connections that could make room, over every peer.
    evictable: usize,
}

/// One peer address's connections.
#[derive(Debug, Default)]
struct PeerPlaces {
    open: usize,
    /// Those that have not asked yet, by age: each one's signal to close.
    fresh: BTreeMap<u64, CancellationToken>,
    /// Those that asked and have nothing in flight, by when their last
    /// request ended: each one's id and signal to close.
    idle: BTreeMap<u64, (u64, CancellationToken)>,
}

impl WaitingList {
    fn stamp(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        n
    }

    /// Takes `id` out of the connections that could make room.
    fn forget(&mut self, id: u64) {
        let Some((peer, idle)) = self.places.get_mut(&id) else {
            return;
        };
        let (peer, stamp) = (*peer, idle.take());
        let Some(places) = self.peers.get_mut(&peer) else {
            return;
        };
        let removed = match stamp {
            Some(stamp) => places.idle.remove(&stamp).is_some(),
            None => places.fresh.remove(&id).is_some(),
        };
        if removed {
            self.evictable -= 1;
        }
    }
}

impl Waiting {
    /// Registers a new connection from `peer` as waiting for its first
    /// request.
    pub fn enter(&self, peer: IpAddr) -> FirstRequest {
        let mut list = locks::lock(&self.0);
        let id = list.stamp();
        let evict = CancellationToken::new();
        let places = list.peers.entry(peer).or_default();
        places.open += 1;
        places.fresh.insert(id, evict.clone());
        list.places.insert(id, (peer, None));
        list.evictable += 1;
        FirstRequest {
            id,
            evict,
            waiting: self.clone(),
        }
    }

    /// Whether no connection could make room.
    pub fn is_empty(&self) -> bool {
        locks::lock(&self.0).evictable == 0
    }

    /// Tells one connection of the peer with the most connections open to
    /// close: the oldest without a request, else the one idle the longest;
    /// false when no connection could make room.
    pub fn evict_oldest(&self) -> bool {
        let mut list = locks::lock(&self.0);
        let Some(peer) = list
            .peers
            .iter()
            .filter(|(_, p)| !p.fresh.is_empty() || !p.idle.is_empty())
            .max_by_key(|(_, p)| p.open)
            .map(|(peer, _)| *peer)
        else {
            return false;
        };
        let Some(places) = list.peers.get_mut(&peer) else {
            return false;
        };
        let (id, evict) = match places.fresh.pop_first() {
            Some(fresh) => fresh,
            None => match places.idle.pop_first() {
                Some((_, idle)) => idle,
                None => return false,
            },
        };
        if let Some((_, stamp)) = list.places.get_mut(&id) {
            *stamp = None;
        }
        list.evictable -= 1;
        evict.cancel();
        true
    }

    /// The connection `id` has a request in flight: it cannot make room.
    fn busy(&self, id: u64) {
        locks::lock(&self.0).forget(id);
    }

    /// The connection `id` has nothing in flight since now.
    fn idle(&self, id: u64, evict: &CancellationToken) {
        let mut list = locks::lock(&self.0);
        list.forget(id);
        if evict.is_cancelled() {
            return;
        }
        let stamp = list.stamp();
        let Some((peer, idle)) = list.places.get_mut(&id) else {
            return;
        };
        *idle = Some(stamp);
        let peer = *peer;
        if let Some(places) = list.peers.get_mut(&peer) {
            places.idle.insert(stamp, (id, evict.clone()));
            list.evictable += 1;
        }
    }

    fn leave(&self, id: u64) {
        let mut list = locks::lock(&self.0);
        list.forget(id);
        let Some((peer, _)) = list.places.remove(&id) else {
            return;
        };
        if let Some(places) = list.peers.get_mut(&peer) {
            places.open -= 1;
            if places.open == 0 {
                list.peers.remove(&peer);
            }
        }
    }
}

/// One connection's place among the [`Waiting`] ones, left while it has a
/// request in flight and when it ends.
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

    fn busy(&self) {
        self.waiting.busy(self.id);
    }

    fn idle(&self) {
        self.waiting.idle(self.id, &self.evict);
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
    peer: IpAddr,
    asked: AtomicBool,
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection began).
    since: Mutex<Instant>,
}

impl Activity {
    pub fn new(first: FirstRequest, peer: IpAddr) -> Self {
        Activity(Arc::new(ActivityState {
            first,
            peer,
            asked: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        }))
    }

    /// `app`, noting each request of this connection and where it came
    /// from ([`Peer`]).
    pub fn track(&self, app: Router) -> Router {
        app.layer(axum::middleware::from_fn_with_state(self.clone(), note))
    }

    /// Whether the connection has sent a request.
    pub fn asked(&self) -> bool {
        self.0.asked.load(Ordering::SeqCst)
    }

    /// Completes when a newer connection takes this one's place (before
    /// its first request, or while it has none in flight).
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
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    let state = &activity.0;
    state.asked.store(true, Ordering::SeqCst);
    request.extensions_mut().insert(Peer(state.peer));
    if state.in_flight.fetch_add(1, Ordering::SeqCst) == 0 {
        state.first.busy();
    }
    let response = next.run(request).await;
    *locks::lock(&state.since) = Instant::now();
    if state.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
        state.first.idle();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn the_oldest_connection_without_a_request_makes_room() {
        let waiting = Waiting::default();
        let (a, b, c) = (
            waiting.enter(ip(1)),
            waiting.enter(ip(1)),
            waiting.enter(ip(1)),
        );
        b.busy();
        assert!(waiting.evict_oldest());
        assert!(a.evict.is_cancelled() && !c.evict.is_cancelled());
        // b has a request in flight: c goes next, then nobody.
        assert!(waiting.evict_oldest());
        assert!(c.evict.is_cancelled() && !b.evict.is_cancelled());
        assert!(!waiting.evict_oldest());
        drop((a, b, c));
        let d = waiting.enter(ip(1));
        drop(d);
        assert!(waiting.is_empty());
        assert!(locks::lock(&waiting.0).peers.is_empty());
    }

    /// Connections that sent requests make room too once none is waiting
    /// for its first: the one idle the longest first, never one with a
    /// request in flight.
    #[test]
    fn connections_idle_the_longest_make_room_after_the_fresh_ones() {
        let waiting = Waiting::default();
        let enter = || waiting.enter(ip(1));
        let (a, b, c, d) = (enter(), enter(), enter(), enter());
        for place in [&a, &b, &c] {
            place.busy();
        }
        b.idle();
        a.idle();
        // c is busy, d never asked: d first, then b (idle since before a).
        assert!(waiting.evict_oldest());
        assert!(d.evict.is_cancelled());
        assert!(waiting.evict_oldest());
        assert!(b.evict.is_cancelled() && !a.evict.is_cancelled());
        // a asks again, then is idle again: c, busy, never goes.
        a.busy();
        assert!(!waiting.evict_oldest());
        a.idle();
        assert!(waiting.evict_oldest());
        assert!(a.evict.is_cancelled() && !c.evict.is_cancelled());
        assert!(!waiting.evict_oldest());
        drop((a, b, c, d));
        assert!(waiting.is_empty());
    }

    /// The peer with the most connections open makes room first, even
    /// when another peer's connection is older.
    #[test]
    fn the_peer_with_the_most_connections_makes_room_first() {
        let waiting = Waiting::default();
        let quiet = waiting.enter(ip(1));
        let many: Vec<_> = (0..3).map(|_| waiting.enter(ip(2))).collect();
        for place in &many {
            place.busy();
        }
        many[2].idle();
        // ip(2) has three open, one idle: it goes before ip(1)'s older one.
        assert!(waiting.evict_oldest());
        assert!(many[2].evict.is_cancelled() && !quiet.evict.is_cancelled());
        // Nothing more of ip(2) can go: ip(1)'s makes room.
        assert!(waiting.evict_oldest());
        assert!(quiet.evict.is_cancelled());
        assert!(!waiting.evict_oldest());
    }
}
