//! The controller's workers (`--concurrent`), shared fairly across
//! namespaces.
//!
//! A reconcile runs only while it holds a worker. One namespace holds at
//! most its share of them ([`share`]: half, when the controller watches
//! every namespace), so HttpSources whose servers answer slowly (a tarpit
//! that sends a byte now and then) cannot hold every worker and stop the
//! sources of other namespaces from updating. When a worker comes free it
//! goes to the namespaces waiting for one in turn (round robin), not to
//! the namespace that queued the most.
//!
//! Waiting costs nothing but a parked task; a wait that is abandoned (the
//! reconcile is dropped, e.g. when leadership ends) leaves the queue, and a
//! worker that was handed to it goes back to the pool.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// How many workers one namespace may hold: half of them (at least one)
/// when the controller watches every namespace, all of them when it
/// watches one namespace (`single_namespace`).
pub fn share(workers: usize, single_namespace: bool) -> usize {
    if single_namespace {
        workers.max(1)
    } else {
        (workers / 2).max(1)
    }
}

/// The pool of workers.
pub struct Workers {
    state: Mutex<State>,
}

struct State {
    capacity: usize,
    per_namespace: usize,
    /// Workers held, in all and by namespace (no entry: none).
    total: usize,
    running: HashMap<String, usize>,
    /// The waiters of each namespace, first come first served.
    queues: HashMap<String, VecDeque<Waiter>>,
    /// The namespaces with waiters, each once, in the order they are served.
    turn: VecDeque<String>,
    next_id: u64,
}

struct Waiter {
    id: u64,
    start: oneshot::Sender<()>,
}

impl Workers {
    /// `capacity` workers, at most `per_namespace` of them held by one
    /// namespace (both at least one).
    pub fn new(capacity: usize, per_namespace: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Workers {
            state: Mutex::new(State {
                capacity,
                per_namespace: per_namespace.clamp(1, capacity),
                total: 0,
                running: HashMap::new(),
                queues: HashMap::new(),
                turn: VecDeque::new(),
                next_id: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a worker for a reconcile in `namespace`; the worker is
    /// held until the [`Worker`] is dropped.
    pub async fn acquire(self: &Arc<Self>, namespace: &str) -> Worker {
        let (start, started) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            let id = state.next_id;
            state.next_id += 1;
            if !state.queues.contains_key(namespace) {
                state.turn.push_back(namespace.to_string());
            }
            state
                .queues
                .entry(namespace.to_string())
                .or_default()
                .push_back(Waiter { id, start });
            state.dispatch();
            id
        };
        let mut waiting = Waiting {
            workers: self.clone(),
            namespace: namespace.to_string(),
            id,
            done: false,
        };
        // The sender stays queued until it is sent on (or this wait is
        // dropped): an error cannot happen, and would mean started too.
        let _ = started.await;
        waiting.done = true;
        Worker {
            workers: self.clone(),
            namespace: namespace.to_string(),
        }
    }

    /// Workers held: in all, and by `namespace`.
    #[cfg(test)]
    pub fn held(&self, namespace: &str) -> (usize, usize) {
        let state = self.lock();
        (
            state.total,
            state.running.get(namespace).copied().unwrap_or(0),
        )
    }
}

impl State {
    /// Hands free workers to the waiting namespaces in turn, each up to
    /// its share.
    fn dispatch(&mut self) {
        while self.total < self.capacity {
            let per_namespace = self.per_namespace;
            let running = &self.running;
            let Some(at) = self
                .turn
                .iter()
                .position(|ns| running.get(ns).copied().unwrap_or(0) < per_namespace)
            else {
                return;
            };
            let Some(namespace) = self.turn.remove(at) else {
                return;
            };
            let Some(queue) = self.queues.get_mut(&namespace) else {
                continue;
            };
            let Some(waiter) = queue.pop_front() else {
                self.queues.remove(&namespace);
                continue;
            };
            if queue.is_empty() {
                self.queues.remove(&namespace);
            } else {
                self.turn.push_back(namespace.clone());
            }
            self.total += 1;
            *self.running.entry(namespace).or_default() += 1;
            // A waiter gone meanwhile gives the worker back when its
            // `Waiting` is dropped (it finds itself no longer queued).
            let _ = waiter.start.send(());
        }
    }

    fn release(&mut self, namespace: &str) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.running.get_mut(namespace) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(namespace);
            }
        }
        self.dispatch();
    }

    /// Takes waiter `id` out of its queue; false when it is not queued
    /// (it was handed a worker).
    fn leave(&mut self, namespace: &str, id: u64) -> bool {
        let Some(queue) = self.queues.get_mut(namespace) else {
            return false;
        };
        let Some(at) = queue.iter().position(|w| w.id == id) else {
            return false;
        };
        queue.remove(at);
        if queue.is_empty() {
            self.queues.remove(namespace);
            self.turn.retain(|ns| ns != namespace);
        }
        true
    }
}

/// A wait for a worker, until it is handed one.
struct Waiting {
    workers: Arc<Workers>,
    namespace: String,
    id: u64,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.workers.lock();
        if !state.leave(&self.namespace, self.id) {
            state.release(&self.namespace);
        }
    }
}

/// A worker held; given back when dropped.
pub struct Worker {
    workers: Arc<Workers>,
    namespace: String,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.workers.lock().release(&self.namespace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use tokio::sync::{mpsc, watch};

    /// Reconciles of `namespace` that each take a worker, say so on
    /// `started`, and hold it until `finish` turns true.
    fn spawn_slow(
        workers: &Arc<Workers>,
        namespace: &str,
        count: usize,
        started: &mpsc::UnboundedSender<String>,
        finish: &watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..count)
            .map(|_| {
                let (workers, namespace) = (workers.clone(), namespace.to_string());
                let (started, mut finish) = (started.clone(), finish.clone());
                tokio::spawn(async move {
                    let _worker = workers.acquire(&namespace).await;
                    let _ = started.send(namespace);
                    let _ = finish.wait_for(|done| *done).await;
                })
            })
            .collect()
    }

    /// Six slow reconciles of one namespace (a tarpit's sources) and four
    /// workers: another namespace's reconcile still starts while they are
    /// all in flight.
    #[tokio::test(start_paused = true)]
    async fn a_namespace_of_slow_sources_leaves_workers_to_the_others() {
        let workers = Workers::new(4, share(4, false));
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let (finish, finishing) = watch::channel(false);
        let slow = spawn_slow(&workers, "tarpit", 6, &started_tx, &finishing);
        // Its share starts; the rest wait.
        for _ in 0..2 {
            assert_eq!(started.recv().await.as_deref(), Some("tarpit"));
        }
        tokio::task::yield_now().await;
        assert_eq!(workers.held("tarpit"), (2, 2));

        // Another namespace's reconcile starts at once (the clock is paused:
        // the bound passes only if nothing else can run).
        let other = tokio::time::timeout(Duration::from_secs(60), workers.acquire("apps"))
            .await
            .expect("a reconcile of another namespace waits for the tarpit's");
        assert_eq!(workers.held("apps"), (3, 1));
        assert!(slow.iter().all(|t| !t.is_finished()));
        drop(other);

        // When the slow ones finish, the waiting ones of the tarpit run, never
        // more than its share at a time.
        finish.send_replace(true);
        for _ in 0..4 {
            assert_eq!(started.recv().await.as_deref(), Some("tarpit"));
            assert!(workers.held("tarpit").1 <= 2);
        }
        for task in slow {
            task.await.unwrap();
        }
        assert_eq!(workers.held("tarpit"), (0, 0));
    }

    /// Without a share per namespace (every worker to whoever asks first,
    /// as a plain pool does), the other namespace waits: what the test
    /// above guards against.
    #[tokio::test(start_paused = true)]
    async fn a_plain_pool_lets_one_namespace_hold_every_worker() {
        let workers = Workers::new(4, 4);
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let (finish, finishing) = watch::channel(false);
        let _slow = spawn_slow(&workers, "tarpit", 6, &started_tx, &finishing);
        for _ in 0..4 {
            assert_eq!(started.recv().await.as_deref(), Some("tarpit"));
        }
        let other = tokio::time::timeout(Duration::from_secs(60), workers.acquire("apps")).await;
        assert!(other.is_err(), "all four workers are the tarpit's");
        finish.send_replace(true);
    }

    /// A worker that comes free goes to the namespaces waiting in turn, not
    /// to the one with the longest queue.
    #[tokio::test(start_paused = true)]
    async fn free_workers_go_round_the_waiting_namespaces() {
        let workers = Workers::new(2, 2);
        let first = workers.acquire("a").await;
        let second = workers.acquire("a").await;
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let (finish, finishing) = watch::channel(false);
        let _a = spawn_slow(&workers, "a", 3, &started_tx, &finishing);
        tokio::task::yield_now().await;
        let _b = spawn_slow(&workers, "b", 1, &started_tx, &finishing);
        tokio::task::yield_now().await;
        drop(first);
        assert_eq!(started.recv().await.as_deref(), Some("a"));
        drop(second);
        assert_eq!(
            started.recv().await.as_deref(),
            Some("b"),
            "b's turn comes before a's next"
        );
        finish.send_replace(true);
    }

    /// An abandoned wait (the reconcile dropped, e.g. when leadership
    /// ends) leaves the queue; a worker handed to it comes back.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_wait_holds_no_worker() {
        let workers = Workers::new(1, 1);
        let held = workers.acquire("a").await;
        let waiting = tokio::spawn({
            let workers = workers.clone();
            async move {
                let _worker = workers.acquire("b").await;
                std::future::pending::<()>().await;
            }
        });
        tokio::task::yield_now().await;
        waiting.abort();
        let _ = waiting.await;
        drop(held);
        assert_eq!(workers.held("b"), (0, 0));
        let again = tokio::time::timeout(Duration::from_secs(1), workers.acquire("c"))
            .await
            .expect("the worker is free");
        drop(again);

        // Handed a worker, then dropped before it ran: given back.
        let held = workers.acquire("a").await;
        let mut wait = Box::pin(workers.acquire("b"));
        assert!(futures::poll!(wait.as_mut()).is_pending());
        drop(held);
        assert_eq!(workers.held("b"), (1, 1));
        drop(wait);
        assert_eq!(workers.held("b"), (0, 0));
    }

    #[test]
    fn a_namespace_gets_half_the_workers_when_all_are_watched() {
        assert_eq!(share(4, false), 2);
        assert_eq!(share(5, false), 2);
        assert_eq!(share(2, false), 1);
        assert_eq!(share(1, false), 1);
        assert_eq!(share(4, true), 4);
    }
}
