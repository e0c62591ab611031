//! When the webhook's certificates kept in a Secret are made, renewed and
//! retired: a function of the certificates' times and the clock, nothing
//! else.
//!
//! The Secret holds a trust bundle (the signing CA first, then older CAs
//! still trusted), the signing CA's key, and the serving certificate. A CA
//! is replaced in three steps, so that no replica ever serves a certificate
//! its clients do not trust:
//!
//! 1. [`Step::NewAuthority`]: a new CA becomes the signer and goes first in
//!    the bundle; the old CA stays in it and the serving certificate (signed
//!    by the old CA) does not change. Every replica injects the bundle into
//!    the webhook configuration.
//! 2. [`Step::Issue`]: once the new CA has been in every webhook
//!    configuration for [`Timing::settle`], the serving certificate is
//!    issued by it.
//! 3. [`Step::Prune`]: the old CA leaves the bundle when it expires. A
//!    serving certificate never outlives the CA that signed it, so by then
//!    no replica can serve a valid certificate signed by it.

use std::time::Duration;

/// Validity and renewal of the certificates openflux keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// Validity of a new CA.
    pub ca_validity: Duration,
    /// Validity of a new serving certificate (cut to its CA's expiry).
    pub cert_validity: Duration,
    /// Share of a certificate's validity after which it is renewed.
    pub renew_fraction: f64,
}

/// Shortest validity accepted: renewal needs time to reach every replica.
pub const MIN_VALIDITY: Duration = Duration::from_secs(10);
/// Longest time a new CA waits in the webhook configurations before it signs.
pub const MAX_SETTLE: Duration = Duration::from_secs(10);
/// Longest time a CA that left the Secret stays in the webhook
/// configurations.
pub const MAX_RETIRE_AFTER: Duration = Duration::from_secs(60);

impl Timing {
    /// Checks the flags' values: the CA must live at least as long as a
    /// serving certificate (or every serving certificate would be cut short
    /// and renewed again at once), and renewal must fall inside the life.
    pub fn validate(&self) -> Result<(), String> {
        if self.cert_validity < MIN_VALIDITY {
            return Err(format!(
                "the serving certificate's validity ({:?}) is shorter than {MIN_VALIDITY:?}",
                self.cert_validity
            ));
        }
        if self.ca_validity < self.cert_validity {
            return Err(format!(
                "the CA's validity ({:?}) is shorter than the serving certificate's ({:?})",
                self.ca_validity, self.cert_validity
            ));
        }
        if !(0.1..=0.9).contains(&self.renew_fraction) {
            return Err(format!(
                "the renewal fraction {} is outside 0.1..=0.9",
                self.renew_fraction
            ));
        }
        Ok(())
    }

    /// How long a new CA must have been in every webhook configuration
    /// before a serving certificate it signed is served: time for the API
    /// servers' informers to see the new bundle. A tenth of the serving
    /// validity, at most [`MAX_SETTLE`].
    pub fn settle(&self) -> Duration {
        (self.cert_validity / 10).min(MAX_SETTLE)
    }

    /// How long a CA that left the Secret stays in the webhook
    /// configurations: time for every replica to serve from the Secret as it
    /// is now. A tenth of the serving validity, from 1 s to
    /// [`MAX_RETIRE_AFTER`].
    pub fn retire_after(&self) -> Duration {
        (self.cert_validity / 10).clamp(Duration::from_secs(1), MAX_RETIRE_AFTER)
    }

    /// When a certificate expiring at `not_after` is renewed: when less than
    /// `1 - renew_fraction` of a full `validity` is left.
    fn renew_at(&self, not_after: i64, validity: Duration) -> i64 {
        let left = (validity.as_secs_f64() * (1.0 - self.renew_fraction)).round();
        not_after.saturating_sub(left as i64)
    }
}

/// What the decision needs to know of the Secret's content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// Expiry of the signing CA (first in the bundle), Unix seconds.
    pub signer_not_after: i64,
    /// Expiry of each other CA in the bundle.
    pub others_not_after: Vec<i64>,
    /// Expiry of the serving certificate.
    pub leaf_not_after: i64,
    /// Whether the serving certificate was signed by the signing CA.
    pub leaf_by_signer: bool,
    /// Whether the serving certificate names what openflux is told to serve.
    pub leaf_names_match: bool,
}

/// What to do with the Secret now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing; look again at this time (Unix seconds) at the latest.
    Keep { until: i64 },
    /// No usable content: a new CA and serving certificate.
    Create,
    /// A new signing CA, first in the bundle; the serving certificate stays.
    NewAuthority,
    /// A new serving certificate from the signing CA.
    Issue,
    /// Drop the expired CAs from the bundle.
    Prune,
}

/// The step for `facts` (`None`: no Secret, or one openflux cannot use) at
/// `now`. `signer_trusted_since` is since when the signing CA has been in
/// every webhook configuration (`None`: not yet).
pub fn decide(
    facts: Option<&Facts>,
    now: i64,
    timing: &Timing,
    signer_trusted_since: Option<i64>,
) -> Step {
    let Some(facts) = facts else {
        return Step::Create;
    };
    if now >= facts.signer_not_after {
        // Nothing the signer made can be trusted any more.
        return Step::Create;
    }
    let signer_renew = timing.renew_at(facts.signer_not_after, timing.ca_validity);
    if facts.leaf_by_signer && now >= signer_renew {
        return Step::NewAuthority;
    }
    let settle = i64::try_from(timing.settle().as_secs()).unwrap_or(i64::MAX);
    if !facts.leaf_by_signer {
        // A new CA waits in the bundle; a serving certificate that expired
        // (or no longer names what is served) has nothing left to protect.
        let trusted = signer_trusted_since.is_some_and(|since| now >= since.saturating_add(settle));
        if trusted || now >= facts.leaf_not_after || !facts.leaf_names_match {
            return Step::Issue;
        }
        let until =
            signer_trusted_since.map_or(now.saturating_add(1), |s| s.saturating_add(settle));
        return Step::Keep {
            until: until.min(facts.leaf_not_after),
        };
    }
    let leaf_renew = timing.renew_at(facts.leaf_not_after, timing.cert_validity);
    if now >= leaf_renew || !facts.leaf_names_match {
        return Step::Issue;
    }
    if facts.others_not_after.iter().any(|&t| now >= t) {
        return Step::Prune;
    }
    let until = facts
        .others_not_after
        .iter()
        .copied()
        .chain([signer_renew, leaf_renew])
        .min()
        .unwrap_or(leaf_renew);
    Step::Keep { until }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 24 * 3600;

    fn timing() -> Timing {
        Timing {
            ca_validity: Duration::from_secs(3650 * DAY as u64),
            cert_validity: Duration::from_secs(365 * DAY as u64),
            renew_fraction: 2.0 / 3.0,
        }
    }

    /// A fresh CA and serving certificate made at `t`.
    fn fresh(t: i64) -> Facts {
        Facts {
            signer_not_after: t + 3650 * DAY,
            others_not_after: vec![],
            leaf_not_after: t + 365 * DAY,
            leaf_by_signer: true,
            leaf_names_match: true,
        }
    }

    #[test]
    fn nothing_or_an_expired_ca_starts_over() {
        let t = timing();
        assert_eq!(decide(None, 0, &t, None), Step::Create);
        let facts = fresh(0);
        assert_eq!(decide(Some(&facts), 3650 * DAY, &t, None), Step::Create);
    }

    #[test]
    fn the_serving_certificate_is_renewed_at_two_thirds_of_its_life() {
        let t = timing();
        let facts = fresh(0);
        let renew = 365 * DAY - (365 * DAY) / 3;
        assert_eq!(
            decide(Some(&facts), 1, &t, None),
            Step::Keep { until: renew }
        );
        assert_eq!(
            decide(Some(&facts), renew - 1, &t, None),
            Step::Keep { until: renew }
        );
        assert_eq!(decide(Some(&facts), renew, &t, None), Step::Issue);
        let renamed = Facts {
            leaf_names_match: false,
            ..fresh(0)
        };
        assert_eq!(decide(Some(&renamed), 1, &t, None), Step::Issue);
    }

    #[test]
    fn a_ca_is_replaced_in_three_steps() {
        let t = timing();
        let ca_renew = 3650 * DAY - (3650 * DAY) / 3;
        // The serving certificate was renewed lately; the CA is due.
        let facts = Facts {
            leaf_not_after: ca_renew + 300 * DAY,
            ..fresh(0)
        };
        assert!(matches!(
            decide(Some(&facts), ca_renew - 1, &t, None),
            Step::Keep { .. }
        ));
        assert_eq!(decide(Some(&facts), ca_renew, &t, None), Step::NewAuthority);
        // 1. A new signer; the old CA stays, the certificate is the old one.
        let now = ca_renew;
        let overlap = Facts {
            signer_not_after: now + 3650 * DAY,
            others_not_after: vec![3650 * DAY],
            leaf_by_signer: false,
            ..facts.clone()
        };
        // 2. Not in every webhook configuration yet: wait, whatever the time.
        assert_eq!(
            decide(Some(&overlap), now + 100, &t, None),
            Step::Keep { until: now + 101 }
        );
        // In them, but the API servers get time to see it.
        let settle = t.settle().as_secs() as i64;
        assert_eq!(settle, 10);
        assert_eq!(
            decide(Some(&overlap), now + 100, &t, Some(now + 95)),
            Step::Keep {
                until: now + 95 + settle
            }
        );
        assert_eq!(
            decide(Some(&overlap), now + 105, &t, Some(now + 95)),
            Step::Issue
        );
        // 3. The old CA stays until it expires, then goes.
        let issued = Facts {
            leaf_by_signer: true,
            leaf_not_after: now + 365 * DAY,
            ..overlap.clone()
        };
        assert_eq!(
            decide(Some(&issued), now + 106, &t, None),
            Step::Keep {
                until: now + 365 * DAY - (365 * DAY) / 3
            }
        );
        let renewed = Facts {
            leaf_not_after: 3650 * DAY + 200 * DAY,
            ..issued
        };
        assert_eq!(
            decide(Some(&renewed), 3650 * DAY - 1, &t, None),
            Step::Keep { until: 3650 * DAY }
        );
        assert_eq!(decide(Some(&renewed), 3650 * DAY, &t, None), Step::Prune);
    }

    #[test]
    fn an_expired_certificate_under_a_waiting_ca_is_replaced_at_once() {
        let t = timing();
        let overlap = Facts {
            others_not_after: vec![1000],
            leaf_by_signer: false,
            leaf_not_after: 500,
            ..fresh(0)
        };
        assert_eq!(decide(Some(&overlap), 500, &t, None), Step::Issue);
    }

    #[test]
    fn short_validities_for_tests_renew_in_seconds() {
        let t = Timing {
            ca_validity: Duration::from_secs(60),
            cert_validity: Duration::from_secs(30),
            renew_fraction: 2.0 / 3.0,
        };
        t.validate().unwrap();
        assert_eq!(t.settle(), Duration::from_secs(3));
        let facts = Facts {
            signer_not_after: 60,
            others_not_after: vec![],
            leaf_not_after: 30,
            leaf_by_signer: true,
            leaf_names_match: true,
        };
        assert_eq!(decide(Some(&facts), 0, &t, None), Step::Keep { until: 20 });
        assert_eq!(decide(Some(&facts), 20, &t, None), Step::Issue);
        let renewed = Facts {
            leaf_not_after: 50,
            ..facts
        };
        assert_eq!(
            decide(Some(&renewed), 21, &t, None),
            Step::Keep { until: 40 }
        );
        assert_eq!(decide(Some(&renewed), 40, &t, None), Step::NewAuthority);
    }

    #[test]
    fn bad_timings_are_refused_with_the_reason() {
        let t = timing();
        t.validate().unwrap();
        let short_ca = Timing {
            ca_validity: Duration::from_secs(100),
            cert_validity: Duration::from_secs(200),
            ..t
        };
        assert!(short_ca.validate().unwrap_err().contains("CA's validity"));
        let tiny = Timing {
            cert_validity: Duration::from_secs(1),
            ..t
        };
        assert!(tiny.validate().unwrap_err().contains("shorter than"));
        let never = Timing {
            renew_fraction: 1.0,
            ..t
        };
        assert!(never.validate().unwrap_err().contains("renewal fraction"));
    }
}
