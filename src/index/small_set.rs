//! A sorted set kept in a vector: for the owner index's many sets that hold
//! one or two entries (the Artifacts of one source, the groups of one kind),
//! where a `BTreeSet` would allocate a whole tree node for each.
//!
//! A set of one entry holds exactly one; past that the vector doubles when
//! full and halves when three quarters are free, so n inserts or removes
//! move the entries O(n) times in all (not once each, as shrinking to fit
//! after every change would), while a set of a tenant's thousand Artifacts
//! is still one allocation.

/// A set of `T` in ascending order, without duplicates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmallSet<T>(Vec<T>);

impl<T> Default for SmallSet<T> {
    fn default() -> Self {
        SmallSet(Vec::new())
    }
}

impl<T: Ord> SmallSet<T> {
    /// Adds `value`; `false` if it was there already.
    pub fn insert(&mut self, value: T) -> bool {
        match self.0.binary_search(&value) {
            Ok(_) => false,
            Err(at) => {
                if self.0.len() == self.0.capacity() {
                    // Exactly one for the first entry, then doubling.
                    self.0.reserve_exact(self.0.len().max(1));
                }
                self.0.insert(at, value);
                true
            }
        }
    }

    /// Removes the entry equal to `value`; `false` if there was none.
    pub fn remove<Q>(&mut self, value: &Q) -> bool
    where
        T: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self.0.binary_search_by(|v| v.borrow().cmp(value)) {
            Ok(at) => {
                self.0.remove(at);
                if self.0.len() <= self.0.capacity() / 4 {
                    self.0.shrink_to(self.0.len() * 2);
                }
                true
            }
            Err(_) => false,
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many entries it has room for without allocating.
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// The entries in ascending order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<'a, T> IntoIterator for &'a SmallSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn behaves_as_a_btree_set() {
        let mut small = SmallSet::default();
        let mut tree = BTreeSet::new();
        // A fixed pseudo-random walk of inserts and removes.
        let mut x: u32 = 7;
        for _ in 0..2000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let value = (x >> 16) % 17;
            if x.is_multiple_of(3) {
                assert_eq!(small.remove(&value), tree.remove(&value));
            } else {
                assert_eq!(small.insert(value), tree.insert(value));
            }
            assert_eq!(small.len(), tree.len());
            assert!(small.iter().eq(tree.iter()));
        }
        let mut names: SmallSet<String> = SmallSet::default();
        names.insert("b".into());
        names.insert("a".into());
        assert!(names.remove("a") && !names.remove("a") && !names.is_empty());
    }

    /// One entry takes room for one; a thousand inserts then a thousand
    /// removes allocate a number of times that grows with the logarithm of
    /// the size, not with the number of changes, and the room stays within
    /// four times the entries.
    #[test]
    fn grows_and_shrinks_by_doubling() {
        let mut set = SmallSet::default();
        set.insert(0u32);
        assert_eq!(set.capacity(), 1, "a set of one holds exactly one");
        let mut allocations = 0;
        let mut room = set.capacity();
        let mut step = |set: &SmallSet<u32>| {
            if set.capacity() != room {
                allocations += 1;
                room = set.capacity();
            }
            assert!(room <= 4 * set.len().max(1), "{room} for {}", set.len());
        };
        for i in 1..1000 {
            set.insert(i);
            step(&set);
        }
        for i in (1..1000).rev() {
            set.remove(&i);
            step(&set);
        }
        assert!(
            allocations <= 2 * 11,
            "{allocations} allocations for 2,000 changes"
        );
        assert_eq!(set.len(), 1);
        assert!(set.capacity() <= 2);
    }
}
