//! Leader election on a `coordination.k8s.io/v1` Lease, with the flags and
//! timings of `fluxcd/pkg/runtime/leaderelection` (`--enable-leader-election`,
//! lease duration 35s, renew deadline 30s, retry period 5s, release on
//! cancel).
//!
//! Expiry is judged on this process's own clock, as client-go does: a Lease
//! held by another replica is taken only when its record (holder and renew
//! time) has not changed for a whole lease duration since this replica
//! first saw it, so clock skew between replicas does not matter. Every write
//! is a create or a replace at the resourceVersion just read, so two
//! candidates never both win. The Lease is named like Flux's
//! (`<controller>-leader-election`) and lives in the runtime namespace.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;

use super::flags::LeaderElectionArgs;

/// Leadership was lost while the work ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader election lost: {0}")]
pub struct Lost(pub String);

/// What to do with the Lease, given what it says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is none: create it, held by us.
    Create,
    /// Nobody holds it, or its holder stopped renewing: take it over.
    Take,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it and renews it.
    Wait { holder: String },
}

/// The record of a Lease as last seen, and when it was first seen so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    holder: String,
    renew_time: Option<Timestamp>,
    since: Instant,
}

/// Decides from the Lease's spec (`None`: no Lease), what was observed
/// before, and the local time. Returns the new observation too.
pub fn decide(
    spec: Option<&LeaseSpec>,
    me: &str,
    before: Option<&Observed>,
    now: Instant,
    lease_duration: Duration,
) -> (Decision, Option<Observed>) {
    let Some(spec) = spec else {
        return (Decision::Create, None);
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let renew_time = spec.renew_time.as_ref().map(|t| t.0);
    let observed = match before {
        Some(b) if b.holder == holder && b.renew_time == renew_time => b.clone(),
        _ => Observed {
            holder: holder.clone(),
            renew_time,
            since: now,
        },
    };
    let decision = if holder.is_empty() {
        Decision::Take
    } else if holder == me {
        Decision::Renew
    } else if now.duration_since(observed.since) >= lease_duration {
        Decision::Take
    } else {
        Decision::Wait { holder }
    };
    (decision, Some(observed))
}

/// One candidate for leadership.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    args: LeaderElectionArgs,
    observed: Mutex<Option<Observed>>,
}

impl Elector {
    /// A candidate for the Lease `name` in `namespace`, identified by this
    /// host's name and a random suffix.
    pub fn new(client: Client, namespace: &str, name: &str, args: &LeaderElectionArgs) -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: format!("{host}_{}", super::random_id()),
            args: *args,
            observed: Mutex::new(None),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Runs `work` while this candidate leads: waits for the Lease, then
    /// renews it while `work` runs. When `work` ends the Lease is released
    /// (with `--leader-election-release-on-cancel`, the default); when the
    /// Lease cannot be renewed within the renew deadline, `work` is dropped
    /// and [`Lost`] returned (the process should exit, as Flux's do).
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
        loop {
            match self.attempt().await {
                Ok(None) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "successfully acquired lease");
                    return;
                }
                Ok(Some(holder)) if holder != waiting_for => {
                    tracing::info!(lease = %self.name, %holder, "waiting for the lease");
                    waiting_for = holder;
                }
                Ok(Some(_)) => {}
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "error acquiring the lease")
                }
            }
            tokio::time::sleep(self.args.leader_election_retry_period).await;
        }
    }

    /// Renews the Lease every retry period; returns when it could not be
    /// renewed for the renew deadline, or another candidate holds it.
    pub async fn keep(&self) -> Lost {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.args.leader_election_retry_period).await;
            match self.attempt().await {
                Ok(None) => renewed = Instant::now(),
                Ok(Some(holder)) => return Lost(format!("the lease is held by {holder}")),
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "error renewing the lease");
                    if renewed.elapsed() >= self.args.leader_election_renew_deadline {
                        return Lost(format!(
                            "the lease was not renewed for {:?}",
                            self.args.leader_election_renew_deadline
                        ));
                    }
                }
            }
        }
    }

    /// One try: `None` when we hold the Lease afterwards, else its holder.
    async fn attempt(&self) -> Result<Option<String>, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let (decision, observed) = {
            let mut memory = self.observed.lock().unwrap_or_else(|e| e.into_inner());
            let (decision, observed) = decide(
                current.as_ref().and_then(|l| l.spec.as_ref()),
                &self.identity,
                memory.as_ref(),
                Instant::now(),
                self.args.leader_election_lease_duration,
            );
            *memory = observed.clone();
            (decision, observed)
        };
        let now = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.args.leader_election_lease_duration.as_secs())
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
                self.api.create(&PostParams::default(), &lease).await
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
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
            (_, None) => return Ok(Some(String::new())),
        };
        match written {
            Ok(_) => Ok(None),
            // Another candidate wrote first: it holds the Lease now.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Ok(Some(observed.map(|o| o.holder).unwrap_or_default()))
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up so another candidate takes over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.name, "released the lease"),
            Err(e) => tracing::warn!(lease = %self.name, error = %e, "error releasing the lease"),
        }
    }
}

/// Flux's name of a controller's Lease.
pub fn lease_name(controller: &str) -> String {
    format!("{controller}-leader-election")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DURATION: Duration = Duration::from_secs(35);

    fn held_by(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn creates_a_missing_lease_and_renews_its_own() {
        let now = Instant::now();
        assert_eq!(decide(None, "me", None, now, DURATION).0, Decision::Create);
        let mine = held_by("me", 100);
        assert_eq!(
            decide(Some(&mine), "me", None, now, DURATION).0,
            Decision::Renew
        );
        let free = LeaseSpec::default();
        assert_eq!(
            decide(Some(&free), "me", None, now, DURATION).0,
            Decision::Take
        );
    }

    #[test]
    fn takes_a_lease_only_after_it_stood_still_for_a_lease_duration() {
        let t0 = Instant::now();
        let theirs = held_by("other", 100);
        let (d, seen) = decide(Some(&theirs), "me", None, t0, DURATION);
        assert_eq!(
            d,
            Decision::Wait {
                holder: "other".into()
            }
        );
        // Unchanged, but not for long enough yet.
        let t1 = t0 + Duration::from_secs(20);
        let (d, seen) = decide(Some(&theirs), "me", seen.as_ref(), t1, DURATION);
        assert!(matches!(d, Decision::Wait { .. }));
        // The holder renewed: the clock starts again.
        let renewed = held_by("other", 120);
        let t2 = t0 + Duration::from_secs(40);
        let (d, seen) = decide(Some(&renewed), "me", seen.as_ref(), t2, DURATION);
        assert!(matches!(d, Decision::Wait { .. }));
        // Unchanged for a whole lease duration since: it is ours to take.
        let t3 = t2 + DURATION;
        let (d, _) = decide(Some(&renewed), "me", seen.as_ref(), t3, DURATION);
        assert_eq!(d, Decision::Take);
    }

    #[test]
    fn the_remote_clock_does_not_matter() {
        // A renew time far in the past is still a fresh record when first seen.
        let t0 = Instant::now();
        let stale_looking = held_by("other", 1);
        let (d, _) = decide(Some(&stale_looking), "me", None, t0, DURATION);
        assert!(matches!(d, Decision::Wait { .. }));
    }

    #[test]
    fn names_the_lease_like_flux() {
        assert_eq!(
            lease_name("source-controller"),
            "source-controller-leader-election"
        );
    }
}
