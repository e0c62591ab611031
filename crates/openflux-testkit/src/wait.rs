//! Bounded waits: nothing sleeps to synchronize.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 250 ms until it returns `Some`, for at most `timeout`;
/// panics with `what` (and the time waited) when the bound is reached.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if start.elapsed() >= timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
