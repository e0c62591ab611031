//! The leader's view of the consumers: a watch of every consumer kind the
//! cluster serves keeps [`References`](crate::consumers::references::References) (which
//! exported objects Flux may still read), and every consumer openflux
//! rewrote is re-pointed when its export target or name changes
//! ([`repoint`]), with no action from the user.

use std::collections::HashMap;
use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};

use crate::consumers::references::{ConsumerKey, Entry};
use crate::consumers::repoint::{repoint, ObjectKey};
use crate::consumers::table::{Consumer, CONSUMERS};
use crate::context::Context;
use crate::locks;
use crate::runtime::router::Change;
use crate::runtime::watch::{keep_all, Scope, Watch};
use crate::telemetry::Readiness;
use crate::webhook::rewrite::View;
use crate::webhook::Options;

/// A consumer openflux should look at again.
pub type Look = (&'static Consumer, String, String);

/// Where the consumers' watches report.
pub struct Sinks {
    /// Consumers to look at.
    pub look: UnboundedSender<Look>,
    /// Objects some consumer stopped referring to.
    pub freed: UnboundedSender<Vec<ObjectKey>>,
}

/// The watched consumer kinds.
#[derive(Default)]
pub struct Consumers {
    watched: HashMap<&'static str, (ApiResource, Store<DynamicObject>)>,
}

impl Consumers {
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
            if self.watched.contains_key(consumer.kind) {
                continue;
            }
            let gvk = GroupVersionKind::gvk(consumer.group, consumer.version, consumer.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, consumer.resource);
            let writer = Writer::<DynamicObject>::new(resource.clone());
            let store = writer.as_reader();
            locks::write(&ctx.references).watching(consumer.kind);
            let watch = Watch {
                api: scope.dynamic_api(&ctx.client, &resource),
                // Every consumer, of every shard: an export of this shard's
                // Artifacts is kept while any consumer refers to it.
                config: scope.whole(),
                slim,
                keep: keep_all,
                what: format!("{} consumers", consumer.kind),
                hint: "can openflux list and watch this Flux consumer kind? see its ClusterRole",
            };
            let (ctx2, look, freed) = (ctx.clone(), sinks.look.clone(), sinks.freed.clone());
            tasks.spawn(watch.run(
                writer,
                readiness.controller_watch(&format!("{} consumers", consumer.kind)),
                move |change| observe(&ctx2, consumer, change, &look, &freed),
                shutdown.clone(),
            ));
            self.watched.insert(consumer.kind, (resource, store));
        }
    }

    /// Every consumer of every watched kind.
    pub fn everyone(&self) -> Vec<Look> {
        let mut all = Vec::new();
        for (kind, (_, store)) in &self.watched {
            let Some(consumer) = CONSUMERS.iter().find(|c| c.kind == *kind) else {
                continue;
            };
            for o in store.state() {
                all.push((consumer, o.namespace().unwrap_or_default(), o.name_any()));
            }
        }
        all
    }

    /// Re-points one consumer if its target changed: patches its
    /// references (the webhook leaves a stock-kind reference alone).
    pub async fn look(&self, ctx: &Context, (consumer, namespace, name): Look) {
        let Some((resource, store)) = self.watched.get(consumer.kind) else {
            return;
        };
        let key = ObjectRef::new_with(&name, resource.clone()).within(&namespace);
        let Some(object) = store.get(&key) else {
            return;
        };
        if !ctx.shard.owns(object.labels()) {
            // Another shard's consumer: that shard re-points it.
            return;
        }
        let Ok(value) = serde_json::to_value(&*object) else {
            return;
        };
        let decided = {
            let index = locks::read(&ctx.index);
            let facts = locks::read(&ctx.facts);
            let view = View {
                index: &index,
                facts: &facts,
            };
            repoint(consumer, &value, view, &Options::default())
        };
        let moved = match decided {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(why) => {
                tracing::debug!(consumer = consumer.kind, %namespace, %name, %why, "not re-pointed");
                return;
            }
        };
        let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, resource);
        let params = PatchParams::default();
        match api.patch(&name, &params, &Patch::Merge(&moved.patch)).await {
            Ok(_) => tracing::info!(
                consumer = consumer.kind, %namespace, %name,
                from = ?moved.from, to = ?moved.to,
                "re-pointed a consumer to its custom source's current export"
            ),
            Err(error) => tracing::warn!(
                consumer = consumer.kind, %namespace, %name, %error,
                "cannot re-point a consumer; will retry"
            ),
        }
    }
}

/// Keeps the references index and asks for a look at changed consumers.
fn observe(
    ctx: &Context,
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
    let entry = |o: &DynamicObject| {
        serde_json::to_value(o)
            .map(|v| Entry::of(consumer, &v))
            .unwrap_or_default()
    };
    match change {
        Change::Applied(o) => {
            let e = entry(o);
            let mut gone: Vec<ObjectKey> = e.moved_from.clone();
            {
                let mut refs = locks::write(&ctx.references);
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
                let mut refs = locks::write(&ctx.references);
                let before = refs.get(&key(o)).map(|e| e.refers.clone());
                refs.delete(&key(o));
                before.unwrap_or_default()
            };
            let _ = freed.unbounded_send(gone);
        }
        Change::Relisted(all) => {
            let entries = all.iter().map(|o| (key(o), entry(o))).collect();
            locks::write(&ctx.references).relisted(consumer.kind, entries);
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

/// Keeps what references and re-pointing read: metadata without managed
/// fields, the spec, and `status.observedGeneration`.
fn slim(object: &mut DynamicObject) {
    object.metadata.managed_fields = None;
    let observed = object.data.pointer("/status/observedGeneration").cloned();
    if let Some(o) = object.data.as_object_mut() {
        o.remove("status");
        if let Some(observed) = observed {
            o.insert(
                "status".into(),
                serde_json::json!({ "observedGeneration": observed }),
            );
        }
    }
}
