//! How the leader wakes a mirror, without knowing what it keeps: a source
//! by name, or every source.

use std::sync::Arc;

use super::backlog::Backlog;
use super::plan::{memo_key, Echo};
use super::store::Sources;
use crate::control::{Context, WakeHandle};

/// A running mirror's wake handle: its sources, and the backlog its
/// runner takes them from.
pub struct Waker {
    sources: Sources,
    backlog: Arc<Backlog>,
}

impl Waker {
    pub fn new(sources: Sources, backlog: Arc<Backlog>) -> Self {
        Self { sources, backlog }
    }

    /// Mirrors source `namespace/name` again, unless the change that woke it
    /// is `echo`, the echo of the mirror's own write. A source the store
    /// does not hold has nothing to mirror; its watch wakes it when it
    /// comes.
    pub fn source(&self, ctx: &Context, namespace: &str, name: &str, echo: Option<&Echo>) {
        if echo.is_some_and(|echo| is_echo(ctx, namespace, echo)) {
            return;
        }
        self.one(namespace, name);
    }
}

impl WakeHandle for Waker {
    /// Mirrors source `namespace/name` again, if the store holds it.
    fn one(&self, namespace: &str, name: &str) {
        if let Some(source) = self.sources.get(namespace, name) {
            self.backlog.wake(source);
        }
    }

    /// Mirrors every source again.
    fn every(&self) {
        for source in self.sources.all() {
            self.backlog.wake(source);
        }
    }
}

/// Whether the Artifact `echo` in `namespace`, as a watch saw it change, is
/// what the mirror last wrote there: the echo of that write, which needs no
/// reconcile (a change of its source wakes the mirror on its own). The
/// memo then forgets that write, as the reconcile that finds it up to date
/// would.
fn is_echo(ctx: &Context, namespace: &str, echo: &Echo) -> bool {
    ctx.memo
        .settle(&memo_key(namespace, &echo.artifact), echo.fingerprint)
}
