//! The health endpoints (`--health-addr`) and serving the kit's routers.
//!
//! `/healthz` answers while the process runs; `/readyz` once the controller
//! said it is ready (for a controller: its watch has synced), as the probes
//! of Flux's Deployments expect. [`Watches`] tells whether a watch has been
//! failing for too long, so `/readyz` can turn false on a replica whose
//! view of the cluster went stale.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// Readiness, shared by whoever can tell and the endpoint.
#[derive(Clone)]
pub struct Health {
    ready: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            ready: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

impl Health {
    pub fn set_ready(&self) {
        self.ready.send_replace(true);
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Resolves once ready.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives as long as self: this cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// `/healthz` (alive) and `/readyz` (ready).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(self.clone())
    }
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    if health.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// The state of the watches a process depends on. A watch loop holds a
/// [`WatchTicker`] and ticks it: [`WatchTicker::failed`] on each error of
/// its stream, [`WatchTicker::ok`] on each event. A watch is broken when
/// its errors began more than `stale_after` ago and kept coming (the last
/// one within `quiet_after`, longer than the watch's longest backoff: a
/// watch that reconnected quietly, without an event, stops counting as
/// broken then). A ticker dropped (its watch stopped) counts no more.
#[derive(Clone)]
pub struct Watches {
    inner: Arc<Mutex<WatchTable>>,
    stale_after: Duration,
    quiet_after: Duration,
}

/// The first and the last error of a watch's current streak of errors.
type Streak = (tokio::time::Instant, tokio::time::Instant);

/// Each registered watch: its id, its name and its streak of errors.
#[derive(Default)]
struct WatchTable {
    next: u64,
    failing: Vec<(u64, String, Option<Streak>)>,
}

impl Watches {
    pub fn new(stale_after: Duration, quiet_after: Duration) -> Self {
        Watches {
            inner: Arc::default(),
            stale_after,
            quiet_after,
        }
    }

    /// A ticker for one more watch, named for messages.
    pub fn register(&self, name: &str) -> WatchTicker {
        let mut table = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        table.next += 1;
        let id = table.next;
        table.failing.push((id, name.to_string(), None));
        WatchTicker {
            id,
            watches: Some(self.clone()),
        }
    }

    /// The first watch broken for longer than the bound, and for how long.
    pub fn broken(&self) -> Option<(String, Duration)> {
        self.all_broken().into_iter().next()
    }

    /// Every watch broken for longer than the bound, and for how long.
    pub fn all_broken(&self) -> Vec<(String, Duration)> {
        let now = tokio::time::Instant::now();
        let table = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        table
            .failing
            .iter()
            .filter_map(|(_, name, streak)| {
                let (first, last) = (*streak)?;
                let broken_for = now.duration_since(first);
                (broken_for > self.stale_after && now.duration_since(last) <= self.quiet_after)
                    .then(|| (name.clone(), broken_for))
            })
            .collect()
    }

    fn tick(&self, id: u64, failed: bool) {
        let now = tokio::time::Instant::now();
        let mut table = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = table.failing.iter_mut().find(|e| e.0 == id) {
            entry.2 = match (failed, entry.2) {
                (false, _) => None,
                (true, Some((first, last))) if now.duration_since(last) <= self.quiet_after => {
                    Some((first, now))
                }
                (true, _) => Some((now, now)),
            };
        }
    }
}

/// One watch's handle on [`Watches`].
pub struct WatchTicker {
    id: u64,
    watches: Option<Watches>,
}

impl WatchTicker {
    /// The watch's stream delivered an event: it works.
    pub fn ok(&self) {
        if let Some(w) = &self.watches {
            w.tick(self.id, false);
        }
    }

    /// The watch's stream failed (it retries on its own).
    pub fn failed(&self) {
        if let Some(w) = &self.watches {
            w.tick(self.id, true);
        }
    }

    /// A ticker that counts nowhere.
    pub fn detached() -> Self {
        WatchTicker {
            id: 0,
            watches: None,
        }
    }
}

impl Drop for WatchTicker {
    fn drop(&mut self) {
        if let Some(w) = &self.watches {
            let mut table = w.inner.lock().unwrap_or_else(|e| e.into_inner());
            table.failing.retain(|e| e.0 != self.id);
        }
    }
}

/// A server that could not start.
#[derive(Debug, thiserror::Error)]
#[error("binding the {name} server to {addr}: {source}")]
pub struct ServeError {
    pub name: String,
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr` and serves `router` in the background. Binding happens
/// before this returns, so a taken port is an error at start; the address
/// actually bound is returned (port 0 picks a free one).
pub async fn serve(name: &str, addr: SocketAddr, router: Router) -> Result<SocketAddr, ServeError> {
    let failed = |source| ServeError {
        name: name.to_string(),
        addr,
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(failed)?;
    let bound = listener.local_addr().map_err(failed)?;
    tracing::info!(addr = %bound, "{name} server listening");
    let name = name.to_string();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "{name} server stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get_status(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response.lines().next().unwrap_or_default().to_string()
    }

    #[tokio::test]
    async fn readiness_turns_true_once_set() {
        let health = Health::default();
        let addr = serve("health", "127.0.0.1:0".parse().unwrap(), health.router())
            .await
            .unwrap();
        assert!(get_status(addr, "/healthz").await.contains("200"));
        assert!(get_status(addr, "/readyz").await.contains("503"));
        let waiter = tokio::spawn({
            let health = health.clone();
            async move { health.wait_ready().await }
        });
        health.set_ready();
        waiter.await.unwrap();
        assert!(get_status(addr, "/readyz").await.contains("200"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_is_broken_after_failing_past_the_bound() {
        let watches = Watches::new(Duration::from_secs(60), Duration::from_secs(45));
        let a = watches.register("Artifacts");
        let b = watches.register("sources");
        a.failed();
        tokio::time::advance(Duration::from_secs(30)).await;
        a.failed();
        assert_eq!(watches.broken(), None, "not for long enough yet");
        tokio::time::advance(Duration::from_secs(31)).await;
        a.failed();
        let (name, for_) = watches.broken().expect("broken");
        assert_eq!(
            (name.as_str(), for_),
            ("Artifacts", Duration::from_secs(61))
        );
        assert_eq!(watches.all_broken().len(), 1);
        // An event heals it.
        a.ok();
        assert_eq!(watches.broken(), None);
        // A watch that reconnected without an event stops counting once
        // its errors stop.
        b.failed();
        tokio::time::advance(Duration::from_secs(40)).await;
        b.failed();
        tokio::time::advance(Duration::from_secs(21)).await;
        assert!(watches.broken().is_some());
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(watches.broken(), None, "quiet for longer than any backoff");
        // A stopped watch counts no more.
        b.failed();
        tokio::time::advance(Duration::from_secs(40)).await;
        b.failed();
        tokio::time::advance(Duration::from_secs(21)).await;
        assert!(watches.broken().is_some());
        drop(b);
        assert_eq!(watches.broken(), None);
        WatchTicker::detached().failed();
    }

    #[tokio::test]
    async fn a_taken_port_is_an_error() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = serve("metrics", addr, Router::new()).await.unwrap_err();
        assert!(err.to_string().contains("metrics server"), "{err}");
    }
}
