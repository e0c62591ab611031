//! Making and reading TLS material: a CA, serving certificates it issues,
//! and PEM checked and turned into what rustls serves. No files, no network.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{Error as PemError, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// File name of the CA certificate, as in a `kubernetes.io/tls` Secret.
pub const CA_FILE: &str = "ca.crt";
/// File name of the serving certificate.
pub const CERT_FILE: &str = "tls.crt";
/// File name of the serving key.
pub const KEY_FILE: &str = "tls.key";

/// Validity of a serving certificate unless told otherwise.
pub const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Validity of a CA unless told otherwise.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Why TLS material could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot create a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn invalid(message: impl Into<String>) -> CertError {
    CertError::Invalid(message.into())
}

/// A CA that can issue serving certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub cert_pem: String,
    /// The CA's private key, PEM.
    pub key_pem: String,
    /// When the CA expires, seconds since the Unix epoch.
    pub not_after: i64,
}

/// A serving certificate and its key, PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

fn validity_window(validity: Duration) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    // Allow for clocks that are a little behind.
    let not_before = now - time::Duration::hours(1);
    let not_after = now
        + time::Duration::seconds(
            i64::try_from(validity.as_secs())
                .unwrap_or(i64::MAX / 2)
                .min(100 * 365 * 24 * 3600),
        );
    (not_before, not_after)
}

impl Authority {
    /// Creates a new self-signed CA valid for `validity`.
    pub fn generate(validity: Duration) -> Result<Self, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "openflux");
        dn.push(DnType::CommonName, "openflux webhook CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        (params.not_before, params.not_after) = validity_window(validity);
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after: params.not_after.unix_timestamp(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA kept as PEM (its certificate and key), to issue more
    /// certificates with.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| invalid(format!("the CA key is unreadable: {e}")))?;
        let der = parse_certs(cert_pem.as_bytes())?;
        let Some(first) = der.first() else {
            return Err(invalid("no certificate found in the CA PEM"));
        };
        let (_, parsed) = x509_parser::parse_x509_certificate(first.as_ref())
            .map_err(|e| invalid(format!("the CA certificate is not valid X.509: {e}")))?;
        if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(invalid("the CA key does not fit the CA certificate"));
        }
        let not_after = parsed.validity().not_after.timestamp();
        let issuer = Issuer::from_ca_cert_der(first, key)
            .map_err(|e| invalid(format!("the CA certificate cannot issue: {e}")))?;
        Ok(Self {
            cert_pem: pem_of(first),
            key_pem: key_pem.to_string(),
            not_after,
            issuer,
        })
    }

    /// Issues a serving certificate for the names and addresses, valid for
    /// `validity` but never past the CA's own expiry.
    pub fn issue(
        &self,
        dns_names: &[String],
        ips: &[IpAddr],
        validity: Duration,
    ) -> Result<Issued, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        for name in dns_names {
            let name = rcgen::string::Ia5String::try_from(name.as_str())?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "openflux");
        dn.push(
            DnType::CommonName,
            dns_names
                .first()
                .cloned()
                .or_else(|| ips.first().map(ToString::to_string))
                .unwrap_or_else(|| "openflux-webhook".to_string()),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = validity_window(validity);
        if let Ok(ceiling) = time::OffsetDateTime::from_unix_timestamp(self.not_after) {
            params.not_after = params.not_after.min(ceiling);
        }
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// TLS material ready to serve.
#[derive(Clone, Debug)]
pub struct Material {
    pub certified: Arc<CertifiedKey>,
    /// PEM of the CA certificate(s) a client verifies the serving certificate with.
    pub ca_bundle: Vec<u8>,
    /// When the serving certificate expires, seconds since the Unix epoch.
    pub not_after: i64,
}

/// The crypto provider openflux uses for TLS.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses the certificates of a PEM document.
pub fn parse_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, CertError> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("certificate PEM is unreadable: {e}")))
}

/// Checks a certificate chain, key and CA bundle and makes them ready to
/// serve. Without a CA bundle, the last certificate of the chain is taken
/// (the issuer when the chain includes it, the certificate itself when it is
/// self-signed).
pub fn material_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: Option<&[u8]>,
) -> Result<Material, CertError> {
    let chain = parse_certs(cert_pem)?;
    let Some(leaf) = chain.first() else {
        return Err(invalid("no certificate found in the certificate PEM"));
    };
    let key = match PrivateKeyDer::from_pem_slice(key_pem) {
        Ok(key) => key,
        Err(PemError::NoItemsFound) => return Err(invalid("no private key found in the key PEM")),
        Err(e) => return Err(invalid(format!("key PEM is unreadable: {e}"))),
    };
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| invalid(format!("the serving certificate is not valid X.509: {e}")))?;
    let not_after = parsed.validity().not_after.timestamp();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    if not_after <= now {
        return Err(invalid(format!(
            "the serving certificate expired at {}",
            parsed.validity().not_after
        )));
    }
    let certified = CertifiedKey::from_der(chain.clone(), key, &provider())
        .map_err(|e| invalid(format!("the key does not fit the certificate: {e}")))?;
    let ca_bundle = match ca_pem {
        Some(ca) => {
            if parse_certs(ca)?.is_empty() {
                return Err(invalid("no certificate found in the CA PEM"));
            }
            ca.to_vec()
        }
        None => {
            let last = chain.last().unwrap_or(leaf);
            pem_of(last).into_bytes()
        }
    };
    Ok(Material {
        certified: Arc::new(certified),
        ca_bundle,
        not_after,
    })
}

/// PEM of one DER certificate.
pub fn pem_of(cert: &CertificateDer<'_>) -> String {
    let pem = ::pem::Pem::new("CERTIFICATE", cert.as_ref().to_vec());
    ::pem::encode_config(
        &pem,
        ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A serving certificate of `ca` for `names` and 127.0.0.1.
    pub(crate) fn issued(ca: &Authority, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        ca.issue(
            &names,
            &["127.0.0.1".parse().unwrap()],
            DEFAULT_CERT_VALIDITY,
        )
        .unwrap()
    }

    #[test]
    fn issued_certificates_load_and_name_their_sans() {
        let ca = Authority::generate(DEFAULT_CA_VALIDITY).unwrap();
        let leaf = issued(&ca, &["localhost", "openflux-webhook.openflux-system.svc"]);
        let material = material_from_pem(
            leaf.cert_pem.as_bytes(),
            leaf.key_pem.as_bytes(),
            Some(ca.cert_pem.as_bytes()),
        )
        .unwrap();
        assert_eq!(material.ca_bundle, ca.cert_pem.as_bytes());
        let der = material.certified.end_entity_cert().unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n.contains("openflux-webhook.openflux-system.svc")),
            "{names:?}"
        );
        assert!(
            san.value.general_names.iter().any(|n| matches!(
                n,
                x509_parser::extensions::GeneralName::IPAddress(ip) if *ip == [127, 0, 0, 1]
            )),
            "{names:?}"
        );
        let ca_der = parse_certs(ca.cert_pem.as_bytes()).unwrap();
        let (_, ca_cert) = x509_parser::parse_x509_certificate(ca_der[0].as_ref()).unwrap();
        assert!(ca_cert.is_ca());
        assert_eq!(cert.issuer(), ca_cert.subject());
    }

    #[test]
    fn mismatched_or_garbage_material_is_rejected() {
        let ca = Authority::generate(DEFAULT_CA_VALIDITY).unwrap();
        let a = issued(&ca, &["a"]);
        let b = issued(&ca, &["b"]);
        let err = material_from_pem(a.cert_pem.as_bytes(), b.key_pem.as_bytes(), None).unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
        assert!(material_from_pem(b"junk", a.key_pem.as_bytes(), None).is_err());
        assert!(material_from_pem(a.cert_pem.as_bytes(), b"junk", None).is_err());
        assert!(material_from_pem(
            a.cert_pem.as_bytes(),
            a.key_pem.as_bytes(),
            Some(b"not a cert")
        )
        .is_err());
        // Without a CA, the chain's last certificate stands in.
        let m = material_from_pem(a.cert_pem.as_bytes(), a.key_pem.as_bytes(), None).unwrap();
        assert_eq!(
            parse_certs(&m.ca_bundle).unwrap(),
            parse_certs(a.cert_pem.as_bytes()).unwrap()
        );
    }

    #[test]
    fn expired_certificates_are_rejected() {
        let ca = Authority::generate(DEFAULT_CA_VALIDITY).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["x".to_string()]).unwrap();
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(10);
        params.not_after = time::OffsetDateTime::now_utc() - time::Duration::days(1);
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        let err = material_from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes(), None)
            .unwrap_err();
        assert!(err.to_string().contains("expired"), "{err}");
    }
}
