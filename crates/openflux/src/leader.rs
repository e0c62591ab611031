//! Leader election with a coordination.k8s.io Lease, so that of several
//! replicas exactly one runs the controllers (the webhook runs on all).
//!
//! The protocol is the one client-go uses: a holder renews `renewTime` well
//! within `leaseDurationSeconds`; anyone may take a Lease whose renew time is
//! older than its duration. Every write is a replace guarded by the
//! resourceVersion read just before, so two candidates never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

/// Timings of the election.
#[derive(Clone, Debug)]
pub struct LeaseTimings {
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long steps down.
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew.
    pub retry_period: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// One candidate for a Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: LeaseTimings,
}

/// What one attempt at the Lease found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Held,
    HeldByOther(String),
}

impl Elector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, timings: LeaseTimings) -> Self {
        Self {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            timings,
        }
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) {
        let mut last_holder = String::new();
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "acquired leader lease");
                    return;
                }
                Ok(Attempt::HeldByOther(holder)) => {
                    if holder != last_holder {
                        tracing::info!(lease = %self.name, %holder, "waiting for the leader lease");
                        last_holder = holder;
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "leader election attempt failed")
                }
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
    }

    /// Renews the Lease until renewal has failed for `renew_deadline`, or
    /// another holder took it; returns then (leadership is lost).
    pub async fn hold(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.timings.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => last_ok = tokio::time::Instant::now(),
                Ok(Attempt::HeldByOther(holder)) => {
                    tracing::error!(lease = %self.name, %holder, "leader lease taken by another replica");
                    return;
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "renewing leader lease failed");
                    if last_ok.elapsed() >= self.timings.renew_deadline {
                        tracing::error!(lease = %self.name, "could not renew leader lease in time");
                        return;
                    }
                }
            }
        }
    }

    /// Gives the Lease up on shutdown so another replica takes over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
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
            Ok(_) => tracing::info!(lease = %self.name, "released leader lease"),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "releasing leader lease failed")
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let duration_secs = i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(15);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Held),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::HeldByOther(
                    "(just created by another replica)".into(),
                )),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if !holder.is_empty() && holder != self.identity && !expired(spec, now) {
            return Ok(Attempt::HeldByOther(holder));
        }
        if holder != self.identity {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(MicroTime(now));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Held),
            // Someone else wrote in between: they hold it now.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                Ok(Attempt::HeldByOther("(changed concurrently)".into()))
            }
            Err(e) => Err(e),
        }
    }
}

/// Whether a Lease's holder failed to renew within its duration.
fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(MicroTime(renewed)) = spec.renew_time else {
        return true;
    };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    match renewed.checked_add(duration) {
        Ok(deadline) => deadline < now,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_expiry() {
        let now = Timestamp::now();
        let fresh = LeaseSpec {
            renew_time: Some(MicroTime(now)),
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        assert!(!expired(&fresh, now));
        let later = now.checked_add(SignedDuration::from_secs(16)).unwrap();
        assert!(expired(&fresh, later));
        assert!(expired(&LeaseSpec::default(), now), "never renewed");
    }
}
