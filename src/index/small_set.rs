//! A sorted set kept in a vector: for the owner index's many sets that hold
//! one or two entries (the Artifacts of one source, the groups of one kind),
//! where a `BTreeSet` would allocate a whole tree node for each.

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
                self.0.insert(at, value);
                self.0.shrink_to_fit();
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
                self.0.shrink_to_fit();
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
}
