//! The engine of a controller that reconciles one object at a time, as
//! they are asked for on a channel: the consumers' re-pointing and the Open
//! Flux adopter. A reconcile that fails is asked for again after Flux's
//! backoff; one that panics (a defect in openflux) is a failure like any
//! other, so the loop, which serves every object of its controller, goes on.

use std::hash::Hash;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::StreamExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{caught, ended, Reconciler};
use crate::api::runtime::{Retries, RetryArgs};

/// Where a loop's objects come from and go back to.
pub struct Looks<L> {
    /// The objects asked for.
    pub asked: UnboundedReceiver<L>,
    /// The sender of `asked`: an object that failed, or asked to be
    /// reconciled later, is sent here again after its delay.
    pub again: UnboundedSender<L>,
}

/// Reconciles each object asked for with `reconciler`, one at a time, until
/// `shutdown` or the end of the channel. The failures in a row of each
/// object set the delay after which it is asked for again.
pub async fn serve<R>(
    looks: Looks<R::Object>,
    retry: RetryArgs,
    shutdown: CancellationToken,
    reconciler: &R,
) where
    R: Reconciler,
    R::Object: Clone + Eq + Hash,
{
    let Looks { mut asked, again } = looks;
    let retries = Retries::new(retry);
    let mut waiting = JoinSet::new();
    loop {
        while waiting.try_join_next().is_some() {}
        let next = tokio::select! {
            next = asked.next() => next,
            () = shutdown.cancelled() => None,
        };
        let Some(one) = next else { break };
        // The call inside the caught future: a panic before its first
        // await is caught too.
        let result = caught(async { reconciler.reconcile(&one).await }).await;
        let delay = ended(reconciler, &retries, &one, &one, result.as_ref().copied());
        if let Some(delay) = delay {
            let again = again.clone();
            waiting.spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = again.unbounded_send(one);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Error;
    use crate::control::Requeue;
    use futures::channel::mpsc::unbounded;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    fn quick_retries() -> RetryArgs {
        RetryArgs {
            min_retry_delay: Duration::from_millis(5),
            max_retry_delay: Duration::from_millis(20),
        }
    }

    /// How the nth reconcile (from 1) of an object ends.
    #[derive(Clone, Copy)]
    enum Outcome {
        Done,
        Later(Duration),
        Fails,
        Panics,
    }

    /// A controller for the tests: ends each reconcile as its script says,
    /// and records what it was given and what failed.
    struct Scripted {
        script: fn(&str, usize) -> Outcome,
        seen: Mutex<Vec<&'static str>>,
        failures: Mutex<Vec<(String, Duration)>>,
    }

    impl Reconciler for Scripted {
        type Object = &'static str;

        async fn reconcile(&self, name: &&'static str) -> Result<Requeue, Error> {
            let nth = {
                let mut seen = self.seen.lock().unwrap();
                seen.push(name);
                seen.iter().filter(|n| *n == name).count()
            };
            match (self.script)(name, nth) {
                Outcome::Done => Ok(None),
                Outcome::Later(after) => Ok(Some(after)),
                Outcome::Fails => Err(Error::MissingField("spec")),
                Outcome::Panics => panic!("a defect reconciling {name}"),
            }
        }

        fn failed(&self, name: &&'static str, error: &Error, retry_in: Duration) {
            let failure = (format!("{name}: {error}"), retry_in);
            self.failures.lock().unwrap().push(failure);
        }
    }

    /// Serves `asked` with a controller following `script` until `done`
    /// holds of what it saw (or 10 s pass), then shuts the loop down.
    async fn served(
        asked: &[&'static str],
        script: fn(&str, usize) -> Outcome,
        done: impl Fn(&[&'static str]) -> bool,
    ) -> Arc<Scripted> {
        let controller = Arc::new(Scripted {
            script,
            seen: Mutex::default(),
            failures: Mutex::default(),
        });
        let (again, receiver) = unbounded();
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn({
            let (controller, again, shutdown) =
                (controller.clone(), again.clone(), shutdown.clone());
            async move {
                let looks = Looks {
                    asked: receiver,
                    again,
                };
                serve(looks, quick_retries(), shutdown, &*controller).await;
            }
        });
        for name in asked {
            again.unbounded_send(*name).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = controller.seen.lock().unwrap().clone();
            if done(&seen) {
                break;
            }
            assert!(Instant::now() < deadline, "reconciled so far: {seen:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        serving
            .await
            .expect("the loop ends on shutdown, not by a panic");
        controller
    }

    fn times(seen: &[&str], name: &str) -> usize {
        seen.iter().filter(|n| **n == name).count()
    }

    #[tokio::test]
    async fn a_reconcile_that_panics_is_retried_and_the_others_go_on() {
        let controller = served(
            &["defect", "fine"],
            |name, nth| match (name, nth) {
                ("defect", 1) => Outcome::Panics,
                _ => Outcome::Done,
            },
            |seen| times(seen, "defect") == 2 && times(seen, "fine") == 1,
        )
        .await;
        let failures = controller.failures.lock().unwrap();
        let failures: Vec<&str> = failures.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            failures,
            ["defect: the reconcile panicked: a defect reconciling defect"]
        );
    }

    #[tokio::test]
    async fn a_failed_reconcile_comes_back_after_its_backoff_until_it_succeeds() {
        let controller = served(
            &["seven"],
            |_, nth| {
                if nth < 3 {
                    Outcome::Fails
                } else {
                    Outcome::Done
                }
            },
            |seen| times(seen, "seven") == 3,
        )
        .await;
        // Failures in a row double the delay.
        let delays: Vec<Duration> = controller
            .failures
            .lock()
            .unwrap()
            .iter()
            .map(|(_, delay)| *delay)
            .collect();
        assert_eq!(
            delays,
            [Duration::from_millis(5), Duration::from_millis(10)]
        );
    }

    #[tokio::test]
    async fn a_reconcile_that_asks_for_a_later_look_gets_it_without_a_failure() {
        let controller = served(
            &["polled"],
            |_, nth| match nth {
                1 => Outcome::Later(Duration::from_millis(20)),
                _ => Outcome::Done,
            },
            |seen| times(seen, "polled") == 2,
        )
        .await;
        assert!(controller.failures.lock().unwrap().is_empty());
    }
}
