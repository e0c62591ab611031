//! Serving certificates over time: a resolver whose certificate is swapped on
//! rotation, the TLS configuration built on it, and the keeper that reloads
//! mounted files when their content changes or renews in-memory material.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::material::{
    material_from_pem, provider, Authority, CertError, Material, DEFAULT_CA_VALIDITY,
    DEFAULT_CERT_VALIDITY,
};
use crate::locks;

pub use super::material::{CA_FILE, CERT_FILE, KEY_FILE};

/// A server certificate resolver whose certificate is replaced atomically.
/// Connections keep the certificate they were set up with; new handshakes
/// see the new one. Until it has a certificate, handshakes fail.
#[derive(Debug, Default)]
pub struct SwappableCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl SwappableCert {
    pub fn new(initial: Arc<CertifiedKey>) -> Self {
        Self {
            current: RwLock::new(Some(initial)),
        }
    }

    /// Serves `next` from the next handshake on.
    pub fn set(&self, next: Arc<CertifiedKey>) {
        *locks::write(&self.current) = Some(next);
    }

    /// The certificate served now, if there is one yet.
    pub fn get(&self) -> Option<Arc<CertifiedKey>> {
        locks::read(&self.current).clone()
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.get()
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
    use crate::certs::material::parse_certs;
    use crate::certs::material::tests::issued;

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
        let served = |r: &SwappableCert| r.get().unwrap().end_entity_cert().unwrap().to_vec();
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
