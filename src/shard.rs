//! Sharding, as Flux shards its controllers: each openflux shard runs with
//! `--watch-label-selector` (`sharding.fluxcd.io/key=shard1`, ...; the main
//! one with `!sharding.fluxcd.io/key`) and its own leader election Lease.
//!
//! What a shard does, and for which objects:
//!
//! - **mirrors**: the stock sources its selector selects (the watches are
//!   filtered by the API server); a mirrored Artifact carries its source's
//!   [`SHARD_LABEL`];
//! - **exports**: the Artifacts its selector selects, by the Artifact's own
//!   labels: a producer copies its source's [`SHARD_LABEL`] onto the
//!   Artifact, so an Artifact is exported by the shard of its source;
//! - **re-points**: the consumers (Kustomization, HelmRelease, ...) its
//!   selector selects, by the consumer's own labels, as Flux shards them;
//! - **adopts**: the Open Flux Artifacts its selector selects.
//!
//! Every shard still sees every Artifact (the owner index, from which its
//! webhook answers for any object of any shard) and every consumer (to know
//! which exports are still referred to). Pure decisions; the runtime wires
//! them.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::api::runtime::LabelSelector;
pub use crate::api::SHARD_LABEL;

/// Which objects this replica's controllers reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shard {
    selector: LabelSelector,
}

impl Shard {
    pub fn new(selector: LabelSelector) -> Self {
        Shard { selector }
    }

    /// Whether an object with these labels is this shard's to reconcile.
    pub fn owns(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }

    /// The leader election Lease of this shard: `base` without a selector,
    /// otherwise `base` and the first 8 hex digits of the selector's SHA-256,
    /// the name Flux's controllers derive for each shard's Lease.
    pub fn lease_name(&self, base: &str) -> String {
        lease_name(base, self.selector.as_str())
    }

    /// The selector, as written on the command line.
    pub fn selector(&self) -> &str {
        self.selector.as_str()
    }

    /// Whether this shard's leader keeps what all shards share and only one
    /// may write: the webhook's certificate Secret and the validating
    /// webhook configuration. The shard that takes the objects without a
    /// shard label does (the main one, `!sharding.fluxcd.io/key`, or an
    /// openflux that is not sharded); the other shards' replicas serve
    /// from what it keeps.
    pub fn keeps_shared(&self) -> bool {
        self.owns(&BTreeMap::new())
    }
}

/// `base`, or `base-<8 hex of sha256(selector)>` for a non-empty selector.
pub fn lease_name(base: &str, selector: &str) -> String {
    if selector.is_empty() {
        return base.to_string();
    }
    let digest = hex::encode(Sha256::digest(selector.as_bytes()));
    format!("{base}-{}", &digest[..8])
}

/// The [`SHARD_LABEL`] of `from`, as a label to add to an object derived
/// from it (none when `from` is in the main shard).
pub fn shard_label_of(from: &BTreeMap<String, String>) -> Option<(String, String)> {
    from.get(SHARD_LABEL)
        .map(|shard| (SHARD_LABEL.to_string(), shard.clone()))
}

/// Whether `current` is in the same shard as `desired` says: the
/// [`SHARD_LABEL`] is equal, or absent from both.
pub fn same_shard(current: &BTreeMap<String, String>, desired: &BTreeMap<String, String>) -> bool {
    current.get(SHARD_LABEL) == desired.get(SHARD_LABEL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(selector: &str) -> Shard {
        Shard::new(selector.parse().unwrap())
    }

    fn labels(shard: Option<&str>) -> BTreeMap<String, String> {
        shard
            .map(|s| (SHARD_LABEL.to_string(), s.to_string()))
            .into_iter()
            .collect()
    }

    #[test]
    fn every_object_has_exactly_one_shard() {
        let shards = [
            shard("sharding.fluxcd.io/key=shard1"),
            shard("sharding.fluxcd.io/key=shard2"),
            shard("!sharding.fluxcd.io/key"),
        ];
        for (object, owner) in [(Some("shard1"), 0), (Some("shard2"), 1), (None, 2)] {
            let owners: Vec<usize> = (0..shards.len())
                .filter(|i| shards[*i].owns(&labels(object)))
                .collect();
            assert_eq!(owners, [owner], "{object:?}");
        }
        // Unsharded: everything.
        assert!(Shard::default().owns(&labels(Some("shard1"))));
        assert!(Shard::default().owns(&labels(None)));
    }

    #[test]
    fn only_the_main_shard_keeps_what_shards_share() {
        assert!(Shard::default().keeps_shared());
        assert!(shard("!sharding.fluxcd.io/key").keeps_shared());
        assert!(!shard("sharding.fluxcd.io/key=shard1").keeps_shared());
        assert!(!shard("sharding.fluxcd.io/key in (shard1,shard2)").keeps_shared());
    }

    #[test]
    fn leases_are_named_as_fluxs() {
        // Flux's own example: "foo" and the selector "bar".
        assert_eq!(lease_name("foo", "bar"), "foo-fcde2b2e");
        assert_eq!(
            Shard::default().lease_name("openflux-leader-election"),
            "openflux-leader-election"
        );
        let one = shard("sharding.fluxcd.io/key=shard1").lease_name("openflux-leader-election");
        let main = shard("!sharding.fluxcd.io/key").lease_name("openflux-leader-election");
        assert!(one.starts_with("openflux-leader-election-"), "{one}");
        assert_eq!(one.len(), "openflux-leader-election-".len() + 8);
        assert_ne!(one, main);
    }

    #[test]
    fn derived_objects_keep_the_shard() {
        assert_eq!(
            shard_label_of(&labels(Some("shard1"))),
            Some((SHARD_LABEL.to_string(), "shard1".to_string()))
        );
        assert_eq!(shard_label_of(&labels(None)), None);
        assert!(same_shard(&labels(None), &labels(None)));
        assert!(!same_shard(&labels(Some("shard1")), &labels(None)));
        assert!(!same_shard(&labels(Some("a")), &labels(Some("b"))));
    }
}
