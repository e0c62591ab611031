//! The sources waiting for a mirror's reconcile, handed to its runner a few
//! at a time.
//!
//! The first list of N sources, or a restart, wakes every source at once.
//! Here a waiting source costs a pointer to the source the mirror's store
//! already holds, and the runner is given a source only while fewer than
//! `room` of those it was given are still being reconciled. A source woken
//! again while it waits waits once; one woken while it is being reconciled
//! waits until that reconcile ends.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::source::Source;
use crate::locks;

/// A source by namespace and name.
#[derive(Clone)]
struct Key(Arc<Source>);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

#[derive(Default)]
struct State {
    /// In the order they were woken.
    waiting: VecDeque<Key>,
    /// The keys of `waiting`.
    queued: HashSet<Key>,
    /// Given to the runner, their reconcile not ended yet: at most `room`,
    /// so a list.
    given: Vec<Key>,
}

/// The waiting sources of one mirror; see the module's doc.
pub struct Backlog {
    state: Mutex<State>,
    changed: Notify,
    room: usize,
}

impl Backlog {
    /// A backlog that gives at most `room` sources at a time (at least 1).
    pub fn new(room: usize) -> Arc<Self> {
        Arc::new(Backlog {
            state: Mutex::default(),
            changed: Notify::new(),
            room: room.max(1),
        })
    }

    /// Wakes `source`: it is reconciled once more, from whatever the store
    /// holds then.
    pub fn wake(&self, source: Arc<Source>) {
        let key = Key(source);
        let mut state = locks::lock(&self.state);
        if state.queued.insert(key.clone()) {
            state.waiting.push_back(key);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// The runner is done with `source` (reconciled, whatever the result,
    /// or gone from the store): another source may be given.
    pub fn done(&self, source: &Source) {
        let mut state = locks::lock(&self.state);
        let given = state
            .given
            .iter()
            .position(|key| key.0.key() == source.key());
        if let Some(position) = given {
            state.given.swap_remove(position);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// How many sources wait, and how many are given.
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let state = locks::lock(&self.state);
        (state.waiting.len(), state.given.len())
    }

    /// The next source to give, if there is room and one that is not being
    /// reconciled already.
    fn next(&self) -> Option<Arc<Source>> {
        let mut state = locks::lock(&self.state);
        if state.given.len() >= self.room {
            return None;
        }
        let position = state
            .waiting
            .iter()
            .position(|key| !state.given.contains(key))?;
        let key = state.waiting.remove(position)?;
        state.queued.remove(&key);
        state.given.push(key.clone());
        Some(key.0)
    }

    /// Waits for the next source to give. Safe to drop unfinished: a source
    /// is taken only when this returns it.
    pub async fn given(&self) -> Arc<Source> {
        loop {
            if let Some(source) = self.next() {
                return source;
            }
            // A wake or an end after the look left a permit: this wait then
            // ends at once.
            self.changed.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn source(name: &str) -> Arc<Source> {
        Arc::new(Source {
            namespace: "apps".into(),
            name: name.into(),
            uid: None,
            labels: Default::default(),
            artifact: None,
        })
    }

    /// The next source given, or `None` when none comes while every task
    /// waits (the clock is paused, so the wait ends only when all are idle).
    async fn next(backlog: &Backlog) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(10), backlog.given())
            .await
            .ok()
            .map(|s| s.name.to_string())
    }

    /// A backlog of `room` with `sources` woken in order.
    fn woken<const N: usize>(room: usize, sources: [&Arc<Source>; N]) -> Arc<Backlog> {
        let backlog = Backlog::new(room);
        for source in sources {
            backlog.wake(source.clone());
        }
        backlog
    }

    #[tokio::test(start_paused = true)]
    async fn each_source_done_makes_room() {
        let (a, b, c) = (source("a"), source("b"), source("c"));
        let backlog = woken(1, [&a, &b, &c]);
        assert_eq!(next(&backlog).await.as_deref(), Some("a"));
        assert_eq!(next(&backlog).await, None, "more given than its room");
        backlog.done(&a);
        assert_eq!(next(&backlog).await.as_deref(), Some("b"));
        backlog.done(&b);
        assert_eq!(next(&backlog).await.as_deref(), Some("c"));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_no_more_than_its_room_until_reconciles_end() {
        let (a, b, c) = (source("a"), source("b"), source("c"));
        let backlog = woken(2, [&a, &b, &c]);
        assert_eq!(next(&backlog).await.as_deref(), Some("a"));
        assert_eq!(next(&backlog).await.as_deref(), Some("b"));
        assert_eq!(next(&backlog).await, None, "more given than its room");
        assert_eq!(backlog.len(), (1, 2));
        backlog.done(&b);
        assert_eq!(next(&backlog).await.as_deref(), Some("c"));
        assert_eq!(backlog.len(), (0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_woken_twice_waits_once_and_not_beside_its_own_reconcile() {
        let (a, b) = (source("a"), source("b"));
        let backlog = woken(4, [&a, &a]);
        assert_eq!(next(&backlog).await.as_deref(), Some("a"));
        assert_eq!(next(&backlog).await, None, "woken twice, given twice");
        // Woken during its reconcile: given again only after it ends, while
        // others pass it.
        backlog.wake(a.clone());
        backlog.wake(b.clone());
        assert_eq!(next(&backlog).await.as_deref(), Some("b"));
        assert_eq!(next(&backlog).await, None, "given during its reconcile");
        backlog.done(&a);
        assert_eq!(next(&backlog).await.as_deref(), Some("a"));
        // The end of a reconcile the backlog did not give changes nothing.
        backlog.done(&source("other"));
        let elsewhere = Source {
            namespace: "elsewhere".into(),
            name: "a".into(),
            uid: None,
            labels: Default::default(),
            artifact: None,
        };
        backlog.done(&elsewhere);
        assert_eq!(backlog.len(), (0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_dropped_unfinished_loses_nothing() {
        let a = source("a");
        let backlog = Backlog::new(1);
        assert_eq!(next(&backlog).await, None);
        backlog.wake(a.clone());
        assert_eq!(next(&backlog).await.as_deref(), Some("a"));
    }
}
