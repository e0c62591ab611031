//! Where the leader sends each wake: to the controller it names, or to the
//! owners of exported objects a consumer stopped referring to.

use kube::api::Api;
use kube::core::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::Controllers;
use crate::consumers::repoint::ObjectKey;
use crate::export::release;
use crate::mirror;
use crate::runtime::router::Wake;

impl Controllers {
    /// Wakes the export of the Artifacts owning these exported objects.
    pub(super) fn wake_owners_of(&self, objects: &[ObjectKey]) {
        let Some(export) = &self.export else { return };
        for key in objects {
            for served in self.targets.values() {
                if served.resource.kind != key.kind {
                    continue;
                }
                let r =
                    ObjectRef::new_with(&key.name, served.resource.clone()).within(&key.namespace);
                let Some(object) = served.exports.get(&r) else {
                    continue;
                };
                for owner in object.owner_references() {
                    let artifact = ObjectRef::new(&owner.name).within(&key.namespace);
                    let _ = export.wake.unbounded_send(artifact);
                }
            }
        }
    }

    /// Takes source-controller's finalizer off a shadow being deleted.
    pub(super) fn release(&mut self, kind: &str, namespace: &str, name: &str) {
        if let Some(served) = self.targets.values().find(|t| t.resource.kind == kind) {
            let key = ObjectRef::new_with(name, served.resource.clone()).within(namespace);
            let Some(shadow) = served.exports.get(&key) else {
                return;
            };
            let finalizers = shadow.metadata.finalizers.clone().unwrap_or_default();
            let api = Api::<DynamicObject>::namespaced_with(
                self.ctx.client.clone(),
                namespace,
                &served.resource,
            );
            self.tasks.spawn(release::release(
                api,
                name.to_string(),
                finalizers,
                self.ctx.retry,
            ));
        }
    }

    /// Hands each wake to the controller it names; a controller that does
    /// not run (yet) looks at everything when it starts.
    pub(super) fn wake(&mut self, batch: &[Wake]) {
        for wake in batch {
            match wake {
                Wake::Export(key) => {
                    if let Some(export) = &self.export {
                        let artifact = ObjectRef::new(&key.name).within(&key.namespace);
                        let _ = export.wake.unbounded_send(artifact);
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
                    if echo
                        .as_ref()
                        .is_some_and(|echo| mirror::is_echo(&self.ctx, namespace, echo))
                    {
                        continue;
                    }
                    if let Some(mirror) = self.mirrors.get(source) {
                        // A source the store does not hold has nothing to
                        // mirror; its watch wakes it when it comes.
                        if let Some(source) = mirror.sources.get(namespace, name) {
                            mirror.backlog.wake(source);
                        }
                    }
                }
            }
        }
    }

    /// Wakes every controller for every object it keeps.
    pub(super) fn wake_everything(&self) {
        if let Some(export) = &self.export {
            for artifact in self.ctx.artifacts.state() {
                let _ = export.wake.unbounded_send(ObjectRef::from(&*artifact));
            }
        }
        for mirror in self.mirrors.values() {
            for source in mirror.sources.all() {
                mirror.backlog.wake(source);
            }
        }
    }
}
