//! The loop of a controller that looks at one object at a time, as keys
//! arrive on a channel: the consumers' re-pointing and the Open Flux
//! adopter. A look that fails is asked for again after Flux's backoff; one
//! that panics (a defect in openflux) is a failed look like any other, so
//! the loop, which serves every object of its controller, goes on.

use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::StreamExt;
use openflux_api::runtime::{Retries, RetryArgs};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::context::{caught, Error};

/// Where a loop's looks come from and go back to.
pub struct Looks<L> {
    /// The looks asked for.
    pub asked: UnboundedReceiver<L>,
    /// The sender of `asked`: a failed look is sent here again after its
    /// backoff.
    pub again: UnboundedSender<L>,
}

/// Runs `look` on each look asked for, one at a time, until `shutdown` or
/// the end of the channel. A look that fails (or panics) is passed to
/// `failed` with the delay after which it is asked for again; `key` names
/// the object whose failures in a row set that delay.
pub async fn serve<L, K, Fut>(
    looks: Looks<L>,
    retry: RetryArgs,
    shutdown: CancellationToken,
    key: impl Fn(&L) -> K,
    mut look: impl FnMut(L) -> Fut,
    failed: impl Fn(&L, &Error, Duration),
) where
    L: Clone + Send + 'static,
    K: Eq + Hash,
    Fut: Future<Output = Result<(), Error>>,
{
    let Looks { mut asked, again } = looks;
    let retries = Retries::new(retry);
    let mut retrying = JoinSet::new();
    loop {
        while retrying.try_join_next().is_some() {}
        let next = tokio::select! {
            next = asked.next() => next,
            () = shutdown.cancelled() => None,
        };
        let Some(one) = next else { break };
        // The call inside the caught future: a panic before its first
        // await is caught too.
        match caught(async { look(one.clone()).await }).await {
            Ok(()) => retries.succeeded(&key(&one)),
            Err(error) => {
                let delay = retries.failed(key(&one));
                failed(&one, &error, delay);
                let again = again.clone();
                retrying.spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = again.unbounded_send(one);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc::unbounded;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    fn quick_retries() -> RetryArgs {
        RetryArgs {
            min_retry_delay: Duration::from_millis(5),
            max_retry_delay: Duration::from_millis(20),
        }
    }

    #[tokio::test]
    async fn a_look_that_panics_is_retried_and_the_others_go_on() {
        let (again, asked) = unbounded::<&'static str>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn({
            let (seen, failures) = (seen.clone(), failures.clone());
            let looks = Looks {
                asked,
                again: again.clone(),
            };
            serve(
                looks,
                quick_retries(),
                shutdown.clone(),
                |name: &&'static str| *name,
                move |name| {
                    let first = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(name);
                        seen.iter().filter(|n| **n == name).count() == 1
                    };
                    async move {
                        if name == "defect" && first {
                            panic!("a defect looking at {name}");
                        }
                        Ok(())
                    }
                },
                move |name, error, _| failures.lock().unwrap().push(format!("{name}: {error}")),
            )
        });
        again.unbounded_send("defect").unwrap();
        again.unbounded_send("fine").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let looked = seen.lock().unwrap().clone();
            if looked.iter().filter(|n| **n == "defect").count() == 2 && looked.contains(&"fine") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "looks after a panic: {looked:?} (the panicking look not retried, or the loop ended)"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        serving
            .await
            .expect("the loop ends on shutdown, not by a panic");
        assert_eq!(
            *failures.lock().unwrap(),
            vec!["defect: the reconcile panicked: a defect looking at defect".to_string()]
        );
    }

    #[tokio::test]
    async fn a_failed_look_comes_back_after_its_backoff_until_it_succeeds() {
        let (again, asked) = unbounded::<u32>();
        let tries = Arc::new(Mutex::new(0u32));
        let delays = Arc::new(Mutex::new(Vec::new()));
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn({
            let (tries, delays) = (tries.clone(), delays.clone());
            serve(
                Looks {
                    asked,
                    again: again.clone(),
                },
                quick_retries(),
                shutdown.clone(),
                |n: &u32| *n,
                move |_| {
                    let attempt = {
                        let mut tries = tries.lock().unwrap();
                        *tries += 1;
                        *tries
                    };
                    async move {
                        if attempt < 3 {
                            Err(Error::MissingField("spec"))
                        } else {
                            Ok(())
                        }
                    }
                },
                move |_, _, delay| delays.lock().unwrap().push(delay),
            )
        });
        again.unbounded_send(7).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while *tries.lock().unwrap() < 3 {
            assert!(Instant::now() < deadline, "the failed look was not retried");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        serving.await.unwrap();
        // Failures in a row double the delay.
        assert_eq!(
            *delays.lock().unwrap(),
            vec![Duration::from_millis(5), Duration::from_millis(10)]
        );
    }
}
