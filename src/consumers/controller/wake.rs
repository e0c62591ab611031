//! How the leader wakes the re-pointing controller, as it wakes every
//! other: through its wake handle.

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::{Consumers, Look};
use crate::control::WakeHandle;
use crate::locks;
use crate::vocabulary::consumers::{Consumer, CONSUMERS};

/// How the leader wakes the re-pointing controller: a look at each
/// consumer it names, of every watched kind.
pub struct Waker {
    pub consumers: Consumers,
    pub look: UnboundedSender<Look>,
}

impl WakeHandle for Waker {
    /// Looks again at every consumer named `namespace/name`, whatever its
    /// kind.
    fn one(&self, namespace: &str, name: &str) {
        for (kind, (resource, store)) in locks::read(&self.consumers.watched).iter() {
            let key = ObjectRef::new_with(name, resource.clone()).within(namespace);
            if let (Some(consumer), Some(_)) = (consumer_of(kind), store.get(&key)) {
                let _ =
                    self.look
                        .unbounded_send((consumer, namespace.to_string(), name.to_string()));
            }
        }
    }

    /// Looks again at every consumer of every watched kind.
    fn every(&self) {
        for (kind, (_, store)) in locks::read(&self.consumers.watched).iter() {
            let Some(consumer) = consumer_of(kind) else {
                continue;
            };
            for o in store.state() {
                let look = (consumer, o.namespace().unwrap_or_default(), o.name_any());
                let _ = self.look.unbounded_send(look);
            }
        }
    }
}

/// The consumer table's row of `kind`.
fn consumer_of(kind: &str) -> Option<&'static Consumer> {
    CONSUMERS.iter().find(|c| c.kind == kind)
}
