//! Runs one mirror: each source its backlog gives is reconciled in a task of
//! its own, from what the store holds then, and looked at again after the
//! delay a reconcile asks for (a failure's backoff, or a name another
//! object holds).
//!
//! The backlog bounds the reconciles under way and keeps a source out of a
//! second one at the same time; the store is the watch's. Nothing else is
//! kept per source: a source waiting for a later look costs one timer,
//! the earliest asked for.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::poll_fn;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{delay_queue, DelayQueue};

use super::backlog::Backlog;
use super::source::Source;
use super::store::Sources;
use crate::api::runtime::{Retries, RetryArgs};
use crate::control::{caught, ended, Error, Reconciler, Requeue};

/// A source by namespace and name.
type Key = (Arc<str>, Arc<str>);

/// Runs until `shutdown`: reconciles each source `backlog` gives with
/// `mirror`, from what `sources` holds then, at most the backlog's room at
/// a time; then waits for the reconciles under way.
pub async fn run<R>(
    sources: Sources,
    backlog: Arc<Backlog>,
    retry: RetryArgs,
    mirror: Arc<R>,
    shutdown: CancellationToken,
) where
    R: Reconciler<Object = Arc<Source>>,
{
    let retries = Retries::<Key>::new(retry);
    let mut running: JoinSet<(Arc<Source>, Result<Requeue, Error>)> = JoinSet::new();
    let mut later = Later::default();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(done) = running.join_next() => {
                // A reconcile's panic is caught in its task (an Err).
                let Ok((source, result)) = done else { continue };
                let key = (source.namespace.clone(), source.name.clone());
                let again = ended(&*mirror, &retries, &key, &source, result.as_ref().copied());
                if let Some(after) = again {
                    later.after(key, after);
                }
            }
            Some((namespace, name)) = later.next() => {
                if let Some(source) = sources.get(&namespace, &name) {
                    backlog.wake(source);
                }
            }
            given = backlog.given() => {
                // The source as the store holds it now; gone, it has
                // nothing to mirror (garbage collection takes its
                // Artifact).
                let Some(source) = sources.get(&given.namespace, &given.name) else {
                    backlog.done(&given);
                    continue;
                };
                let room = Room { backlog: backlog.clone(), source: given };
                let mirror = mirror.clone();
                running.spawn(async move {
                    let result = caught(mirror.reconcile(&source)).await;
                    drop(room);
                    (source, result)
                });
            }
        }
    }
    // Nothing new starts; what is under way ends.
    while running.join_next().await.is_some() {}
}

/// A source given by the backlog: handed back when its reconcile ends,
/// however it ends.
struct Room {
    backlog: Arc<Backlog>,
    source: Arc<Source>,
}

impl Drop for Room {
    fn drop(&mut self) {
        self.backlog.done(&self.source);
    }
}

/// The sources to look at again later, each once, at the earliest time
/// asked for.
#[derive(Default)]
struct Later {
    queue: DelayQueue<Key>,
    due: HashMap<Key, (delay_queue::Key, Instant)>,
}

impl Later {
    fn after(&mut self, key: Key, delay: Duration) {
        let at = Instant::now() + delay;
        match self.due.get_mut(&key) {
            Some((_, due)) if *due <= at => {}
            Some((timer, due)) => {
                self.queue.reset_at(timer, at);
                *due = at;
            }
            None => {
                let timer = self.queue.insert_at(key.clone(), at);
                self.due.insert(key, (timer, at));
            }
        }
    }

    /// The next source due; `None` at once when none waits. Safe to drop
    /// unfinished: a source is taken only when this returns it.
    async fn next(&mut self) -> Option<Key> {
        let expired = poll_fn(|cx| self.queue.poll_expired(cx)).await?;
        let key = expired.into_inner();
        self.due.remove(&key);
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn key(name: &str) -> Key {
        ("apps".into(), name.into())
    }

    /// What is due within `within`, in order.
    async fn due_within(later: &mut Later, within: Duration) -> Vec<String> {
        let mut out = Vec::new();
        let until = Instant::now() + within;
        while let Ok(Some(key)) = tokio::time::timeout_at(until, later.next()).await {
            out.push(key.1.to_string());
        }
        out
    }

    /// A reconcile that panics is a failed one: logged, and the source is
    /// looked at again after the failure's backoff, not forgotten until it
    /// next changes.
    #[tokio::test(start_paused = true)]
    async fn a_reconcile_that_panics_is_retried_after_a_backoff() {
        let sources = Sources::default();
        let source = sources.insert(Source {
            namespace: "apps".into(),
            name: "web".into(),
            uid: None,
            labels: Default::default(),
            artifact: None,
        });
        let backlog = Backlog::new(2);
        backlog.wake(source);
        let (done, mut reconciled) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let retry = RetryArgs {
            min_retry_delay: Duration::from_secs(1),
            max_retry_delay: Duration::from_secs(10),
        };
        let mirror = Arc::new(PanicsFirst {
            calls: AtomicUsize::new(0),
            done,
            failures: Mutex::default(),
        });
        let runner = tokio::spawn(run(
            sources,
            backlog,
            retry,
            mirror.clone(),
            shutdown.clone(),
        ));
        let again = tokio::time::timeout(Duration::from_secs(60), reconciled.recv()).await;
        shutdown.cancel();
        runner.await.unwrap();
        assert_eq!(again, Ok(Some(1)), "the source was not reconciled again");
        assert_eq!(
            *mirror.failures.lock().unwrap(),
            ["apps/web: the reconcile panicked: a defect in the reconcile"]
        );
    }

    /// A mirror whose first reconcile panics; it sends the number of each
    /// later one on `done`.
    struct PanicsFirst {
        calls: AtomicUsize,
        done: tokio::sync::mpsc::UnboundedSender<usize>,
        failures: Mutex<Vec<String>>,
    }

    impl Reconciler for PanicsFirst {
        type Object = Arc<Source>;

        async fn reconcile(&self, _: &Arc<Source>) -> Result<Requeue, Error> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            if call == 0 {
                panic!("a defect in the reconcile");
            }
            let _ = self.done.send(call);
            Ok(None)
        }

        fn failed(&self, source: &Arc<Source>, error: &Error, _: Duration) {
            let failure = format!("{}/{}: {error}", source.namespace, source.name);
            self.failures.lock().unwrap().push(failure);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_asked_for_twice_is_looked_at_once_at_the_earliest() {
        let mut later = Later::default();
        assert_eq!(later.next().await, None, "nothing waits");
        later.after(key("a"), Duration::from_secs(300));
        later.after(key("b"), Duration::from_secs(2));
        later.after(key("a"), Duration::from_secs(1));
        later.after(key("b"), Duration::from_secs(60));
        assert_eq!(due_within(&mut later, Duration::from_secs(1)).await, ["a"]);
        assert_eq!(
            due_within(&mut later, Duration::from_secs(400)).await,
            ["b"]
        );
        assert!(later.due.is_empty());
    }
}
