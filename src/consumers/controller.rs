//! The leader's view of the consumers: a watch of every consumer kind the
//! cluster serves keeps [`References`](crate::consumers::references::References) (which
//! exported objects Flux may still read), and every consumer openflux
//! rewrote is re-pointed when its export target or name changes
//! ([`repoint`]), with no action from the user.

mod repointer;
pub mod wake;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::channel::mpsc::UnboundedSender;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use serde_json::Value;

use crate::cluster::gate;
use crate::consumers::references::{ConsumerKey, Entry, References};
use crate::consumers::repoint::{repoint, ObjectKey};
use crate::control::{Context, Error, Referrals};
use crate::locks;
use crate::rewrite::{Options, View};
use crate::telemetry::Readiness;
use crate::vocabulary::consumers::{Consumer, CONSUMERS};
use crate::watch::change::Change;
use crate::watch::run::Watch;
use crate::watch::{keep_all, Scope};

/// A consumer openflux should look at again.
pub type Look = (&'static Consumer, String, String);

/// Where the consumers' watches report.
pub struct Sinks {
    /// Consumers to look at.
    pub look: UnboundedSender<Look>,
    /// Objects some consumer stopped referring to.
    pub freed: UnboundedSender<Vec<ObjectKey>>,
}

type Watched = HashMap<&'static str, (ApiResource, Store<DynamicObject>)>;

/// The exported objects by kind, as the leader's watches of the export
/// targets hold them.
type Exports = HashMap<String, (ApiResource, Store<DynamicObject>)>;

/// The watched consumer kinds, shared by the leader (which starts the
/// watches) and the re-pointing worker (which reads their stores), and the
/// references the watches keep.
#[derive(Clone)]
pub struct Consumers {
    watched: Arc<RwLock<Watched>>,
    exports: Arc<RwLock<Exports>>,
    references: Arc<RwLock<References>>,
}

impl Consumers {
    /// No consumer kind watched yet; the watches keep `references` (which
    /// outlive a term: the export controller reads them).
    pub fn new(references: Arc<RwLock<References>>) -> Self {
        Self {
            watched: Arc::default(),
            exports: Arc::default(),
            references,
        }
    }

    /// Starts a watch for each consumer kind the cluster serves and that is
    /// not watched yet.
    pub fn start(
        &mut self,
        (ctx, scope, readiness): (&Arc<Context>, &Scope, &Arc<Readiness>),
        sinks: &Sinks,
        tasks: &mut tokio::task::JoinSet<()>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) {
        let served: Vec<&'static Consumer> = {
            let facts = locks::read(&ctx.facts);
            CONSUMERS
                .iter()
                .filter(|c| facts.choices.contains_key(c.kind))
                .collect()
        };
        for consumer in served {
            if locks::read(&self.watched).contains_key(consumer.kind) {
                continue;
            }
            let gvk = GroupVersionKind::gvk(consumer.group, consumer.version, consumer.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, consumer.resource);
            let writer = Writer::<DynamicObject>::new(resource.clone());
            let store = writer.as_reader();
            locks::write(&self.references).watching(consumer.kind);
            let watch = Watch {
                api: scope.dynamic_api(&ctx.client, &resource),
                // Every consumer, of every shard: an export of this shard's
                // Artifacts is kept while any consumer refers to it.
                config: scope.whole(),
                slim,
                keep: keep_all,
                what: format!("{} consumers", consumer.kind),
                hint: "can openflux list and watch this Flux consumer kind? see its ClusterRole",
                turns: ctx.list_turns.clone(),
                rejects: ctx.rejects.clone(),
            };
            let (references, look) = (self.references.clone(), sinks.look.clone());
            let freed = sinks.freed.clone();
            tasks.spawn(watch.run(
                Some(writer),
                readiness.controller_watch(&format!("{} consumers", consumer.kind)),
                move |change| observe(&references, consumer, change, &look, &freed),
                shutdown.clone(),
            ));
            locks::write(&self.watched).insert(consumer.kind, (resource, store));
        }
    }

    /// Reads the exported objects of `resource`'s kind from `store` (the
    /// leader's watch of that export target): a consumer is moved to an
    /// export only once that store holds it with its Artifact.
    pub fn read_exports(&self, resource: &ApiResource, store: Store<DynamicObject>) {
        locks::write(&self.exports).insert(resource.kind.clone(), (resource.clone(), store));
    }

    /// The exported object `key` names, as the watch of its kind holds it.
    fn export(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        let exports = locks::read(&self.exports);
        let (resource, store) = exports.get(&key.kind)?;
        store.get(&ObjectRef::new_with(&key.name, resource.clone()).within(&key.namespace))
    }

    /// The consumers of `consumer`'s kind as its watch holds them (see
    /// [`slim`]), `None` while that kind is not watched.
    pub fn objects(&self, consumer: &Consumer) -> Option<Vec<Arc<DynamicObject>>> {
        locks::read(&self.watched)
            .get(consumer.kind)
            .map(|(_, store)| store.state())
    }

    /// Re-points one consumer if its target changed: patches its
    /// references (the webhook leaves a stock-kind reference alone), on
    /// condition that it is still the version decided on, once the exports
    /// it moves to hold their Artifacts ([`Error::Waiting`] until then).
    async fn look(&self, ctx: &Context, (consumer, namespace, name): &Look) -> Result<(), Error> {
        let Some((resource, store)) = locks::read(&self.watched).get(consumer.kind).cloned() else {
            return Ok(());
        };
        let key = ObjectRef::new_with(name, resource.clone()).within(namespace);
        let Some(object) = store.get(&key) else {
            return Ok(());
        };
        if !ctx.shard.owns(object.labels()) {
            // Another shard's consumer: that shard re-points it.
            return Ok(());
        }
        let value = serde_json::to_value(&*object)?;
        // Decided with no SourcePolicy and the default options on purpose:
        // a re-point keeps a reference its author already had admitted,
        // pointed where openflux exports it now. Whether it may still point
        // there is judged on the patch itself, by the validating webhook
        // (with the replica's policies and options) and the admission
        // policies, as for any other write.
        let decided = {
            let index = locks::read(&ctx.index);
            let facts = locks::read(&ctx.facts);
            let view = View {
                index: &index,
                facts: &facts,
                policies: &crate::policy::NONE,
            };
            repoint(consumer, &value, view, &Options::default())
        };
        let moved = match decided {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(()),
            Err(why) => {
                tracing::debug!(consumer = consumer.kind, %namespace, %name, %why, "not re-pointed");
                return Ok(());
            }
        };
        if let Some(why) = waiting_for(&moved.exports, |key| self.export(key)) {
            return Err(Error::Waiting(why));
        }
        let patch = with_precondition(moved.patch.clone(), object.resource_version().as_deref());
        let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, &resource);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(
                    consumer = consumer.kind, %namespace, %name,
                    from = ?moved.from, to = ?moved.to,
                    "re-pointed a consumer to its custom source's current export"
                );
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Changed since the watch showed it: the watch brings the
                // new version, and with it a new look.
                tracing::info!(consumer = consumer.kind, %namespace, %name, "consumer changed while being re-pointed; deciding again on its new version");
                Ok(())
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// Why a consumer cannot move to `exports` yet, if it cannot: one of them
/// is not there, or has no Artifact in its status. A Flux consumer moved
/// to it now would fail to fetch its source and, as the export is the
/// same revision it already applied, would not be woken when the Artifact
/// comes: it would wait for its interval.
fn waiting_for(
    exports: &[ObjectKey],
    find: impl Fn(&ObjectKey) -> Option<Arc<DynamicObject>>,
) -> Option<String> {
    exports.iter().find_map(|key| {
        let ObjectKey {
            kind,
            namespace,
            name,
        } = key;
        match find(key) {
            None => Some(format!(
                "its export {kind} {namespace}/{name} is not written yet"
            )),
            Some(export) if export.data.pointer("/status/artifact").is_none() => Some(format!(
                "its export {kind} {namespace}/{name} has no Artifact yet"
            )),
            Some(_) => None,
        }
    })
}

/// `patch` applied only to the version `resource_version` of the object: the
/// API server refuses it (409 Conflict) when someone changed the object
/// since, so a concurrent edit is never overwritten.
pub fn with_precondition(mut patch: Value, resource_version: Option<&str>) -> Value {
    if let (Some(rv), Some(object)) = (resource_version, patch.as_object_mut()) {
        let metadata = object
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert("resourceVersion".into(), Value::String(rv.into()));
        }
    }
    patch
}

/// Keeps the references index and asks for a look at changed consumers.
fn observe(
    references: &RwLock<References>,
    consumer: &'static Consumer,
    change: Change<'_, DynamicObject>,
    look: &UnboundedSender<Look>,
    freed: &UnboundedSender<Vec<ObjectKey>>,
) {
    let key = |o: &DynamicObject| -> ConsumerKey {
        (
            consumer.kind,
            o.namespace().unwrap_or_default(),
            o.name_any(),
        )
    };
    // A consumer that cannot be read keeps what it referred to before: an
    // export it may still read is never retired for want of reading it.
    let entry = |o: &DynamicObject| -> Option<Entry> {
        match serde_json::to_value(o) {
            Ok(v) => Some(Entry::of(consumer, &v)),
            Err(error) => {
                tracing::error!(consumer = consumer.kind, namespace = o.namespace().unwrap_or_default(), name = %o.name_any(), %error, "cannot read a consumer's references; keeping what it referred to before");
                None
            }
        }
    };
    match change {
        Change::Applied(o) => {
            let Some(e) = entry(o) else { return };
            let mut gone: Vec<ObjectKey> = e.moved_from.clone();
            {
                let mut refs = locks::write(references);
                if let Some(before) = refs.get(&key(o)) {
                    gone.extend(before.refers.iter().cloned());
                }
                refs.apply(key(o), e);
            }
            let _ = freed.unbounded_send(gone);
            let _ =
                look.unbounded_send((consumer, o.namespace().unwrap_or_default(), o.name_any()));
        }
        Change::Deleted(o) => {
            let gone = {
                let mut refs = locks::write(references);
                let before = refs.get(&key(o)).map(|e| e.refers.clone());
                refs.delete(&key(o));
                before.unwrap_or_default()
            };
            let _ = freed.unbounded_send(gone);
        }
        // The consumer watch keeps every object: its lists arrive whole.
        Change::Listing | Change::Listed(_) => {}
        Change::Relisted(all) => {
            let mut refs = locks::write(references);
            let entries = all
                .iter()
                .filter_map(|o| {
                    let e = entry(o).or_else(|| refs.get(&key(o)).cloned())?;
                    Some((key(o), e))
                })
                .collect();
            refs.relisted(consumer.kind, entries);
            drop(refs);
            for o in all {
                let _ = look.unbounded_send((
                    consumer,
                    o.namespace().unwrap_or_default(),
                    o.name_any(),
                ));
            }
        }
    }
}

/// What the consumers' watches tell the export controller.
impl Referrals for RwLock<References> {
    fn refers_to(&self, namespace: &str, kind: &str, name: &str) -> bool {
        locks::read(self).refers_to(namespace, kind, name)
    }
}

/// Keeps what references, re-pointing and the gate check read: metadata
/// without managed fields, the spec, `status.observedGeneration`, and the
/// `Ready` condition (type, status, reason, message) of a consumer refused
/// for the ExternalArtifact gate ([`gate::refused_condition`]); no other
/// condition, so a consumer costs no more than before unless it is refused.
fn slim(object: &mut DynamicObject) {
    object.metadata.managed_fields = None;
    let observed = object.data.pointer("/status/observedGeneration").cloned();
    let refused = gate::refused_condition(object).map(|c| {
        let mut kept = serde_json::Map::new();
        for field in ["type", "status", "reason", "message"] {
            if let Some(v) = c.get(field) {
                kept.insert(field.into(), v.clone());
            }
        }
        Value::Object(kept)
    });
    if let Some(o) = object.data.as_object_mut() {
        o.remove("status");
        let mut status = serde_json::Map::new();
        if let Some(observed) = observed {
            status.insert("observedGeneration".into(), observed);
        }
        if let Some(refused) = refused {
            status.insert("conditions".into(), Value::Array(vec![refused]));
        }
        if !status.is_empty() {
            o.insert("status".into(), Value::Object(status));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_re_point_applies_only_to_the_version_it_was_decided_on() {
        let patch = json!({"spec": {"sourceRef": {"kind": "OCIRepository", "name": "web"}}});
        let guarded = with_precondition(patch.clone(), Some("42"));
        assert_eq!(guarded["metadata"]["resourceVersion"], "42");
        assert_eq!(guarded["spec"], patch["spec"], "the change itself is kept");
        let annotated = json!({"metadata": {"annotations": {"a": "b"}}});
        let guarded = with_precondition(annotated, Some("7"));
        assert_eq!(guarded["metadata"]["annotations"]["a"], "b");
        assert_eq!(guarded["metadata"]["resourceVersion"], "7");
        assert_eq!(with_precondition(patch.clone(), None), patch);
    }

    #[test]
    fn a_consumer_moves_only_to_exports_that_hold_their_artifact() {
        let key = |name: &str| ObjectKey {
            kind: "OCIRepository".into(),
            namespace: "apps".into(),
            name: name.into(),
        };
        let export = |name: &str, status: Value| -> Arc<DynamicObject> {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "OCIRepository",
                    "metadata": {"name": name, "namespace": "apps"},
                    "spec": {"url": "oci://example/web"},
                    "status": status,
                }))
                .unwrap(),
            )
        };
        let held = [
            export(
                "ready",
                json!({"artifact": {"revision": "v1", "digest": "sha256:0"}}),
            ),
            export("new", json!({"conditions": []})),
        ];
        let find = |k: &ObjectKey| held.iter().find(|o| o.name_any() == k.name).cloned();
        #[rustfmt::skip]
        let table: Vec<(&str, Vec<ObjectKey>, Option<&str>)> = vec![
            ("no export to wait for", vec![], None),
            ("an export with its Artifact", vec![key("ready")], None),
            ("an export not written yet", vec![key("ready"), key("gone")],
                Some("its export OCIRepository apps/gone is not written yet")),
            ("an export without its Artifact", vec![key("new")],
                Some("its export OCIRepository apps/new has no Artifact yet")),
        ];
        for (case, exports, expect) in table {
            assert_eq!(waiting_for(&exports, find).as_deref(), expect, "{case}");
        }
    }

    fn kustomization(conditions: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": "web", "namespace": "apps", "managedFields": [{"manager": "x"}]},
            "spec": {"interval": "10m", "sourceRef": {"kind": "ExternalArtifact", "name": "web"}},
            "status": {"observedGeneration": 3, "lastAppliedRevision": "v1", "inventory": {"entries": []},
                       "conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn the_watch_keeps_what_the_gate_check_reads_and_no_more() {
        let message =
            "can't access 'ExternalArtifact/apps/web', ExternalArtifact feature gate is disabled";
        let mut refused = kustomization(json!([
            {"type": "Reconciling", "status": "True", "reason": "Progressing", "message": "x".repeat(4096)},
            {"type": "Ready", "status": "False", "reason": "AccessDenied", "message": message,
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3},
        ]));
        slim(&mut refused);
        assert!(gate::refused_for_gate(&refused));
        assert_eq!(
            refused.data["status"],
            json!({"observedGeneration": 3, "conditions": [
                {"type": "Ready", "status": "False", "reason": "AccessDenied", "message": message}]})
        );
        assert_eq!(gate::first_refused([&refused]).as_deref(), Some("apps/web"));
        assert!(refused.metadata.managed_fields.is_none());
        assert_eq!(refused.data["spec"]["sourceRef"]["name"], "web");

        let mut fine = kustomization(json!([
            {"type": "Ready", "status": "False", "reason": "BuildFailed", "message": "y".repeat(4096)},
        ]));
        slim(&mut fine);
        assert_eq!(fine.data["status"], json!({"observedGeneration": 3}));
        assert_eq!(
            gate::first_refused([&fine, &refused]).as_deref(),
            Some("apps/web")
        );
        assert_eq!(gate::first_refused([&fine]), None);
    }
}
