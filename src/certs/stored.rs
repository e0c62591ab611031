//! The content of the Secret openflux keeps its webhook certificates in:
//! read from the Secret's data, judged for [`rotation::decide`], and changed
//! by one [`Step`]. No API calls; keys are made here.
//!
//! Keys of the Secret (those of a `kubernetes.io/tls` Secret, plus the CA's
//! key): `ca.crt` the trust bundle (the signing CA first, then older CAs
//! still trusted), `ca.key` the signing CA's key, `tls.crt` and `tls.key`
//! the serving certificate and its key.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::X509Certificate;

use super::material::{parse_certs, pem_of, Authority, CertError, CA_FILE, CERT_FILE, KEY_FILE};
use super::rotation::{Facts, Step, Timing};

/// Key of the signing CA's private key in the Secret.
pub const CA_KEY_FILE: &str = "ca.key";

/// What the serving certificate must name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

/// The certificates of the Secret, PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    /// The trust bundle, one PEM certificate each; the signing CA first.
    pub bundle: Vec<String>,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
}

fn invalid(message: impl Into<String>) -> CertError {
    CertError::Invalid(message.into())
}

fn parse<'a>(der: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>, CertError> {
    x509_parser::parse_x509_certificate(der.as_ref())
        .map(|(_, cert)| cert)
        .map_err(|e| invalid(format!("a certificate is not valid X.509: {e}")))
}

/// The certificate's subject key identifier.
fn subject_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0),
            _ => None,
        })
}

/// The key identifier of the certificate's issuer.
fn authority_key_id<'a>(cert: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|id| id.0)
            }
            _ => None,
        })
}

/// Whether the certificate names exactly `names`.
fn names_match(cert: &X509Certificate<'_>, names: &Names) -> bool {
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return names.dns_names.is_empty() && names.ips.is_empty();
    };
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for name in &san.value.general_names {
        match name {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(raw) => match raw.len() {
                4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*raw).unwrap_or_default())),
                16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*raw).unwrap_or_default())),
                _ => return false,
            },
            _ => return false,
        }
    }
    let (mut want_dns, mut want_ips) = (names.dns_names.clone(), names.ips.clone());
    for list in [&mut dns, &mut want_dns] {
        list.sort();
        list.dedup();
    }
    for list in [&mut ips, &mut want_ips] {
        list.sort();
        list.dedup();
    }
    dns == want_dns && ips == want_ips
}

impl Content {
    /// Reads the Secret's data; an error says what is missing or unreadable.
    pub fn from_data(data: &BTreeMap<String, Vec<u8>>) -> Result<Self, CertError> {
        let text = |key: &str| -> Result<String, CertError> {
            let bytes = data
                .get(key)
                .ok_or_else(|| invalid(format!("the Secret has no {key}")))?;
            String::from_utf8(bytes.clone()).map_err(|_| invalid(format!("{key} is not PEM text")))
        };
        let bundle = parse_certs(text(CA_FILE)?.as_bytes())?
            .iter()
            .map(|c| pem_of(c))
            .collect::<Vec<_>>();
        if bundle.is_empty() {
            return Err(invalid(format!("{CA_FILE} holds no certificate")));
        }
        Ok(Self {
            bundle,
            ca_key: text(CA_KEY_FILE)?,
            cert: text(CERT_FILE)?,
            key: text(KEY_FILE)?,
        })
    }

    /// The Secret's data.
    pub fn to_data(&self) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            (CA_FILE.to_string(), self.bundle.concat().into_bytes()),
            (CA_KEY_FILE.to_string(), self.ca_key.clone().into_bytes()),
            (CERT_FILE.to_string(), self.cert.clone().into_bytes()),
            (KEY_FILE.to_string(), self.key.clone().into_bytes()),
        ])
    }

    /// The signing CA's certificate, PEM.
    pub fn signer(&self) -> &str {
        self.bundle.first().map(String::as_str).unwrap_or_default()
    }

    /// What [`rotation::decide`](super::rotation::decide) needs to know.
    pub fn facts(&self, names: &Names) -> Result<Facts, CertError> {
        let bundle = self
            .bundle
            .iter()
            .map(|pem| parse_certs(pem.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let bundle: Vec<CertificateDer<'static>> = bundle.into_iter().flatten().collect();
        let Some((signer, others)) = bundle.split_first() else {
            return Err(invalid(format!("{CA_FILE} holds no certificate")));
        };
        // The key must be the signer's, or nothing can be issued.
        Authority::from_pem(self.signer(), &self.ca_key)?;
        let signer = parse(signer)?;
        let leaf = parse_certs(self.cert.as_bytes())?;
        let leaf = parse(
            leaf.first()
                .ok_or_else(|| invalid(format!("{CERT_FILE} holds no certificate")))?,
        )?;
        let leaf_by_signer = match (authority_key_id(&leaf), subject_key_id(&signer)) {
            (Some(a), Some(s)) => a == s,
            _ => false,
        };
        Ok(Facts {
            signer_not_after: signer.validity().not_after.timestamp(),
            others_not_after: others
                .iter()
                .map(|c| parse(c).map(|c| c.validity().not_after.timestamp()))
                .collect::<Result<_, _>>()?,
            leaf_not_after: leaf.validity().not_after.timestamp(),
            leaf_by_signer,
            leaf_names_match: names_match(&leaf, names),
        })
    }

    /// A new CA and a serving certificate it signed.
    pub fn create(timing: &Timing, names: &Names) -> Result<Self, CertError> {
        let ca = Authority::generate(timing.ca_validity)?;
        let issued = ca.issue(&names.dns_names, &names.ips, timing.cert_validity)?;
        Ok(Self {
            bundle: vec![ca.cert_pem],
            ca_key: ca.key_pem,
            cert: issued.cert_pem,
            key: issued.key_pem,
        })
    }

    /// The content after `step` at `now` (Unix seconds). `Keep` changes
    /// nothing.
    pub fn apply(
        &self,
        step: Step,
        now: i64,
        timing: &Timing,
        names: &Names,
    ) -> Result<Self, CertError> {
        let mut next = self.clone();
        match step {
            Step::Keep { .. } => {}
            Step::Create => return Self::create(timing, names),
            Step::NewAuthority => {
                let ca = Authority::generate(timing.ca_validity)?;
                next.bundle.insert(0, ca.cert_pem);
                next.ca_key = ca.key_pem;
            }
            Step::Issue => {
                let ca = Authority::from_pem(self.signer(), &self.ca_key)?;
                let issued = ca.issue(&names.dns_names, &names.ips, timing.cert_validity)?;
                next.cert = issued.cert_pem;
                next.key = issued.key_pem;
            }
            Step::Prune => {
                let signer = self.signer().to_string();
                next.bundle.retain(|pem| {
                    *pem == signer
                        || parse_certs(pem.as_bytes())
                            .ok()
                            .and_then(|c| c.first().cloned())
                            .and_then(|c| {
                                parse(&c).ok().map(|c| c.validity().not_after.timestamp())
                            })
                            .is_some_and(|not_after| not_after > now)
                });
            }
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::material::material_from_pem;
    use crate::certs::rotation::decide;
    use std::time::Duration;

    fn names() -> Names {
        Names {
            dns_names: vec![
                "localhost".into(),
                "openflux-webhook.openflux-system.svc".into(),
            ],
            ips: vec!["127.0.0.1".parse().unwrap()],
        }
    }

    fn timing() -> Timing {
        Timing {
            ca_validity: Duration::from_secs(3650 * 24 * 3600),
            cert_validity: Duration::from_secs(365 * 24 * 3600),
            renew_fraction: 2.0 / 3.0,
        }
    }

    fn now() -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
    }

    /// The CAs of the bundle a client would trust, and the issuer's key id
    /// of what is served.
    fn serves_under(content: &Content) -> bool {
        let material = material_from_pem(
            content.cert.as_bytes(),
            content.key.as_bytes(),
            Some(content.bundle.concat().as_bytes()),
        )
        .unwrap();
        let leaf = material.certified.end_entity_cert().unwrap().clone();
        let leaf = parse(&leaf).unwrap();
        let wanted = authority_key_id(&leaf).unwrap().to_vec();
        parse_certs(&material.ca_bundle).unwrap().iter().any(|ca| {
            let ca = parse(ca).unwrap();
            subject_key_id(&ca) == Some(wanted.as_slice())
        })
    }

    #[test]
    fn created_content_round_trips_and_is_fresh() {
        let content = Content::create(&timing(), &names()).unwrap();
        let back = Content::from_data(&content.to_data()).unwrap();
        assert_eq!(back, content);
        let facts = content.facts(&names()).unwrap();
        assert!(facts.leaf_by_signer && facts.leaf_names_match, "{facts:?}");
        assert!(matches!(
            decide(Some(&facts), now(), &timing(), None),
            Step::Keep { .. }
        ));
        assert!(serves_under(&content));
        let other = Names {
            dns_names: vec!["localhost".into()],
            ips: vec![],
        };
        assert!(!content.facts(&other).unwrap().leaf_names_match);
    }

    #[test]
    fn during_a_ca_rotation_the_bundle_trusts_what_is_served() {
        let (t, n) = (timing(), names());
        let first = Content::create(&t, &n).unwrap();
        // 1. New signer first, the old CA after it, the same certificate.
        let overlap = first.apply(Step::NewAuthority, now(), &t, &n).unwrap();
        assert_eq!(overlap.bundle.len(), 2);
        assert_eq!(overlap.bundle[1], first.bundle[0]);
        assert_ne!(overlap.bundle[0], first.bundle[0]);
        assert_eq!((&overlap.cert, &overlap.key), (&first.cert, &first.key));
        assert!(serves_under(&overlap));
        let facts = overlap.facts(&n).unwrap();
        assert!(!facts.leaf_by_signer);
        // A replica still on the first content serves a certificate the
        // new bundle trusts.
        let mut old_replica = first.clone();
        old_replica.bundle = overlap.bundle.clone();
        assert!(serves_under(&old_replica));
        // 2. Issued by the new signer; both CAs still trusted.
        let issued = overlap.apply(Step::Issue, now(), &t, &n).unwrap();
        assert_eq!(issued.bundle, overlap.bundle);
        assert!(issued.facts(&n).unwrap().leaf_by_signer);
        assert!(serves_under(&issued));
        // 3. Pruning keeps a CA until it expires.
        let kept = issued.apply(Step::Prune, now(), &t, &n).unwrap();
        assert_eq!(kept.bundle.len(), 2);
        let later = now() + 11 * 365 * 24 * 3600;
        let pruned = issued.apply(Step::Prune, later, &t, &n).unwrap();
        assert_eq!(pruned.bundle, vec![issued.bundle[0].clone()]);
    }

    #[test]
    fn a_serving_certificate_never_outlives_its_ca() {
        let n = names();
        let t = Timing {
            ca_validity: Duration::from_secs(60),
            cert_validity: Duration::from_secs(3600),
            renew_fraction: 0.5,
        };
        let content = Content::create(&t, &n).unwrap();
        let facts = content.facts(&n).unwrap();
        assert_eq!(facts.leaf_not_after, facts.signer_not_after);
    }

    #[test]
    fn unusable_data_says_what_is_wrong() {
        let content = Content::create(&timing(), &names()).unwrap();
        let mut data = content.to_data();
        data.remove(CA_KEY_FILE);
        let err = Content::from_data(&data).unwrap_err().to_string();
        assert!(err.contains("ca.key"), "{err}");
        let mut data = content.to_data();
        data.insert(CA_FILE.into(), b"junk".to_vec());
        assert!(Content::from_data(&data).is_err());
        // The CA key of another CA.
        let other = Content::create(&timing(), &names()).unwrap();
        let mixed = Content {
            ca_key: other.ca_key,
            ..content
        };
        let err = mixed.facts(&names()).unwrap_err().to_string();
        assert!(err.contains("does not fit"), "{err}");
    }
}
