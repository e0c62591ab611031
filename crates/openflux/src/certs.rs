//! TLS material for the webhook: creating a CA and a serving certificate,
//! loading PEM files, and a certificate resolver that is swapped on rotation.
//!
//! `openflux certs` writes `ca.crt`, `tls.crt` and `tls.key` for a Secret.
//! `openflux run` serves mounted files and reloads them when their content
//! changes (a mounted Secret is swapped by Kubernetes through a symlink, so
//! the files are polled by content rather than watched), or, without files,
//! creates a CA and serving certificate in memory and renews the serving
//! certificate (same CA) well before it expires.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{Error as PemError, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::locks;

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

/// The `openflux certs` command: writes a CA and a serving certificate.
#[derive(clap::Args, Debug, Clone)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key to (created if missing).
    #[arg(long)]
    pub out_dir: PathBuf,
    /// DNS name the serving certificate is valid for (repeatable), e.g.
    /// openflux-webhook.openflux-system.svc.
    #[arg(long = "dns-name", value_name = "NAME")]
    pub dns_names: Vec<String>,
    /// IP address the serving certificate is valid for (repeatable).
    #[arg(long = "ip", value_name = "IP")]
    pub ips: Vec<IpAddr>,
    /// Days the serving certificate is valid.
    #[arg(long, default_value_t = 365)]
    pub validity_days: u64,
    /// Days the CA is valid.
    #[arg(long, default_value_t = 3650)]
    pub ca_validity_days: u64,
}

/// Runs `openflux certs`.
pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    if args.dns_names.is_empty() && args.ips.is_empty() {
        anyhow::bail!("give at least one --dns-name or --ip for the serving certificate");
    }
    let ca = Authority::generate(days(args.ca_validity_days))?;
    let issued = ca.issue(&args.dns_names, &args.ips, days(args.validity_days))?;
    fs::create_dir_all(&args.out_dir).map_err(|source| CertError::Io {
        path: args.out_dir.clone(),
        source,
    })?;
    write_file(&args.out_dir.join(CA_FILE), ca.cert_pem.as_bytes(), 0o644)?;
    write_file(
        &args.out_dir.join(CERT_FILE),
        issued.cert_pem.as_bytes(),
        0o644,
    )?;
    write_file(
        &args.out_dir.join(KEY_FILE),
        issued.key_pem.as_bytes(),
        0o600,
    )?;
    println!(
        "wrote {CA_FILE}, {CERT_FILE} and {KEY_FILE} to {}",
        args.out_dir.display()
    );
    Ok(())
}

fn days(n: u64) -> Duration {
    Duration::from_secs(n.saturating_mul(24 * 3600))
}

/// Writes a file through a temporary file and a rename, with `mode` on Unix.
fn write_file(path: &Path, content: &[u8], mode: u32) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).map_err(io)?;
    // The mode given at creation is filtered by the umask; set it exactly.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io)?;
    }
    file.write_all(content).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(&tmp, path).map_err(io)
}

/// A CA that can issue serving certificates.
pub struct Authority {
    params: CertificateParams,
    key: KeyPair,
    /// The CA certificate, PEM.
    pub cert_pem: String,
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
            params,
            key,
        })
    }

    /// Issues a serving certificate for the names and addresses.
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
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer)?;
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

/// A server certificate resolver whose certificate is replaced atomically.
/// Connections keep the certificate they were set up with; new handshakes
/// see the new one.
#[derive(Debug)]
pub struct SwappableCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl SwappableCert {
    pub fn new(initial: Arc<CertifiedKey>) -> Self {
        Self {
            current: RwLock::new(initial),
        }
    }

    /// Serves `next` from the next handshake on.
    pub fn set(&self, next: Arc<CertifiedKey>) {
        *locks::write(&self.current) = next;
    }

    /// The certificate served now.
    pub fn get(&self) -> Arc<CertifiedKey> {
        locks::read(&self.current).clone()
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

/// The TLS versions the webhook accepts: 1.3 and 1.2, nothing older.
pub static TLS_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// A server configuration with TLS 1.2 and 1.3 only, ALPN h2 and http/1.1,
/// and the certificate from `resolver`.
pub fn server_config(resolver: Arc<SwappableCert>) -> Result<ServerConfig, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(TLS_VERSIONS)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Mounted certificate files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA file given explicitly; otherwise `ca.crt` beside the certificate
    /// is used when it exists.
    pub ca: Option<PathBuf>,
}

/// The content of the files at one moment, and its hash.
struct Snapshot {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
    hash: [u8; 32],
}

impl CertFiles {
    fn ca_path(&self) -> Option<PathBuf> {
        if let Some(ca) = &self.ca {
            return Some(ca.clone());
        }
        let beside = self.cert.parent()?.join(CA_FILE);
        beside.exists().then_some(beside)
    }

    fn read(&self) -> Result<Snapshot, CertError> {
        let read = |path: &Path| {
            fs::read(path).map_err(|source| CertError::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        let cert = read(&self.cert)?;
        let key = read(&self.key)?;
        let ca = self.ca_path().map(|p| read(&p)).transpose()?;
        let mut hasher = Sha256::new();
        for part in [Some(&cert), Some(&key), ca.as_ref()] {
            let part = part.map(Vec::as_slice).unwrap_or_default();
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Ok(Snapshot {
            cert,
            key,
            ca,
            hash: hasher.finalize().into(),
        })
    }

    /// Loads the files once.
    pub fn load(&self) -> Result<Material, CertError> {
        let snapshot = self.read()?;
        material_from_pem(&snapshot.cert, &snapshot.key, snapshot.ca.as_deref())
    }
}

/// Where the webhook's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertSource {
    /// Mounted files, reloaded when their content changes.
    Files(CertFiles),
    /// A CA and serving certificate made in memory for these names.
    InMemory {
        dns_names: Vec<String>,
        ips: Vec<IpAddr>,
    },
}

/// Serves certificates from a [`CertSource`]: the resolver for the TLS
/// configuration and the CA bundle clients need, both kept current by
/// [`CertKeeper::run`].
pub struct CertKeeper {
    source: CertSource,
    resolver: Arc<SwappableCert>,
    ca_bundle: watch::Sender<Vec<u8>>,
    /// For in-memory material: the CA that renews the serving certificate.
    authority: Option<Authority>,
    /// Hash of the file content last tried, good or bad.
    last_hash: Option<[u8; 32]>,
    not_after: i64,
}

impl CertKeeper {
    /// Loads or creates the first certificate. Fails when mounted files are
    /// unusable: there is nothing to serve then.
    pub fn start(source: CertSource) -> Result<Self, CertError> {
        let (material, authority, last_hash) = match &source {
            CertSource::Files(files) => {
                let snapshot = files.read()?;
                let material =
                    material_from_pem(&snapshot.cert, &snapshot.key, snapshot.ca.as_deref())?;
                (material, None, Some(snapshot.hash))
            }
            CertSource::InMemory { dns_names, ips } => {
                let ca = Authority::generate(DEFAULT_CA_VALIDITY)?;
                let issued = ca.issue(dns_names, ips, DEFAULT_CERT_VALIDITY)?;
                let material = material_from_pem(
                    issued.cert_pem.as_bytes(),
                    issued.key_pem.as_bytes(),
                    Some(ca.cert_pem.as_bytes()),
                )?;
                (material, Some(ca), None)
            }
        };
        let resolver = Arc::new(SwappableCert::new(material.certified.clone()));
        let (ca_bundle, _) = watch::channel(material.ca_bundle.clone());
        Ok(Self {
            source,
            resolver,
            ca_bundle,
            authority,
            last_hash,
            not_after: material.not_after,
        })
    }

    /// The resolver to build the TLS configuration with.
    pub fn resolver(&self) -> Arc<SwappableCert> {
        self.resolver.clone()
    }

    /// The CA bundle of what is served, updated on every rotation.
    pub fn ca_bundle(&self) -> watch::Receiver<Vec<u8>> {
        self.ca_bundle.subscribe()
    }

    /// Checks the source once: reloads changed files, or renews an in-memory
    /// certificate past two thirds of its life. Returns whether the served
    /// certificate changed. A bad new certificate is logged and the current one
    /// kept.
    pub fn refresh(&mut self) -> bool {
        match &self.source {
            CertSource::Files(files) => {
                let snapshot = match files.read() {
                    Ok(s) => s,
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the webhook certificate files; serving the current certificate");
                        return false;
                    }
                };
                if self.last_hash == Some(snapshot.hash) {
                    return false;
                }
                self.last_hash = Some(snapshot.hash);
                match material_from_pem(&snapshot.cert, &snapshot.key, snapshot.ca.as_deref()) {
                    Ok(material) => {
                        self.install(material);
                        true
                    }
                    Err(error) => {
                        tracing::error!(%error, cert = %files.cert.display(), "rejected the new webhook certificate; serving the current one");
                        false
                    }
                }
            }
            CertSource::InMemory { dns_names, ips } => {
                let Some(ca) = &self.authority else {
                    return false;
                };
                let now = time::OffsetDateTime::now_utc().unix_timestamp();
                let lifetime = i64::try_from(DEFAULT_CERT_VALIDITY.as_secs()).unwrap_or(i64::MAX);
                if now < self.not_after - lifetime / 3 {
                    return false;
                }
                let renewed = ca
                    .issue(dns_names, ips, DEFAULT_CERT_VALIDITY)
                    .and_then(|issued| {
                        material_from_pem(
                            issued.cert_pem.as_bytes(),
                            issued.key_pem.as_bytes(),
                            Some(ca.cert_pem.as_bytes()),
                        )
                    });
                match renewed {
                    Ok(material) => {
                        self.install(material);
                        true
                    }
                    Err(error) => {
                        tracing::error!(%error, "cannot renew the in-memory webhook certificate");
                        false
                    }
                }
            }
        }
    }

    fn install(&mut self, material: Material) {
        self.resolver.set(material.certified.clone());
        self.not_after = material.not_after;
        tracing::info!(
            not_after = material.not_after,
            "serving a new webhook certificate"
        );
        self.ca_bundle.send_if_modified(|bundle| {
            if *bundle == material.ca_bundle {
                false
            } else {
                *bundle = material.ca_bundle;
                true
            }
        });
    }

    /// Refreshes every `interval` until `stop` turns true or its sender goes away.
    pub async fn run(mut self, interval: Duration, mut stop: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    self.refresh();
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(ca: &Authority, names: &[&str]) -> Issued {
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
        let cert = params
            .signed_by(&key, &Issuer::from_params(&ca.params, &ca.key))
            .unwrap();
        let err = material_from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes(), None)
            .unwrap_err();
        assert!(err.to_string().contains("expired"), "{err}");
    }

    #[test]
    fn certs_command_writes_files_with_private_key_mode() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        run(CertsArgs {
            out_dir: out.clone(),
            dns_names: vec!["openflux-webhook.openflux-system.svc".into()],
            ips: vec!["127.0.0.1".parse().unwrap()],
            validity_days: 30,
            ca_validity_days: 60,
        })
        .unwrap();
        let files = CertFiles {
            cert: out.join(CERT_FILE),
            key: out.join(KEY_FILE),
            ca: None,
        };
        let material = files.load().unwrap();
        assert_eq!(material.ca_bundle, fs::read(out.join(CA_FILE)).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(out.join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(run(CertsArgs {
            out_dir: out,
            dns_names: vec![],
            ips: vec![],
            validity_days: 1,
            ca_validity_days: 1,
        })
        .is_err());
    }

    #[test]
    fn keeper_reloads_changed_files_and_keeps_serving_on_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::generate(DEFAULT_CA_VALIDITY).unwrap();
        let first = issued(&ca, &["one"]);
        fs::write(dir.path().join(CA_FILE), &ca.cert_pem).unwrap();
        fs::write(dir.path().join(CERT_FILE), &first.cert_pem).unwrap();
        fs::write(dir.path().join(KEY_FILE), &first.key_pem).unwrap();
        let files = CertFiles {
            cert: dir.path().join(CERT_FILE),
            key: dir.path().join(KEY_FILE),
            ca: None,
        };
        let mut keeper = CertKeeper::start(CertSource::Files(files)).unwrap();
        let resolver = keeper.resolver();
        let mut bundle = keeper.ca_bundle();
        let served = |r: &SwappableCert| r.get().end_entity_cert().unwrap().to_vec();
        let first_der = served(&resolver);
        assert!(!keeper.refresh(), "unchanged files are not reloaded");

        // A half-written rotation (new cert, old key) is refused.
        let second = issued(&ca, &["two"]);
        fs::write(dir.path().join(CERT_FILE), &second.cert_pem).unwrap();
        assert!(!keeper.refresh());
        assert_eq!(served(&resolver), first_der);

        // Completed: served from now on; the CA did not change.
        fs::write(dir.path().join(KEY_FILE), &second.key_pem).unwrap();
        assert!(keeper.refresh());
        assert_ne!(served(&resolver), first_der);
        assert!(!bundle.has_changed().unwrap());

        // A new CA is published.
        let ca2 = Authority::generate(DEFAULT_CA_VALIDITY).unwrap();
        let third = issued(&ca2, &["three"]);
        fs::write(dir.path().join(CA_FILE), &ca2.cert_pem).unwrap();
        fs::write(dir.path().join(CERT_FILE), &third.cert_pem).unwrap();
        fs::write(dir.path().join(KEY_FILE), &third.key_pem).unwrap();
        assert!(keeper.refresh());
        assert!(bundle.has_changed().unwrap());
        assert_eq!(*bundle.borrow_and_update(), ca2.cert_pem.as_bytes());

        // Files gone: keep serving.
        fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        assert!(!keeper.refresh());
        assert_eq!(
            served(&resolver),
            parse_certs(third.cert_pem.as_bytes()).unwrap()[0].to_vec()
        );
    }

    #[test]
    fn in_memory_material_is_made_for_the_given_names() {
        let keeper = CertKeeper::start(CertSource::InMemory {
            dns_names: vec!["localhost".into()],
            ips: vec!["127.0.0.1".parse().unwrap()],
        })
        .unwrap();
        let bundle = keeper.ca_bundle().borrow().clone();
        assert_eq!(parse_certs(&bundle).unwrap().len(), 1);
        let mut keeper = keeper;
        assert!(!keeper.refresh(), "a fresh certificate is not renewed");
    }

    #[test]
    fn server_config_offers_tls12_and_tls13_only() {
        let keeper = CertKeeper::start(CertSource::InMemory {
            dns_names: vec!["localhost".into()],
            ips: vec![],
        })
        .unwrap();
        let config = server_config(keeper.resolver()).unwrap();
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let versions: Vec<_> = TLS_VERSIONS.iter().map(|v| v.version).collect();
        assert_eq!(
            versions,
            vec![
                rustls::ProtocolVersion::TLSv1_3,
                rustls::ProtocolVersion::TLSv1_2
            ]
        );
    }
}
