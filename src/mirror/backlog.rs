//! The sources waiting for a mirror's reconcile, handed to its controller a
//! few at a time.
//!
//! kube's controller takes every trigger into its scheduler as soon as it
//! comes: the first list of N sources, or a restart, put N entries of a few
//! hundred bytes each (the scheduler's map and delay queue, the channel
//! before them) in memory at once. Here a waiting source costs a pointer to
//! the object the watch's store already holds, and the controller is given
//! a source only while fewer than `room` of those it was given are still
//! being reconciled. A source woken again while it waits waits once; one
//! woken while it is being reconciled waits until that reconcile ends.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use futures::Stream;
use kube::runtime::controller::{Action, Error};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;

use super::source::{FluxSource, SourceKind};
use crate::locks;

/// A source by namespace and name.
#[derive(Clone)]
struct Key(Arc<FluxSource>);

impl Key {
    fn parts(&self) -> (Option<&str>, Option<&str>) {
        let meta = &self.0.metadata;
        (meta.namespace.as_deref(), meta.name.as_deref())
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

#[derive(Default)]
struct State {
    /// In the order they were woken.
    waiting: VecDeque<Key>,
    /// The keys of `waiting`.
    queued: HashSet<Key>,
    /// Given to the controller, their reconcile not ended yet: at most
    /// `room`, so a list.
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
    pub fn wake(&self, source: Arc<FluxSource>) {
        let key = Key(source);
        let mut state = locks::lock(&self.state);
        if state.queued.insert(key.clone()) {
            state.waiting.push_back(key);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// The controller is done with the source `name` in `namespace`:
    /// reconciled (whatever the result), or not found in its store. Another
    /// source may be given.
    fn done(&self, namespace: Option<&str>, name: &str) {
        let mut state = locks::lock(&self.state);
        let given = state
            .given
            .iter()
            .position(|key| key.parts() == (namespace, Some(name)));
        if let Some(position) = given {
            state.given.swap_remove(position);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Takes one output of the controller: every source it is done with,
    /// reconciled (whatever the result) or gone from its store before its
    /// turn, makes room.
    pub fn finished<E, Q>(&self, output: &Result<(ObjectRef<FluxSource>, Action), Error<E, Q>>) {
        match output {
            Ok((source, _)) => self.done(source.namespace.as_deref(), &source.name),
            Err(Error::ObjectNotFound(source) | Error::ReconcilerFailed(_, source)) => {
                self.done(source.namespace.as_deref(), &source.name)
            }
            Err(Error::QueueError(_) | Error::RunnerError(_)) => {}
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
    fn next(&self) -> Option<Arc<FluxSource>> {
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

    /// The controller's triggers: each source when it is given. Ends never.
    pub fn triggers(
        self: Arc<Self>,
        kind: SourceKind,
    ) -> impl Stream<Item = ObjectRef<FluxSource>> + Send + 'static {
        futures::stream::unfold(self, move |backlog| {
            let kind = kind.clone();
            async move {
                loop {
                    if let Some(source) = backlog.next() {
                        let reference = ObjectRef::from_obj_with(&*source, kind);
                        return Some((reference, backlog));
                    }
                    // A wake or an end after the look left a permit: this
                    // wait then ends at once.
                    backlog.changed.notified().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use kube::api::ObjectMeta;
    use kube::core::{ApiResource, GroupVersionKind};
    use std::time::Duration;

    fn source(name: &str) -> Arc<FluxSource> {
        Arc::new(FluxSource {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("apps".into()),
                ..ObjectMeta::default()
            },
            artifact: None,
        })
    }

    fn kind() -> SourceKind {
        let gvk = GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "GitRepository");
        SourceKind::new(ApiResource::from_gvk_with_plural(&gvk, "gitrepositories"))
    }

    /// The next trigger's name, or `None` when none comes while every task
    /// waits (the clock is paused, so the wait ends only when all are idle).
    async fn next(
        triggers: &mut (impl Stream<Item = ObjectRef<FluxSource>> + Unpin),
    ) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(10), triggers.next())
            .await
            .ok()
            .flatten()
            .map(|r| r.name)
    }

    /// A backlog of `room` with `sources` woken in order, and its triggers.
    fn woken<const N: usize>(
        room: usize,
        sources: [&Arc<FluxSource>; N],
    ) -> (
        Arc<Backlog>,
        std::pin::Pin<Box<impl Stream<Item = ObjectRef<FluxSource>>>>,
    ) {
        let backlog = Backlog::new(room);
        for source in sources {
            backlog.wake(source.clone());
        }
        let triggers = Box::pin(backlog.clone().triggers(kind()));
        (backlog, triggers)
    }

    type Output = Result<(ObjectRef<FluxSource>, Action), Error<std::io::Error, std::io::Error>>;

    fn reconciled(source: &Arc<FluxSource>) -> Output {
        Ok((
            ObjectRef::from_obj_with(&**source, kind()),
            Action::await_change(),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_gone_before_its_turn_or_failed_makes_room() {
        let (a, b, c) = (source("a"), source("b"), source("c"));
        let (backlog, mut triggers) = woken(1, [&a, &b, &c]);
        let erased = |s: &Arc<FluxSource>| Box::new(ObjectRef::from_obj_with(&**s, kind()).erase());
        assert_eq!(next(&mut triggers).await.as_deref(), Some("a"));
        // Deleted while it waited: the controller never calls the reconcile.
        let gone: Output = Err(Error::ObjectNotFound(erased(&a)));
        backlog.finished(&gone);
        assert_eq!(next(&mut triggers).await.as_deref(), Some("b"));
        let failed: Output = Err(Error::ReconcilerFailed(
            std::io::Error::other("refused"),
            erased(&b),
        ));
        backlog.finished(&failed);
        assert_eq!(next(&mut triggers).await.as_deref(), Some("c"));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_no_more_than_its_room_until_reconciles_end() {
        let (a, b, c) = (source("a"), source("b"), source("c"));
        let (backlog, mut triggers) = woken(2, [&a, &b, &c]);
        assert_eq!(next(&mut triggers).await.as_deref(), Some("a"));
        assert_eq!(next(&mut triggers).await.as_deref(), Some("b"));
        assert_eq!(next(&mut triggers).await, None, "more given than its room");
        assert_eq!(backlog.len(), (1, 2));
        backlog.finished(&reconciled(&b));
        assert_eq!(next(&mut triggers).await.as_deref(), Some("c"));
        assert_eq!(backlog.len(), (0, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_woken_twice_waits_once_and_not_beside_its_own_reconcile() {
        let (a, b) = (source("a"), source("b"));
        let (backlog, mut triggers) = woken(4, [&a, &a]);
        assert_eq!(next(&mut triggers).await.as_deref(), Some("a"));
        assert_eq!(next(&mut triggers).await, None, "woken twice, given twice");
        // Woken during its reconcile: given again only after it ends, while
        // others pass it.
        backlog.wake(a.clone());
        backlog.wake(b.clone());
        assert_eq!(next(&mut triggers).await.as_deref(), Some("b"));
        assert_eq!(
            next(&mut triggers).await,
            None,
            "given during its reconcile"
        );
        backlog.finished(&reconciled(&a));
        assert_eq!(next(&mut triggers).await.as_deref(), Some("a"));
        // The end of a reconcile the backlog did not give changes nothing.
        backlog.finished(&reconciled(&source("other")));
        let mut elsewhere = (*a).clone();
        elsewhere.metadata.namespace = Some("elsewhere".into());
        backlog.finished(&reconciled(&Arc::new(elsewhere)));
        assert_eq!(backlog.len(), (0, 2));
    }
}
