//! Turns on the shared control planes. The end-to-end tests live as
//! modules of one test binary; some install objects the whole cluster sees
//! (admission policies, CRDs, webhook configurations) or stop the API
//! server, and each module was written to run with only its own tests
//! beside it. So the tests of one module run beside each other, as before,
//! and never beside another module's: [`Turn::take`] waits until no other
//! module's test holds a turn.
//!
//! The module is read from the test's thread, which the test harness names
//! after the test (`e2e_core::a_test`); a thread of another name (a task on
//! a runtime's worker, a test at a binary's root) takes no turn: the test
//! that started it holds one already, or has no module to keep apart.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Which module holds the turns, and how many of its tests hold one.
struct Holder {
    module: Option<String>,
    count: usize,
}

static HOLDER: Mutex<Holder> = Mutex::new(Holder {
    module: None,
    count: 0,
});
static RELEASED: Condvar = Condvar::new();

fn holder() -> MutexGuard<'static, Holder> {
    // A test that panicked while holding the lock left the counts right.
    HOLDER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A test's turn: while it lives, no test of another module runs.
#[derive(Debug)]
pub struct Turn {
    module: String,
}

impl Turn {
    /// The calling test's turn, waiting while another module holds the
    /// turns; `None` when the thread is not a test's thread of a module.
    pub fn take() -> Option<Turn> {
        let thread = std::thread::current();
        let module = module_of(thread.name()?)?.to_string();
        Some(Self::take_for(module))
    }

    fn take_for(module: String) -> Turn {
        let mut held = holder();
        while held.module.as_ref().is_some_and(|m| *m != module) {
            held = RELEASED.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        held.module = Some(module.clone());
        held.count += 1;
        Turn { module }
    }

    /// The module this turn is for.
    pub fn module(&self) -> &str {
        &self.module
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut held = holder();
        held.count = held.count.saturating_sub(1);
        if held.count == 0 {
            held.module = None;
            RELEASED.notify_all();
        }
    }
}

/// `e2e_core` of the test `e2e_core::a_test`; `None` for a name without a
/// module.
fn module_of(test: &str) -> Option<&str> {
    test.split_once("::").map(|(module, _)| module)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn the_module_is_the_first_segment_of_the_test_name() {
        assert_eq!(module_of("e2e_core::a_test"), Some("e2e_core"));
        assert_eq!(module_of("e2e_core::inner::a_test"), Some("e2e_core"));
        assert_eq!(module_of("a_test_at_the_root"), None);
        assert_eq!(module_of("tokio-runtime-worker"), None);
    }

    #[test]
    fn modules_take_turns_and_tests_of_one_module_share_theirs() {
        let first = Turn::take_for("turns-a".into());
        let second = Turn::take_for("turns-a".into());
        let (sent, got) = mpsc::channel();
        let other = std::thread::spawn(move || {
            let turn = Turn::take_for("turns-b".into());
            sent.send(turn.module().to_string()).unwrap();
        });
        drop(first);
        assert!(
            got.recv_timeout(Duration::from_millis(200)).is_err(),
            "another module's test ran while a test of turns-a held its turn"
        );
        drop(second);
        assert_eq!(
            got.recv_timeout(Duration::from_secs(10)).as_deref(),
            Ok("turns-b"),
            "the waiting module's test never got its turn"
        );
        other.join().unwrap();
    }
}
