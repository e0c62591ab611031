//! The wakes waiting for the leader's controllers: a queue without loss that
//! holds each wake once.
//!
//! A wake says "reconcile this object" and is idempotent, so a wake already
//! waiting need not wait twice: the queue keeps the distinct wakes in the
//! order they first came, and a listener that fell behind finds every one of
//! them when it catches up. Nothing is dropped and nothing forces a look at
//! every object; the queue holds at most one entry per object.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use super::router::Wake;
use crate::locks;

#[derive(Default)]
struct Pending {
    order: VecDeque<Wake>,
    queued: HashSet<Wake>,
}

#[derive(Default)]
struct Queue {
    pending: Mutex<Pending>,
    ready: Notify,
}

/// The sending side, held by the hub. Without a listener (a replica that
/// is not the leader) wakes are dropped: the leader looks at everything
/// when it starts.
#[derive(Clone, Default)]
pub struct WakeSender {
    listener: Arc<Mutex<Weak<Queue>>>,
}

impl WakeSender {
    /// Queues `wakes` for the listener, each unless already waiting.
    pub fn send(&self, wakes: impl IntoIterator<Item = Wake>) {
        let Some(queue) = locks::lock(&self.listener).upgrade() else {
            return;
        };
        let mut added = false;
        {
            let mut pending = locks::lock(&queue.pending);
            for wake in wakes {
                if pending.queued.insert(wake.clone()) {
                    pending.order.push_back(wake);
                    added = true;
                }
            }
        }
        if added {
            queue.ready.notify_one();
        }
    }

    /// Listens from now on, in place of any earlier listener.
    pub fn subscribe(&self) -> WakeReceiver {
        let queue = Arc::new(Queue::default());
        *locks::lock(&self.listener) = Arc::downgrade(&queue);
        WakeReceiver { queue }
    }
}

/// The listening side: the leader's event loop.
pub struct WakeReceiver {
    queue: Arc<Queue>,
}

impl WakeReceiver {
    /// Every wake waiting now, in the order they first came; waits while
    /// there is none.
    pub async fn recv(&mut self) -> Vec<Wake> {
        loop {
            let batch = self.try_recv();
            if !batch.is_empty() {
                return batch;
            }
            // A send between the look above and this wait leaves a permit,
            // so the wait ends at once.
            self.queue.ready.notified().await;
        }
    }

    /// Every wake waiting now (none: empty).
    pub fn try_recv(&mut self) -> Vec<Wake> {
        let mut pending = locks::lock(&self.queue.pending);
        pending.queued.clear();
        pending.order.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::ArtifactKey;

    fn export(i: usize) -> Wake {
        Wake::Export(ArtifactKey::new("apps", &format!("a{i}")))
    }

    #[test]
    fn a_listener_that_fell_behind_gets_every_wake_once() {
        let sender = WakeSender::default();
        let mut receiver = sender.subscribe();
        // Far more than any bounded backlog, each object woken three times.
        for _ in 0..3 {
            for i in 0..20_000 {
                sender.send([export(i)]);
            }
        }
        let batch = receiver.try_recv();
        assert_eq!(batch.len(), 20_000, "each object once");
        assert_eq!(batch[0], export(0), "in the order they first came");
        assert_eq!(batch[19_999], export(19_999));
        assert!(receiver.try_recv().is_empty());
        // Once taken, a wake may wait again.
        sender.send([export(7)]);
        assert_eq!(receiver.try_recv(), [export(7)]);
    }

    #[test]
    fn without_a_listener_wakes_are_dropped() {
        let sender = WakeSender::default();
        sender.send([export(1)]);
        let receiver = sender.subscribe();
        drop(receiver);
        sender.send([export(2)]);
        let mut receiver = sender.subscribe();
        assert!(receiver.try_recv().is_empty());
    }

    #[tokio::test]
    async fn recv_waits_for_the_next_wake() {
        let sender = WakeSender::default();
        let mut receiver = sender.subscribe();
        let waiting = tokio::spawn(async move { receiver.recv().await });
        tokio::task::yield_now().await;
        sender.send([export(3), export(3), export(4)]);
        let batch = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("recv returns once a wake is sent")
            .expect("the task ran");
        assert_eq!(batch, [export(3), export(4)]);
    }
}
