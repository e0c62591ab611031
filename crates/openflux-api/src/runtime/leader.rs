//! Leader election on a `coordination.k8s.io/v1` Lease, with the flags and
//! timings of `fluxcd/pkg/runtime/leaderelection` (`--enable-leader-election`,
//! lease duration 35s, renew deadline 30s, retry period 5s, release on
//! cancel).
//!
//! The rules that keep two candidates from leading at once, whatever the
//! API server's latency and the replicas' clocks:
//!
//! - every write is a create or a replace at the resourceVersion just read,
//!   so of two candidates racing for the Lease one wins;
//! - expiry is judged on the local monotonic clock only ([`record::decide`]):
//!   another holder's Lease is taken only when it has not changed (holder and
//!   resourceVersion) for a whole lease duration since this replica first saw
//!   it, so the renew times written by other replicas' clocks never matter;
//! - a leader believes it leads until the renew deadline counted from the
//!   *start* of its last successful attempt (not from when the answer came
//!   back), and every attempt is cut off at [`attempt_timeout`] and at that
//!   deadline, so a stalled call never stretches the belief;
//! - [`LeaderElectionArgs::validate`] requires renew deadline < lease
//!   duration: the difference is the margin against clock rate drift.
//!
//! The Lease is named like Flux's (`<controller>-leader-election`) and lives
//! in the runtime namespace.

pub mod record;
mod store;

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::ObjectMeta;
use kube::Client;

use super::flags::{FlagError, LeaderElectionArgs};
use record::{decide, Decision, Observed, Seen};
pub use store::{Clock, KubeLeases, LeaseStore, StoreError, TokioClock};

/// Longest a release of the Lease waits for the API server: a shutdown
/// never waits longer on a stalled one (the Lease then expires on its own).
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Leadership was lost while the work ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader election lost: {0}")]
pub struct Lost(pub String);

impl LeaderElectionArgs {
    /// Checks the timings make sense together: retry period < renew
    /// deadline < lease duration, none zero.
    pub fn validate(&self) -> Result<(), FlagError> {
        let (lease, renew, retry) = (
            self.leader_election_lease_duration,
            self.leader_election_renew_deadline,
            self.leader_election_retry_period,
        );
        if retry.is_zero() {
            return Err(FlagError(
                "--leader-election-retry-period must be longer than 0s".into(),
            ));
        }
        if renew >= lease {
            return Err(FlagError(format!(
                "--leader-election-renew-deadline ({renew:?}) must be shorter than \
                 --leader-election-lease-duration ({lease:?}): a leader must give up before \
                 another replica may take the Lease"
            )));
        }
        if retry >= renew {
            return Err(FlagError(format!(
                "--leader-election-retry-period ({retry:?}) must be shorter than \
                 --leader-election-renew-deadline ({renew:?}): a leader must be able to retry \
                 a failed renewal before its deadline"
            )));
        }
        Ok(())
    }

    /// How long one attempt (read and write of the Lease) may take: half
    /// the renew deadline, so a stalled call leaves time for another try.
    pub fn attempt_timeout(&self) -> Duration {
        self.leader_election_renew_deadline / 2
    }
}

/// Shorthand for [`LeaderElectionArgs::attempt_timeout`].
pub fn attempt_timeout(args: &LeaderElectionArgs) -> Duration {
    args.attempt_timeout()
}

/// Why one attempt failed.
#[derive(Debug)]
enum AttemptError {
    Store(StoreError),
    TimedOut(Duration),
}

impl std::fmt::Display for AttemptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttemptError::Store(e) => write!(f, "{e}"),
            AttemptError::TimedOut(t) => write!(f, "no answer from the API server within {t:?}"),
        }
    }
}

/// One candidate for leadership.
pub struct Elector<S = KubeLeases, C = TokioClock> {
    store: S,
    clock: C,
    name: String,
    identity: String,
    args: LeaderElectionArgs,
    observed: Mutex<Option<Observed>>,
    /// Local start time of the last successful attempt while leading.
    led_since: Mutex<Option<Duration>>,
}

impl Elector {
    /// A candidate for the Lease `name` in `namespace`, identified by this
    /// host's name and a random suffix.
    pub fn new(client: Client, namespace: &str, name: &str, args: &LeaderElectionArgs) -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let identity = format!("{host}_{}", super::id::random_id());
        let store = KubeLeases::new(client, namespace, name);
        Elector::with(store, TokioClock::default(), name, identity, args)
    }
}

impl<S: LeaseStore, C: Clock> Elector<S, C> {
    /// A candidate on any Lease store and clock (tests simulate both).
    pub fn with(
        store: S,
        clock: C,
        name: &str,
        identity: String,
        args: &LeaderElectionArgs,
    ) -> Self {
        Elector {
            store,
            clock,
            name: name.to_string(),
            identity,
            args: *args,
            observed: Mutex::new(None),
            led_since: Mutex::new(None),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether this candidate believes it leads now: it acquired or renewed
    /// the Lease in an attempt that started less than the renew deadline ago.
    pub fn is_leading(&self) -> bool {
        self.deadline().is_some_and(|d| self.clock.now() < d)
    }

    fn deadline(&self) -> Option<Duration> {
        let since = *self.led_since.lock().unwrap_or_else(|e| e.into_inner());
        since.map(|s| s + self.args.leader_election_renew_deadline)
    }

    fn set_led_since(&self, since: Option<Duration>) {
        *self.led_since.lock().unwrap_or_else(|e| e.into_inner()) = since;
    }

    /// Runs `work` while this candidate leads: waits for the Lease, then
    /// renews it while `work` runs. When `work` ends the Lease is released
    /// (with `--leader-election-release-on-cancel`, the default); when the
    /// Lease cannot be renewed within the renew deadline, `work` is dropped
    /// and [`Lost`] returned.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Lost> {
        self.acquire().await;
        let result = tokio::select! {
            output = work => Ok(output),
            lost = self.keep() => Err(lost),
        };
        if result.is_ok() && self.args.leader_election_release_on_cancel {
            self.release().await;
        }
        result
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) {
        let mut waiting_for = String::new();
        let mut failing = false;
        loop {
            let start = self.clock.now();
            match self.timed_attempt(self.args.attempt_timeout()).await {
                Ok(None) => {
                    self.set_led_since(Some(start));
                    tracing::info!(lease = %self.name, identity = %self.identity, "successfully acquired lease");
                    return;
                }
                Ok(Some(holder)) => {
                    failing = false;
                    if holder != waiting_for {
                        tracing::info!(lease = %self.name, %holder, "waiting for the lease");
                        waiting_for = holder;
                    }
                }
                Err(e) if failing => {
                    tracing::debug!(lease = %self.name, error = %e, "error acquiring the lease")
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "error acquiring the lease");
                    failing = true;
                }
            }
            self.clock
                .sleep(self.args.leader_election_retry_period)
                .await;
        }
    }

    /// Renews the Lease every retry period while leading; returns when the
    /// renew deadline passed since the start of the last successful attempt,
    /// or another candidate holds the Lease. Returns at once when this
    /// candidate does not lead.
    pub async fn keep(&self) -> Lost {
        let deadline_passed = || {
            Lost(format!(
                "the lease was not renewed within the renew deadline ({:?})",
                self.args.leader_election_renew_deadline
            ))
        };
        let mut failing = false;
        loop {
            let Some(deadline) = self.deadline() else {
                return Lost("this replica does not hold the lease".into());
            };
            let now = self.clock.now();
            if now >= deadline {
                self.set_led_since(None);
                return deadline_passed();
            }
            let wait = self.args.leader_election_retry_period.min(deadline - now);
            self.clock.sleep(wait).await;
            let start = self.clock.now();
            if start >= deadline {
                self.set_led_since(None);
                return deadline_passed();
            }
            let budget = self.args.attempt_timeout().min(deadline - start);
            match self.timed_attempt(budget).await {
                Ok(None) => {
                    if failing {
                        tracing::info!(lease = %self.name, "renewed the lease again");
                    }
                    failing = false;
                    self.set_led_since(Some(start));
                }
                Ok(Some(holder)) => {
                    self.set_led_since(None);
                    return Lost(format!("the lease is held by {holder}"));
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "error renewing the lease");
                    failing = true;
                }
            }
        }
    }

    async fn timed_attempt(&self, budget: Duration) -> Result<Option<String>, AttemptError> {
        tokio::select! {
            result = self.attempt() => result.map_err(AttemptError::Store),
            () = self.clock.sleep(budget) => Err(AttemptError::TimedOut(budget)),
        }
    }

    /// One try: `None` when we hold the Lease afterwards, else its holder.
    async fn attempt(&self) -> Result<Option<String>, StoreError> {
        let current = self.store.get().await?;
        let (decision, observed) = {
            let mut memory = self.observed.lock().unwrap_or_else(|e| e.into_inner());
            let seen = current.as_ref().map(|l| Seen {
                spec: l.spec.as_ref(),
                version: l.metadata.resource_version.as_deref().unwrap_or(""),
            });
            let (decision, observed) = decide(
                seen,
                &self.identity,
                memory.as_ref(),
                self.clock.now(),
                self.args.leader_election_lease_duration,
            );
            *memory = observed.clone();
            (decision, observed)
        };
        let now = MicroTime(self.clock.wall());
        // Whole seconds, rounded up: other candidates wait this long for a
        // renewal, and a Lease written shorter than the lease duration
        // (2.7s as 2) could be taken while this one still believes it
        // leads (up to the renew deadline, say 2.3s).
        let lease = self.args.leader_election_lease_duration;
        let seconds = i32::try_from(lease.as_secs() + u64::from(lease.subsec_nanos() > 0))
            .unwrap_or(i32::MAX)
            .max(1);
        let written = match (decision, current) {
            (Decision::Wait { holder }, _) => return Ok(Some(holder)),
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.store.create(lease).await
            }
            (decision, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if decision == Decision::Take {
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(now);
                self.store.replace(lease).await
            }
            (_, None) => return Ok(Some(String::new())),
        };
        match written {
            Ok(()) => Ok(None),
            // Another candidate wrote first: it holds the Lease now.
            Err(StoreError::Conflict) => Ok(Some(observed.map(|o| o.holder).unwrap_or_default())),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up so another candidate takes over at once. Bounded
    /// by the attempt timeout: a shutdown never waits on a stalled API
    /// server for longer.
    pub async fn release(&self) {
        let was_leading = self.is_leading();
        self.set_led_since(None);
        if !was_leading {
            return;
        }
        let budget = self.args.attempt_timeout().min(RELEASE_TIMEOUT);
        tokio::select! {
            () = self.release_now() => {}
            () = self.clock.sleep(budget) => {
                tracing::warn!(lease = %self.name, "no answer while releasing the lease; it expires on its own");
            }
        }
    }

    async fn release_now(&self) {
        let Ok(Some(mut lease)) = self.store.get().await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(self.clock.wall()));
        match self.store.replace(lease).await {
            Ok(()) => tracing::info!(lease = %self.name, "released the lease"),
            Err(e) => tracing::warn!(lease = %self.name, error = %e, "error releasing the lease"),
        }
    }
}

/// Flux's name of a controller's Lease.
pub fn lease_name(controller: &str) -> String {
    format!("{controller}-leader-election")
}

#[cfg(test)]
mod sim;

#[cfg(test)]
mod tests {
    use super::*;

    fn args(lease: u64, renew: u64, retry: u64) -> LeaderElectionArgs {
        LeaderElectionArgs {
            enable_leader_election: true,
            leader_election_release_on_cancel: true,
            leader_election_lease_duration: Duration::from_secs(lease),
            leader_election_renew_deadline: Duration::from_secs(renew),
            leader_election_retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn timings_must_nest() {
        assert!(args(35, 30, 5).validate().is_ok());
        assert_eq!(args(35, 30, 5).attempt_timeout(), Duration::from_secs(15));
        let e = args(30, 30, 5).validate().unwrap_err();
        assert!(
            e.0.contains("renew-deadline") && e.0.contains("lease-duration"),
            "{e}"
        );
        let e = args(35, 30, 30).validate().unwrap_err();
        assert!(e.0.contains("retry-period"), "{e}");
        assert!(args(35, 30, 0).validate().is_err());
    }

    #[test]
    fn names_the_lease_like_flux() {
        assert_eq!(
            lease_name("source-controller"),
            "source-controller-leader-election"
        );
    }
}
