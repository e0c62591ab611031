//! Keeps [`Policies`] from two cluster-wide watches: the SourcePolicies and
//! the namespaces' labels (metadata only). The webhook reads the result
//! under a read lock, so a change of a policy or of a namespace's labels
//! takes effect for the next admission, with no API call per request.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch as signal;

use super::{Policies, Rule};
use crate::api::policy::SourcePolicy;
use crate::locks;
use crate::telemetry::Readiness;
use crate::watch::retry::retrying;

/// One watch event, reduced to what [`Policies`] keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen<T> {
    Applied(String, T),
    Deleted(String),
    /// A new complete list begins.
    Listing,
    /// One object of the list.
    Listed(String, T),
    /// The list is complete.
    Complete,
}

/// A map kept from watch events: a relist replaces it whole when complete.
#[derive(Clone, Debug)]
pub struct Kept<T> {
    pub live: BTreeMap<String, T>,
    listing: Option<BTreeMap<String, T>>,
    pub synced: bool,
}

impl<T> Default for Kept<T> {
    fn default() -> Self {
        Kept {
            live: BTreeMap::new(),
            listing: None,
            synced: false,
        }
    }
}

impl<T> Kept<T> {
    /// Applies one event; true when `live` changed.
    pub fn see(&mut self, seen: Seen<T>) -> bool {
        match seen {
            Seen::Applied(name, value) => {
                self.live.insert(name, value);
                true
            }
            Seen::Deleted(name) => self.live.remove(&name).is_some(),
            Seen::Listing => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Seen::Listed(name, value) => {
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, value);
                false
            }
            Seen::Complete => {
                self.live = self.listing.take().unwrap_or_default();
                self.synced = true;
                true
            }
        }
    }
}

fn seen<K, T>(event: watcher::Event<K>, map: impl Fn(&K) -> T) -> Seen<T>
where
    K: ResourceExt,
{
    match event {
        watcher::Event::Apply(o) => Seen::Applied(o.name_any(), map(&o)),
        watcher::Event::Delete(o) => Seen::Deleted(o.name_any()),
        watcher::Event::Init => Seen::Listing,
        watcher::Event::InitApply(o) => Seen::Listed(o.name_any(), map(&o)),
        watcher::Event::InitDone => Seen::Complete,
    }
}

/// Watches SourcePolicies and namespaces until `stop` turns true, keeping
/// `shared` (unsynced until both watches have listed once). Watch errors
/// are retried with backoff and logged; what was kept stays in force.
/// `readiness`, when given, holds the replica's readiness back until both
/// have listed, and marks them broken while they fail.
pub async fn run(
    client: Client,
    shared: Arc<RwLock<Policies>>,
    readiness: Option<Arc<Readiness>>,
    mut stop: signal::Receiver<bool>,
) {
    locks::write(&shared).synced = false;
    let mut guards = readiness.map(|r| {
        [
            r.serving_watch("sourcepolicies.openflux.dev"),
            r.serving_watch("namespaces (labels)"),
        ]
    });
    let config = watcher::Config::default().any_semantic();
    let mut policies = retrying(Api::<SourcePolicy>::all(client.clone()), config.clone())
        .map(|e| {
            (
                0,
                e.map(|e| Either::Policy(seen(e, |p: &SourcePolicy| Rule::from(p)))),
            )
        })
        .boxed();
    let mut namespaces = retrying(Api::<PartialObjectMeta<Namespace>>::all(client), config)
        .map(|e| {
            (
                1,
                e.map(|e| Either::Namespace(seen(e, |n| n.labels().clone()))),
            )
        })
        .boxed();
    let mut rules: Kept<Rule> = Kept::default();
    let mut labels: Kept<BTreeMap<String, String>> = Kept::default();
    loop {
        let next = tokio::select! {
            e = policies.next() => e,
            e = namespaces.next() => e,
            _ = stop.changed() => return,
        };
        let Some((which, event)) = next else { return };
        let guard = guards.as_mut().map(|g| &mut g[which]);
        // Every attempt at a list begins with Listing, also the retries
        // of a list that keeps failing: it proves nothing.
        let listing = matches!(
            event,
            Ok(Either::Policy(Seen::Listing) | Either::Namespace(Seen::Listing))
        );
        let changed = match event {
            Ok(Either::Policy(seen)) => rules.see(seen),
            Ok(Either::Namespace(seen)) => labels.see(seen),
            Err(error) => {
                if let Some(guard) = guard {
                    guard.failed();
                }
                tracing::warn!(%error, "watch of SourcePolicies or namespaces failed; retrying");
                continue;
            }
        };
        if let Some(guard) = guard {
            if !listing {
                guard.ok();
            }
            if [rules.synced, labels.synced][which] {
                guard.synced();
            }
        }
        if changed {
            let mut policies = locks::write(&shared);
            policies.rules = rules.live.clone();
            policies.namespaces = labels.live.clone();
            policies.synced = rules.synced && labels.synced;
        }
    }
}

enum Either {
    Policy(Seen<Rule>),
    Namespace(Seen<BTreeMap<String, String>>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::WATCH_STALE_AFTER;
    use crate::watch::fake_api::{lists_server, List};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_policy_watch_whose_relist_keeps_failing_makes_the_replica_unready() {
        // The first list of SourcePolicies is answered, its watch is told
        // to list again, and every list after that is refused.
        let (client, _lists) = lists_server(
            |path, n| match (path, n) {
                ("sourcepolicies", 1..) => List::Refused,
                _ => List::Empty,
            },
            &["sourcepolicies"],
        );
        let readiness = Arc::new(Readiness::default());
        let (_stop, stop) = signal::channel(false);
        let policies: Arc<RwLock<Policies>> = Arc::default();
        tokio::spawn(run(client, policies.clone(), Some(readiness.clone()), stop));
        // The paused clock moves on whenever every task waits.
        tokio::time::sleep(WATCH_STALE_AFTER + Duration::from_secs(5)).await;
        assert!(locks::read(&policies).synced, "both watches listed once");
        let why = readiness.why_not_ready();
        assert!(
            why.as_deref().is_some_and(|w| w.contains("sourcepolicies")),
            "{why:?}"
        );
    }

    #[test]
    fn a_relist_replaces_what_was_kept_when_complete() {
        let mut kept: Kept<u8> = Kept::default();
        assert!(kept.see(Seen::Applied("a".into(), 1)));
        assert!(!kept.synced);
        assert!(!kept.see(Seen::Listing));
        assert!(!kept.see(Seen::Listed("b".into(), 2)));
        // Until the list is complete the old state stays in force.
        assert_eq!(kept.live.keys().collect::<Vec<_>>(), ["a"]);
        assert!(kept.see(Seen::Complete));
        assert!(kept.synced);
        assert_eq!(kept.live.keys().collect::<Vec<_>>(), ["b"]);
        assert!(kept.see(Seen::Deleted("b".into())));
        assert!(!kept.see(Seen::Deleted("b".into())));
        assert!(kept.live.is_empty());
    }
}
