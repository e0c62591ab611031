//! The mirror's store of one source kind: every source its watch has seen,
//! as a [`Source`], by namespace and name.
//!
//! kube's store would keep each object whole with a key of four more
//! strings, and build a second map through every list before swapping it
//! in. Here a slot is one pointer, the name is the source's own, the
//! namespace's text is kept once for all the sources in it, and a list
//! writes into the live map: each listed source replaces its entry as it
//! arrives (and wakes the mirror at once), and when the list ends the
//! entries it did not bring are dropped.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock};

use hashbrown::{DefaultHashBuilder, HashTable};

use super::source::{FluxSource, Source};
use crate::locks;
use crate::watch::change::Change;

struct Kept {
    source: Arc<Source>,
    /// The list that brought it (or, for a watch event, the last list).
    list: u64,
}

#[derive(Default)]
struct Table {
    kept: HashTable<Kept>,
    hasher: DefaultHashBuilder,
    /// Counts the lists begun.
    list: u64,
    /// The text of each namespace a kept source is in, shared by all of
    /// them (and by the wakes and the backlog that name them).
    namespaces: HashSet<Arc<str>>,
}

impl Table {
    /// The shared text of `namespace`.
    fn namespace(&mut self, namespace: &str) -> Arc<str> {
        if let Some(kept) = self.namespaces.get(namespace) {
            return kept.clone();
        }
        let kept: Arc<str> = namespace.into();
        self.namespaces.insert(kept.clone());
        kept
    }

    /// Lets go of `namespace`'s text when nothing else holds it.
    fn forget_namespace(&mut self, namespace: &str) {
        if self
            .namespaces
            .get(namespace)
            .is_some_and(|kept| !held(kept))
        {
            self.namespaces.remove(namespace);
        }
    }

    fn get(&self, namespace: &str, name: &str) -> Option<&Arc<Source>> {
        let hash = hash_of(&self.hasher, namespace, name);
        self.kept
            .find(hash, |k| is(&k.source, namespace, name))
            .map(|k| &k.source)
    }

    fn insert(&mut self, source: Arc<Source>) {
        let hash = hash_of(&self.hasher, &source.namespace, &source.name);
        let list = self.list;
        let found = self
            .kept
            .find_mut(hash, |k| is(&k.source, &source.namespace, &source.name));
        if let Some(kept) = found {
            *kept = Kept { source, list };
            return;
        }
        let hasher = &self.hasher;
        self.kept.insert_unique(hash, Kept { source, list }, |k| {
            hash_of(hasher, &k.source.namespace, &k.source.name)
        });
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        let hash = hash_of(&self.hasher, namespace, name);
        if let Ok(slot) = self
            .kept
            .find_entry(hash, |k| is(&k.source, namespace, name))
        {
            slot.remove();
            self.forget_namespace(namespace);
        }
    }
}

/// Whether a namespace's text is held beyond the store's own set: by a
/// kept source, a wake or the backlog.
fn held(namespace: &Arc<str>) -> bool {
    Arc::strong_count(namespace) > 1
}

fn hash_of(hasher: &DefaultHashBuilder, namespace: &str, name: &str) -> u64 {
    hasher.hash_one((namespace, name))
}

fn is(source: &Source, namespace: &str, name: &str) -> bool {
    source.key() == (namespace, name)
}

/// The store of one mirror; clones share it.
#[derive(Clone, Default)]
pub struct Sources(Arc<RwLock<Table>>);

impl Sources {
    /// The source `name` in `namespace`, if the watch has seen it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Source>> {
        locks::read(&self.0).get(namespace, name).cloned()
    }

    /// Every source kept.
    pub fn all(&self) -> Vec<Arc<Source>> {
        let table = locks::read(&self.0);
        table.kept.iter().map(|k| k.source.clone()).collect()
    }

    /// How many sources are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        locks::read(&self.0).kept.len()
    }

    /// Keeps `source` as it is.
    #[cfg(test)]
    pub(super) fn insert(&self, source: Source) -> Arc<Source> {
        let source = Arc::new(source);
        locks::write(&self.0).insert(source.clone());
        source
    }

    /// Keeps what the watch saw of `object`, in place of what was kept.
    fn keep(&self, object: &FluxSource) -> Arc<Source> {
        let mut table = locks::write(&self.0);
        let namespace = table.namespace(object.metadata.namespace.as_deref().unwrap_or_default());
        let source = Arc::new(Source::in_namespace(object, namespace));
        table.insert(source.clone());
        source
    }

    /// Takes one change of the watch into the store, then hands `then` the
    /// same change of the kept source (a list's end brings no objects: each
    /// came with [`Change::Listed`]). The store changes first, so whoever
    /// `then` wakes finds what the watch saw.
    pub fn take(&self, change: Change<'_, FluxSource>, then: impl FnOnce(Change<'_, Source>)) {
        match change {
            Change::Applied(object) => then(Change::Applied(&self.keep(object))),
            Change::Listed(object) => then(Change::Listed(&self.keep(object))),
            Change::Deleted(object) => {
                let source = Source::from(object);
                locks::write(&self.0).remove(&source.namespace, &source.name);
                then(Change::Deleted(&source));
            }
            Change::Listing => {
                locks::write(&self.0).list += 1;
                then(Change::Listing);
            }
            Change::Relisted(_) => {
                let mut table = locks::write(&self.0);
                let list = table.list;
                table.kept.retain(|k| k.list == list);
                table.namespaces.retain(held);
                drop(table);
                then(Change::Relisted(&[]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(name: &str, revision: &str) -> FluxSource {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "apps", "uid": format!("u-{name}")},
            "status": {"artifact": {"revision": revision}},
        }))
        .unwrap()
    }

    fn revision(store: &Sources, name: &str) -> Option<String> {
        let source = store.get("apps", name)?;
        let artifact: serde_json::Value =
            serde_json::from_str(source.artifact.as_deref()?).unwrap();
        Some(artifact["revision"].as_str()?.to_string())
    }

    /// Takes `change` and says what was handed on, as text.
    fn take(store: &Sources, change: Change<'_, FluxSource>) -> String {
        let mut seen = String::new();
        store.take(change, |c| {
            seen = match c {
                Change::Applied(s) => format!("applied {}", s.name),
                Change::Listed(s) => format!("listed {}", s.name),
                Change::Deleted(s) => format!("deleted {}", s.name),
                Change::Listing => "listing".into(),
                Change::Relisted(all) => format!("relisted {}", all.len()),
            };
            // Handed on after the store changed.
            if let Change::Applied(s) | Change::Listed(s) = c {
                assert!(std::ptr::eq(&*store.get(&s.namespace, &s.name).unwrap(), s));
            }
        });
        seen
    }

    #[test]
    fn keeps_what_the_watch_saw() {
        let store = Sources::default();
        assert_eq!(
            take(&store, Change::Applied(&object("a", "r1"))),
            "applied a"
        );
        assert_eq!(
            take(&store, Change::Applied(&object("a", "r2"))),
            "applied a"
        );
        assert_eq!(revision(&store, "a").as_deref(), Some("r2"));
        assert_eq!(store.len(), 1);
        assert_eq!(
            take(&store, Change::Deleted(&object("a", "r2"))),
            "deleted a"
        );
        assert_eq!(store.len(), 0);
        // Deleting what is not kept changes nothing.
        take(&store, Change::Deleted(&object("b", "r1")));
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn a_list_replaces_as_it_goes_and_drops_what_it_did_not_bring() {
        let store = Sources::default();
        for name in ["a", "b", "c"] {
            take(&store, Change::Applied(&object(name, "r1")));
        }
        assert_eq!(take(&store, Change::Listing), "listing");
        assert_eq!(take(&store, Change::Listed(&object("b", "r2"))), "listed b");
        // Until the list ends, what it has not brought yet is still there.
        assert_eq!(revision(&store, "a").as_deref(), Some("r1"));
        assert_eq!(revision(&store, "b").as_deref(), Some("r2"));
        take(&store, Change::Listed(&object("d", "r1")));
        assert_eq!(take(&store, Change::Relisted(&[])), "relisted 0");
        let mut names: Vec<String> = store.all().iter().map(|s| s.name.to_string()).collect();
        names.sort();
        assert_eq!(names, ["b", "d"]);
        // A list broken off and begun again: only the second one counts.
        take(&store, Change::Listing);
        take(&store, Change::Listed(&object("b", "r3")));
        take(&store, Change::Listing);
        take(&store, Change::Listed(&object("d", "r3")));
        take(&store, Change::Relisted(&[]));
        assert_eq!(store.len(), 1);
        assert_eq!(revision(&store, "d").as_deref(), Some("r3"));
    }

    #[test]
    fn a_namespace_is_kept_once_while_a_source_is_in_it() {
        let store = Sources::default();
        let mut elsewhere = object("c", "r1");
        elsewhere.metadata.namespace = Some("other".into());
        take(&store, Change::Applied(&object("a", "r1")));
        take(&store, Change::Applied(&object("b", "r1")));
        take(&store, Change::Applied(&elsewhere));
        let (a, b) = (
            store.get("apps", "a").unwrap(),
            store.get("apps", "b").unwrap(),
        );
        assert!(Arc::ptr_eq(&a.namespace, &b.namespace));
        assert_eq!(locks::read(&store.0).namespaces.len(), 2);
        drop((a, b));
        // Its last source deleted, a namespace's text goes.
        take(&store, Change::Deleted(&elsewhere));
        assert_eq!(locks::read(&store.0).namespaces.len(), 1);
        // A name held elsewhere (a wake) keeps it until a list ends
        // without it.
        let held = store.get("apps", "a").unwrap().namespace.clone();
        take(&store, Change::Deleted(&object("a", "r1")));
        take(&store, Change::Deleted(&object("b", "r1")));
        assert_eq!(locks::read(&store.0).namespaces.len(), 1);
        take(&store, Change::Listing);
        take(&store, Change::Relisted(&[]));
        assert_eq!(locks::read(&store.0).namespaces.len(), 1);
        drop(held);
        take(&store, Change::Listing);
        take(&store, Change::Relisted(&[]));
        assert!(locks::read(&store.0).namespaces.is_empty());
        // And comes back with the next source in it.
        take(&store, Change::Applied(&object("a", "r2")));
        assert_eq!(revision(&store, "a").as_deref(), Some("r2"));
    }

    #[test]
    fn sources_are_told_apart_by_namespace_and_name() {
        let store = Sources::default();
        let mut elsewhere = object("a", "r2");
        elsewhere.metadata.namespace = Some("other".into());
        take(&store, Change::Applied(&object("a", "r1")));
        take(&store, Change::Applied(&elsewhere));
        assert_eq!(store.len(), 2);
        assert_eq!(revision(&store, "a").as_deref(), Some("r1"));
        assert!(store.get("other", "a").is_some());
        assert!(store.get("apps", "b").is_none());
    }
}
