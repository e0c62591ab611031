//! Which exported objects the consumers in the cluster refer to: what the
//! export controller must keep while Flux may still read it.
//!
//! Fed by the leader's watches of the consumer kinds, one entry a consumer:
//! the stock-kind objects its references name, the objects it was moved
//! away from (the [`MOVED_FROM_ANNOTATION`]) and whether its controller has
//! reconciled its latest spec. An object is referred to while a consumer
//! names it, or was moved away from it and has not reconciled the move yet.
//! Until every consumer kind's watch has listed once, everything counts as
//! referred to, so nothing is deleted on a guess. Pure data.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::consumers::repoint::{references, ObjectKey};
use crate::vocabulary::consumers::Consumer;
use crate::vocabulary::marks::MOVED_FROM_ANNOTATION;

/// What is kept of one consumer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub refers: Vec<ObjectKey>,
    pub moved_from: Vec<ObjectKey>,
    pub reconciled: bool,
}

impl Entry {
    /// Reads a consumer object.
    pub fn of(consumer: &Consumer, object: &Value) -> Self {
        let int = |p: &str| object.pointer(p).and_then(Value::as_i64);
        let reconciled = match (
            int("/metadata/generation"),
            int("/status/observedGeneration"),
        ) {
            (Some(generation), Some(observed)) => observed >= generation,
            _ => false,
        };
        let moved_from = object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(MOVED_FROM_ANNOTATION))
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        Self {
            refers: references(consumer, object),
            moved_from,
            reconciled,
        }
    }
}

/// Identity of a consumer: kind, namespace, name.
pub type ConsumerKey = (&'static str, String, String);

/// The index.
#[derive(Debug, Default)]
pub struct References {
    entries: BTreeMap<ConsumerKey, Entry>,
    /// Consumer kinds whose watch has listed everything.
    listed: BTreeSet<&'static str>,
    /// Consumer kinds being watched.
    watched: BTreeSet<&'static str>,
}

impl References {
    /// A consumer kind is now watched; until it has listed, nothing is free.
    pub fn watching(&mut self, kind: &'static str) {
        self.watched.insert(kind);
    }

    pub fn apply(&mut self, key: ConsumerKey, entry: Entry) {
        self.entries.insert(key, entry);
    }

    pub fn get(&self, key: &ConsumerKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    pub fn delete(&mut self, key: &ConsumerKey) {
        self.entries.remove(key);
    }

    /// Replaces every entry of `kind` after a complete list.
    pub fn relisted(&mut self, kind: &'static str, entries: Vec<(ConsumerKey, Entry)>) {
        self.entries.retain(|k, _| k.0 != kind);
        self.entries.extend(entries);
        self.listed.insert(kind);
    }

    /// Whether every watched consumer kind has listed.
    pub fn is_synced(&self) -> bool {
        self.watched.is_subset(&self.listed)
    }

    /// Whether Flux may still read the object `kind` `namespace`/`name`.
    pub fn refers_to(&self, namespace: &str, kind: &str, name: &str) -> bool {
        if !self.is_synced() {
            return true;
        }
        let is = |k: &ObjectKey| k.namespace == namespace && k.kind == kind && k.name == name;
        self.entries
            .values()
            .any(|e| e.refers.iter().any(is) || (!e.reconciled && e.moved_from.iter().any(is)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::consumers::CONSUMERS;
    use serde_json::json;

    fn ks(name: &str, to: &str, moved_from: Option<&str>, generation: i64, observed: i64) -> Value {
        let mut annotations = serde_json::Map::new();
        if let Some(m) = moved_from {
            let from = vec![ObjectKey {
                kind: "ExternalArtifact".into(),
                namespace: "apps".into(),
                name: m.into(),
            }];
            annotations.insert(
                MOVED_FROM_ANNOTATION.into(),
                json!(serde_json::to_string(&from).unwrap()),
            );
        }
        json!({
            "metadata": {"name": name, "namespace": "apps", "generation": generation, "annotations": annotations},
            "spec": {"sourceRef": {"kind": "OCIRepository", "name": to}},
            "status": {"observedGeneration": observed},
        })
    }

    #[test]
    fn moved_from_objects_are_kept_until_the_consumer_reconciled() {
        let consumer = &CONSUMERS[0];
        let key: ConsumerKey = (consumer.kind, "apps".into(), "app".into());
        let mut refs = References::default();
        refs.watching(consumer.kind);
        // Not listed yet: everything is referred to.
        assert!(refs.refers_to("apps", "ExternalArtifact", "anything"));
        refs.relisted(consumer.kind, vec![]);
        assert!(!refs.refers_to("apps", "ExternalArtifact", "web"));
        refs.apply(
            key.clone(),
            Entry::of(consumer, &ks("app", "web", Some("web"), 2, 1)),
        );
        assert!(refs.refers_to("apps", "OCIRepository", "web"));
        assert!(refs.refers_to("apps", "ExternalArtifact", "web"));
        assert!(!refs.refers_to("other", "ExternalArtifact", "web"));
        refs.apply(
            key.clone(),
            Entry::of(consumer, &ks("app", "web", Some("web"), 2, 2)),
        );
        assert!(!refs.refers_to("apps", "ExternalArtifact", "web"));
        assert!(refs.refers_to("apps", "OCIRepository", "web"));
        refs.delete(&key);
        assert!(!refs.refers_to("apps", "OCIRepository", "web"));
    }
}
