//! Who is reconciling: the controller's identity as controller-runtime
//! names it, and the random identifiers of reconciles and replicas.

use kube::Resource;

/// A controller's identity, as controller-runtime names it in logs and
/// metrics: `name` is the lower-cased kind it reconciles.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ControllerId {
    /// `controller` label and log key, e.g. `gitrepository`.
    pub name: String,
    /// API group of the reconciled kind (`controllerGroup`).
    pub group: String,
    /// The reconciled kind (`controllerKind`).
    pub kind: String,
}

impl ControllerId {
    /// The controller of resource type `K`.
    pub fn of<K: Resource<DynamicType = ()>>() -> Self {
        let kind = K::kind(&()).into_owned();
        ControllerId {
            name: kind.to_ascii_lowercase(),
            group: K::group(&()).into_owned(),
            kind,
        }
    }
}

/// A random identifier shaped like a UUID (reconcile IDs, leader election
/// identities). Random enough to tell reconciles and replicas apart; not
/// for secrets.
pub(crate) fn random_id() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let word = || {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        h.finish()
    };
    let (a, b) = (word(), word());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_controllers_like_controller_runtime() {
        let id = ControllerId::of::<crate::Artifact>();
        assert_eq!(id.name, "artifact");
        assert_eq!(id.group, "openflux.dev");
        assert_eq!(id.kind, "Artifact");
    }

    #[test]
    fn random_ids_are_uuid_shaped_and_distinct() {
        let (a, b) = (random_id(), random_id());
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }
}
