//! The memo that keeps a stale cache from causing a second identical
//! write, shared by the controllers that write (each under keys of its own).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use serde::Serialize;

use crate::locks;

/// The most entries the write memo keeps.
pub const MEMO_LIMIT: usize = 100_000;

/// Remembers the last write made for each object, so that a reconcile that
/// runs again before the watch delivered that write (a stale cache) does not
/// send the same write twice: one change of a source costs one API write.
#[derive(Default)]
pub struct WriteMemo {
    written: Mutex<HashMap<String, (Option<String>, u64)>>,
}

impl WriteMemo {
    /// Whether `hash` was written last for `key` while the cache showed the
    /// object at `resource_version`, which it still shows (so the cache has
    /// not caught up with that write yet).
    pub fn already_written(&self, key: &str, resource_version: Option<&str>, hash: u64) -> bool {
        locks::lock(&self.written)
            .get(key)
            .is_some_and(|(rv, h)| *h == hash && rv.as_deref() == resource_version)
    }

    /// Records a write. The memo is bounded: past [`MEMO_LIMIT`] entries it
    /// starts over (forgetting costs at most one repeated write per object).
    pub fn record(&self, key: String, resource_version_before: Option<String>, hash: u64) {
        let mut written = locks::lock(&self.written);
        if written.len() >= MEMO_LIMIT && !written.contains_key(&key) {
            written.clear();
        }
        written.insert(key, (resource_version_before, hash));
    }

    /// Whether `hash` is what was written last for `key`: then the cache
    /// has caught up with that write, which is forgotten.
    pub fn settle(&self, key: &str, hash: u64) -> bool {
        let mut written = locks::lock(&self.written);
        let settled = written.get(key).is_some_and(|(_, h)| *h == hash);
        if settled {
            written.remove(key);
        }
        settled
    }

    pub fn len(&self) -> usize {
        locks::lock(&self.written).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn forget(&self, key: &str) {
        locks::lock(&self.written).remove(key);
    }
}

/// A stable hash of the JSON form of `value`.
pub fn hash_of<T: Serialize>(value: &T) -> Result<u64, serde_json::Error> {
    let json = serde_json::to_string(value)?;
    let mut h = DefaultHasher::new();
    json.hash(&mut h);
    Ok(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_skips_only_while_the_cache_is_stale() {
        let memo = WriteMemo::default();
        assert!(!memo.already_written("k", Some("1"), 7));
        memo.record("k".into(), Some("1".into()), 7);
        assert!(
            memo.already_written("k", Some("1"), 7),
            "cache still at rv 1"
        );
        assert!(
            !memo.already_written("k", Some("2"), 7),
            "object changed since"
        );
        assert!(
            !memo.already_written("k", Some("1"), 8),
            "different content"
        );
        memo.forget("k");
        assert!(!memo.already_written("k", Some("1"), 7));
    }

    #[test]
    fn the_memo_stays_bounded() {
        let memo = WriteMemo::default();
        for i in 0..(MEMO_LIMIT + 10) {
            memo.record(format!("k{i}"), None, 1);
            assert!(memo.len() <= MEMO_LIMIT);
        }
        assert!(memo.already_written(&format!("k{}", MEMO_LIMIT + 9), None, 1));
    }

    #[test]
    fn a_write_seen_by_the_watch_is_settled_once() {
        let memo = WriteMemo::default();
        memo.record("k".into(), Some("1".into()), 7);
        assert!(!memo.settle("k", 8), "another content is not the write");
        assert!(!memo.settle("other", 7));
        assert!(memo.settle("k", 7));
        assert!(memo.is_empty(), "settled writes are forgotten");
        assert!(!memo.settle("k", 7));
    }
}
