//! The [`Hub`] that routes what every watch sees: the router decides, the
//! hub changes the owner index and hands the wakes to whoever listens (the
//! leader's controllers).

use std::sync::{Arc, RwLock};

use super::router::{route, Event};
use super::wakes::{WakeReceiver, WakeSender};
use crate::index::OwnerIndex;
use crate::locks;
use crate::telemetry::Metrics;

/// Where every watch's changes go: through the router, into the owner index
/// and out to the listeners of wakes.
#[derive(Clone)]
pub struct Hub {
    index: Arc<RwLock<OwnerIndex>>,
    metrics: Metrics,
    wakes: WakeSender,
}

impl Hub {
    pub fn new(index: Arc<RwLock<OwnerIndex>>, metrics: Metrics) -> Self {
        Self {
            index,
            metrics,
            wakes: WakeSender::default(),
        }
    }

    /// Routes one event and applies what the router decided.
    pub fn take(&self, event: Event<'_>) {
        let routed = route(&event, &locks::read(&self.index));
        if let Some(change) = routed.index {
            // The watch of Artifacts is the index's only writer, so nothing
            // changed it since the router read it.
            let mut index = locks::write(&self.index);
            index.change(change);
            self.metrics.indexed_artifacts.set(index.len() as i64);
        }
        if !routed.wake.is_empty() {
            self.wakes.send(routed.wake);
        }
    }

    /// Listens to the wakes from now on (one listener: the leader).
    pub fn subscribe(&self) -> WakeReceiver {
        self.wakes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Artifact, ArtifactSpec};
    use crate::watch::change::Change;

    #[test]
    fn the_hub_changes_the_index_and_hands_out_wakes() {
        let index = Arc::new(RwLock::new(OwnerIndex::new()));
        let mut registry = prometheus_client::registry::Registry::default();
        let hub = Hub::new(index.clone(), Metrics::register(&mut registry));
        let mut artifact = Artifact::new("a", ArtifactSpec::default());
        artifact.metadata.namespace = Some("apps".into());
        let mut other = Artifact::new("b", ArtifactSpec::default());
        other.metadata.namespace = Some("apps".into());
        // Nobody listens: the index still changes.
        hub.take(Event::Artifact(Change::Applied(&artifact)));
        assert_eq!(locks::read(&index).len(), 1);
        let mut wakes = hub.subscribe();
        hub.take(Event::Artifact(Change::Deleted(&artifact)));
        hub.take(Event::Artifact(Change::Relisted(&[Arc::new(
            artifact.clone(),
        )])));
        assert!(locks::read(&index).is_synced());
        assert_eq!(
            wakes.try_recv().len(),
            1,
            "the delete and the relist both wake the export of the Artifact, once"
        );
        assert!(wakes.try_recv().is_empty());
        // Listed one by one (an Artifact the store does not keep): set
        // aside, unseen and waking nobody, until the list ends.
        hub.take(Event::Artifact(Change::Listing));
        hub.take(Event::Artifact(Change::Listed(&artifact)));
        hub.take(Event::Artifact(Change::Listed(&other)));
        assert_eq!(locks::read(&index).len(), 1);
        assert!(locks::read(&index).artifact("apps", "b").is_none());
        assert!(wakes.try_recv().is_empty());
        hub.take(Event::Artifact(Change::Relisted(&[])));
        assert_eq!(locks::read(&index).len(), 2);
        assert_eq!(wakes.try_recv().len(), 2);
    }
}
