//! The `gotk_*` series the export controller records per Artifact, and
//! their removal once the Artifact is gone: at once when a wake finds it
//! gone (the router wakes a deleted Artifact's own reconcile, exported or
//! not), otherwise by a sweep every [`SERIES_SWEEP`]
//! (series recorded after that wake, by a reconcile that was running).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::runtime::{ControllerMetrics, ObjectLabels};
use crate::api::{Artifact, KIND};
use crate::locks;

/// How often the series of deleted Artifacts are looked for.
pub const SERIES_SWEEP: Duration = Duration::from_secs(30);

/// The Artifacts whose series were recorded.
#[derive(Default)]
pub struct Series(Mutex<HashSet<ObjectRef<Artifact>>>);

impl Series {
    /// Records that `key`'s series exist (call after the reconcile's guard
    /// wrote them: a sweep in between finds them on its next pass).
    pub fn record(&self, key: ObjectRef<Artifact>) {
        locks::lock(&self.0).insert(key);
    }

    /// Removes the series of the Artifact `key` (deleted).
    pub fn forget(&self, key: &ObjectRef<Artifact>, metrics: &ControllerMetrics) {
        if locks::lock(&self.0).remove(key) {
            metrics.delete_object(&ObjectLabels {
                kind: KIND.to_string(),
                name: key.name.clone(),
                namespace: key.namespace.clone().unwrap_or_default(),
            });
        }
    }

    /// Removes the series of every recorded Artifact `artifacts` no longer
    /// holds.
    pub fn sweep(&self, artifacts: &Store<Artifact>, metrics: &ControllerMetrics) {
        let recorded: Vec<ObjectRef<Artifact>> = locks::lock(&self.0).iter().cloned().collect();
        for key in recorded {
            if artifacts.get(&key).is_none() {
                self.forget(&key, metrics);
            }
        }
    }
}
