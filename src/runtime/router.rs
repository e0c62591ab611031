//! The event router: what one watch event means for the owner index, and
//! which reconcilers it wakes.
//!
//! [`route`] is a plain function from data to data: an event of one of the
//! watches (Artifacts, a stock source kind, the objects openflux exported)
//! and the owner index before the event go in; the [`IndexChange`] to make
//! and the set of [`Wake`]s come out. The watch loop applies both. The
//! rules:
//!
//! - An Artifact owned by a stock source wakes the mirror of that source (it
//!   keeps that Artifact), whether the Artifact changed or went away. A
//!   change carries the Artifact's fingerprint, so that the mirror's own
//!   write coming back through the watch can be told apart and dropped.
//! - Any other Artifact wakes the export controller for itself, and for
//!   the siblings whose export name the change can move: the source's
//!   default Artifact before and after it (the default takes the source's
//!   export name, the others keep their own).
//! - A stock source wakes its mirror when it changes, except the objects
//!   openflux exported itself (mirroring them would loop); a source that
//!   went away takes its Artifact along by garbage collection.
//! - An exported object that changes or goes away wakes the export
//!   controller for the Artifact that owns it, which puts it right.
//! - A watch that listed everything again (a start or restart) counts as
//!   every listed object changing; for Artifacts it also replaces the whole
//!   index. The Artifacts the watch does not keep are set aside in the index
//!   as they arrive, unseen by readers, and take part when the list ends.

use std::collections::BTreeSet;

use kube::core::DynamicObject;
use kube::ResourceExt;

use crate::api::{Artifact, StockSource, API_VERSION, KIND};
use crate::index::{ArtifactKey, IndexChange, IndexedArtifact, OwnerIndex, SourceKey, Text};
use crate::mirror::plan::{is_own_export, Echo};
use crate::mirror::source::Source;
use crate::names;
use crate::vocabulary::marks::SHADOW_LABEL;
use crate::watch::change::Change;

/// One event of one watch.
#[derive(Debug)]
pub enum Event<'a> {
    /// The watch of Artifacts (on every replica).
    Artifact(Change<'a, Artifact>),
    /// The watch of one stock source kind (on the leader).
    Source(&'static StockSource, Change<'a, Source>),
    /// The watch of the objects openflux exported (on the leader).
    Exported(Change<'a, DynamicObject>),
}

/// A reconciler to run for one object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Wake {
    /// The export controller, for this Artifact.
    Export(ArtifactKey),
    /// A shadow being deleted still carries source-controller's finalizer:
    /// take it off (source-controller stores nothing for a shadow, and may
    /// not run).
    Release {
        kind: String,
        namespace: String,
        name: String,
    },
    /// The mirror of a stock source kind, for this source. The names are
    /// shared with the owner index where they come from it: a relist of N
    /// mirrored Artifacts wakes N sources at once.
    Mirror {
        source: &'static str,
        namespace: Text,
        name: Text,
        /// The mirrored Artifact whose change woke it, as it is now: when
        /// that is what the mirror last wrote there, the change is the
        /// echo of that write and there is nothing to do.
        echo: Option<Echo>,
    },
}

impl Wake {
    /// The Artifact whose export this wakes, if it wakes an export.
    pub fn export_key(&self) -> Option<&ArtifactKey> {
        match self {
            Wake::Export(key) => Some(key),
            _ => None,
        }
    }
}

/// What an event implies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// The change to make to the owner index, if any.
    pub index: Option<IndexChange>,
    /// The reconcilers to wake.
    pub wake: BTreeSet<Wake>,
}

/// Routes one event. `index` is the owner index as it was before the event.
pub fn route(event: &Event<'_>, index: &OwnerIndex) -> Routed {
    match event {
        Event::Artifact(change) => route_artifact(change, index),
        Event::Source(stock, change) => Routed {
            index: None,
            wake: match change {
                Change::Applied(source) => mirror_wake(stock, source).into_iter().collect(),
                Change::Deleted(_) | Change::Listing => BTreeSet::new(),
                // The index is not involved: a listed source wakes at once.
                Change::Listed(source) => mirror_wake(stock, source).into_iter().collect(),
                Change::Relisted(all) => all.iter().filter_map(|s| mirror_wake(stock, s)).collect(),
            },
        },
        Event::Exported(change) => Routed {
            index: None,
            wake: match change {
                Change::Applied(object) | Change::Listed(object) => {
                    owners(object).chain(release(object)).collect()
                }
                Change::Deleted(object) => owners(object).collect(),
                Change::Listing => BTreeSet::new(),
                Change::Relisted(all) => all
                    .iter()
                    .flat_map(|o| owners(o).chain(release(o)))
                    .collect(),
            },
        },
    }
}

fn route_artifact(change: &Change<'_, Artifact>, index: &OwnerIndex) -> Routed {
    match change {
        Change::Applied(artifact) => match IndexedArtifact::from_artifact(artifact) {
            Some(entry) => Routed {
                wake: artifact_wakes(&entry, Seen::Applied, index),
                index: Some(IndexChange::Apply(entry)),
            },
            None => Routed::default(),
        },
        Change::Deleted(artifact) => match IndexedArtifact::from_artifact(artifact) {
            Some(entry) => Routed {
                wake: artifact_wakes(&entry, Seen::Deleted, index)
                    .into_iter()
                    .chain(freed_mirror_name(&entry))
                    .collect(),
                index: Some(IndexChange::Delete(entry.key)),
            },
            None => Routed::default(),
        },
        Change::Listing => Routed {
            index: Some(IndexChange::Listing),
            wake: BTreeSet::new(),
        },
        // Woken when the list ends, against the index it makes.
        Change::Listed(artifact) => Routed {
            index: IndexedArtifact::from_artifact(artifact).map(IndexChange::Listed),
            wake: BTreeSet::new(),
        },
        Change::Relisted(all) => {
            let entries: Vec<IndexedArtifact> = all
                .iter()
                .filter_map(|a| IndexedArtifact::from_artifact(a))
                .collect();
            // Siblings are listed too, so each wakes for itself: the index
            // before the relist has nothing to add. The first list of the
            // process wakes no mirror: each mirror looks at every one of
            // its sources when its own watch lists them, and those watches
            // list after this one (they take turns), against the index this
            // list makes.
            let first = !index.is_synced();
            let empty = OwnerIndex::new();
            let wake = entries
                .iter()
                .chain(index.listed())
                .filter(|entry| !(first && mirror_of(entry).is_some()))
                .flat_map(|entry| artifact_wakes(entry, Seen::Listed, &empty))
                .collect();
            Routed {
                index: Some(IndexChange::Reset(entries)),
                wake,
            }
        }
    }
}

/// How a watch saw an Artifact.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    Applied,
    Deleted,
    Listed,
}

/// Whom a change of the Artifact `entry` concerns. Its siblings are the same
/// in the index before and after the change, which touches `entry` alone.
/// A deleted Artifact wakes its own export reconcile too, which finds it
/// gone and removes its series at once, whether it was exported or not.
fn artifact_wakes(entry: &IndexedArtifact, seen: Seen, index: &OwnerIndex) -> BTreeSet<Wake> {
    let mut wake = BTreeSet::new();
    if seen == Seen::Deleted {
        wake.insert(Wake::Export(entry.key.clone()));
    }
    if let Some((stock, source)) = mirror_of(entry) {
        let echo = match (seen, &entry.mirrored) {
            (Seen::Applied, Some(mirrored)) => Some(Echo {
                artifact: entry.key.name.clone(),
                fingerprint: mirrored.fingerprint,
            }),
            _ => None,
        };
        wake.insert(Wake::Mirror {
            source: stock.kind,
            namespace: source.namespace.clone(),
            name: source.name.clone(),
            echo,
        });
        return wake;
    }
    wake.insert(Wake::Export(entry.key.clone()));
    // Of its siblings, only the source's default before and after the
    // change can see its export name move: a change wakes at most two of
    // them, however many the source has.
    wake.extend(
        index
            .defaults_around(entry, seen == Seen::Deleted)
            .into_iter()
            .flatten()
            .filter(|key| **key != entry.key)
            .map(|key| Wake::Export(key.clone())),
    );
    wake
}

/// The stock source kind and source whose mirror keeps `entry`, if a stock
/// source owns it.
fn mirror_of(entry: &IndexedArtifact) -> Option<(&'static StockSource, &SourceKey)> {
    let owner = entry.owner.as_ref()?;
    let stock = StockSource::find(&owner.source.group, &owner.source.kind)?;
    Some((stock, &owner.source))
}

/// An Artifact that was not its source's mirror but held a mirror's name
/// is gone: that mirror may now write its own (it was refused the name).
fn freed_mirror_name(entry: &IndexedArtifact) -> Option<Wake> {
    let (stock, name) = names::mirrored_source_of(&entry.key.name)?;
    let mirrored = entry.owner.as_ref().is_some_and(|o| {
        StockSource::find(&o.source.group, &o.source.kind).is_some_and(|s| s.kind == stock.kind)
            && o.source.name.as_ref() == name
    });
    (!mirrored).then(|| Wake::Mirror {
        source: stock.kind,
        namespace: entry.key.namespace.clone(),
        name: name.into(),
        echo: None,
    })
}

/// The names are the kept source's own.
fn mirror_wake(stock: &'static StockSource, source: &Source) -> Option<Wake> {
    (!is_own_export(stock, &source.labels)).then(|| Wake::Mirror {
        source: stock.kind,
        namespace: source.namespace.clone(),
        name: source.name.clone(),
        echo: None,
    })
}

/// The Artifacts that own an exported object.
fn release(object: &DynamicObject) -> Option<Wake> {
    let shadow = object.labels().contains_key(SHADOW_LABEL);
    let finalized = object
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| !f.is_empty());
    let deleting = object.metadata.deletion_timestamp.is_some();
    (shadow && finalized && deleting).then(|| Wake::Release {
        kind: object
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default(),
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    })
}

fn owners(object: &DynamicObject) -> impl Iterator<Item = Wake> + '_ {
    let namespace = object.namespace().unwrap_or_default();
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == KIND && o.api_version == API_VERSION)
        .map(move |o| Wake::Export(ArtifactKey::new(&namespace, &o.name)))
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
