//! Where the leader sends each wake: to the controller it names, through
//! that controller's wake handle ([`crate::export::Waker`],
//! [`crate::mirror::Waker`], [`crate::consumers::controller::wake::Waker`]).

use super::Controllers;
use crate::consumers::controller as consumers;
use crate::consumers::repoint::ObjectKey;
use crate::control::WakeHandle;
use crate::export::release;
use crate::runtime::router::Wake;

impl Controllers {
    /// Wakes the export of the Artifacts owning these exported objects.
    pub(super) fn wake_owners_of(&self, objects: &[ObjectKey]) {
        if let Some(export) = &self.export {
            let keys = objects
                .iter()
                .map(|k| (k.kind.as_str(), k.namespace.as_str(), k.name.as_str()));
            export.wake.owners_of(&self.targets, keys);
        }
    }

    /// Takes source-controller's finalizer off a shadow being deleted.
    fn release(&mut self, kind: &str, namespace: &str, name: &str) {
        let client = &self.ctx.client;
        let retry = self.ctx.retry;
        if let Some(task) = release::releasing(client, &self.targets, kind, namespace, name, retry)
        {
            self.tasks.spawn(task);
        }
    }

    /// Hands each wake to the controller it names; a controller that does
    /// not run (yet) looks at everything when it starts.
    pub(super) fn wake(&mut self, batch: &[Wake]) {
        for wake in batch {
            match wake {
                Wake::Export(key) => {
                    if let Some(export) = &self.export {
                        export.wake.one(&key.namespace, &key.name);
                    }
                }
                Wake::Release {
                    kind,
                    namespace,
                    name,
                } => self.release(kind, namespace, name),
                Wake::Mirror {
                    source,
                    namespace,
                    name,
                    echo,
                } => {
                    if let Some(mirror) = self.mirrors.get(source) {
                        mirror.source(&self.ctx, namespace, name, echo.as_ref());
                    }
                }
            }
        }
    }

    /// Wakes every controller for every object it keeps: the export, the
    /// mirrors and the re-pointing of the consumers.
    pub(super) fn wake_everything(&self) {
        let consumers = consumers::wake::Waker {
            consumers: self.consumers.clone(),
            look: self.look.clone(),
        };
        let export = self.export.iter().map(|e| &e.wake as &dyn WakeHandle);
        let mirrors = self.mirrors.values().map(|m| m as &dyn WakeHandle);
        for controller in export.chain(mirrors).chain([&consumers as &dyn WakeHandle]) {
            controller.every();
        }
    }
}
