//! What a watch saw, as its callers take it.

use std::sync::Arc;

/// What a watch saw.
#[derive(Debug)]
pub enum Change<'a, K> {
    /// The object was created or changed.
    Applied(&'a K),
    /// The object went away.
    Deleted(&'a K),
    /// The watch began to list every object again: what an earlier list
    /// brought before it broke off counts for nothing.
    Listing,
    /// One object of the list in progress that the watch's store does not
    /// keep, handed over as it arrives so that nothing holds it whole until
    /// the list ends. It is part of the [`Change::Relisted`] that follows.
    Listed(&'a K),
    /// The list ended: these objects, and those [`Change::Listed`] since
    /// the list began, are all there are.
    Relisted(&'a [Arc<K>]),
}
