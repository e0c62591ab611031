//! How the leader wakes the export controller, without knowing what the
//! controller keeps: an Artifact by name, the Artifacts owning exported
//! objects a consumer let go of, or every Artifact.

use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;

use super::write::ServedTargets;
use crate::api::Artifact;
use crate::control::WakeHandle;

/// The running export controller's wake handle.
#[derive(Clone)]
pub struct Waker {
    sender: UnboundedSender<ObjectRef<Artifact>>,
    /// The Artifacts the controller exports.
    artifacts: Store<Artifact>,
}

impl WakeHandle for Waker {
    /// Exports Artifact `namespace/name` again.
    fn one(&self, namespace: &str, name: &str) {
        let _ = self
            .sender
            .unbounded_send(ObjectRef::new(name).within(namespace));
    }

    /// Exports again every Artifact the store holds.
    fn every(&self) {
        for artifact in self.artifacts.state() {
            let _ = self.sender.unbounded_send(ObjectRef::from(&*artifact));
        }
    }
}

impl Waker {
    /// A handle for the Artifacts `artifacts` holds, and the triggers it
    /// sends, for [`super::run`].
    pub fn channel(artifacts: Store<Artifact>) -> (Self, UnboundedReceiver<ObjectRef<Artifact>>) {
        let (sender, triggers) = unbounded();
        (Self { sender, artifacts }, triggers)
    }

    /// Exports again the Artifacts owning the exported objects `objects`
    /// (kind, namespace, name) that the watches of `targets` hold: an
    /// export no consumer refers to any more may now be retired.
    pub fn owners_of<'a>(
        &self,
        targets: &ServedTargets,
        objects: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) {
        for (kind, namespace, name) in objects {
            for served in targets.values().filter(|t| t.resource.kind == kind) {
                let key = ObjectRef::new_with(name, served.resource.clone()).within(namespace);
                let Some(object) = served.exports.get(&key) else {
                    continue;
                };
                for owner in object.owner_references() {
                    self.one(namespace, &owner.name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::cluster::target::Target;
    use crate::export::write::ServedTarget;

    /// Served targets whose ExternalArtifact watch holds `apps/export`,
    /// owned by Artifacts `a` and `b`.
    fn targets() -> ServedTargets {
        let gvk = GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "ExternalArtifact");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "externalartifacts");
        let mut writer = Writer::<DynamicObject>::new(resource.clone());
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "ExternalArtifact",
            "metadata": {"name": "export", "namespace": "apps", "ownerReferences": [
                {"apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact", "name": "a", "uid": "1"},
                {"apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact", "name": "b", "uid": "2"}]}
        }))
        .unwrap();
        writer.apply_watcher_event(&Event::Apply(object));
        let exports = writer.as_reader();
        [(Target::ExternalArtifact, ServedTarget { resource, exports })].into()
    }

    #[test]
    fn the_owners_of_a_held_export_are_woken_and_nothing_else() {
        let artifacts = Writer::<Artifact>::default().as_reader();
        let (waker, mut triggers) = Waker::channel(artifacts);
        let targets = targets();
        waker.owners_of(
            &targets,
            [
                ("ExternalArtifact", "apps", "export"),
                ("ExternalArtifact", "apps", "unknown"),
                ("ExternalArtifact", "other", "export"),
                ("OCIRepository", "apps", "export"),
            ],
        );
        drop(waker);
        let woken: Vec<String> = futures::executor::block_on(async {
            let mut names = Vec::new();
            while let Some(r) = triggers.next().await {
                names.push(format!("{}/{}", r.namespace.unwrap_or_default(), r.name));
            }
            names
        });
        assert_eq!(woken, ["apps/a", "apps/b"]);
    }
}
