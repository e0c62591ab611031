//! A restart with every Artifact present: openflux started again on the
//! same sources after the first process stopped. Nothing is left to write,
//! so what the restart costs is reading: the first list of each kind, the
//! owner index and the controller queue filled at once.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::process::{self, Openflux};
use crate::support::Env;

/// What a restart measured.
pub struct Restart {
    /// Start to every source reconciled once.
    pub reconciled: Duration,
    /// Peak RSS (VmHWM) at that point, MiB.
    pub peak_rss: Option<f64>,
    /// Artifact writes the API server counted meanwhile, per source.
    pub writes: f64,
}

/// Starts `openflux run` with `args` again and waits (bounded by
/// `timeout`) until its mirror controllers have reconciled `n` sources.
pub async fn measure(
    env: &Env,
    name: &str,
    args: &[String],
    n: usize,
    timeout: Duration,
) -> anyhow::Result<Restart> {
    let api_before = process::apiserver_metrics(&env.client).await?;
    let mut of = Openflux::spawn(env, name, args)?;
    of.wait_serving(Duration::from_secs(60)).await?;
    let deadline = Instant::now() + timeout;
    let reconciled = loop {
        let done = process::mirror_reconciles(&of.metrics().await?);
        if done >= n as f64 {
            break of.started.elapsed();
        }
        if Instant::now() >= deadline {
            bail!(
                "the restarted openflux reconciled {done} of {n} sources within {timeout:?}:\n{}",
                of.log_tail(30)
            );
        }
        of.check_alive()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let peak_rss = of.peak_rss().map(|b| b as f64 / (1024.0 * 1024.0));
    let api_after = process::apiserver_metrics(&env.client).await?;
    of.stop();
    let writes = (process::apiserver_writes(&api_after, "openflux.dev", "artifacts")
        - process::apiserver_writes(&api_before, "openflux.dev", "artifacts"))
        / n.max(1) as f64;
    Ok(Restart {
        reconciled,
        peak_rss,
        writes,
    })
}
