//! The X.509-SVID of this process, from the SPIFFE Workload API, and the
//! mutual TLS configurations built on it.
//!
//! The SVID and the trust bundles are watched for as long as the process
//! runs: when the Workload API rotates them, the next handshake uses the
//! new ones (connections already open keep theirs). The peer's certificate
//! chain is verified against the bundle of the peer's trust domain, then
//! its SPIFFE ID (the URI SAN) must match an authorized pattern; a peer
//! that fails either is refused during the handshake, before any request.
//! TLS 1.2 and 1.3 only; session resumption is off, so every connection is
//! verified and authorized with the material current at its handshake.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use spiffe::{SpiffeId, X509Source};

use super::ids::AuthorizedIds;

/// The Workload API could not give this process an X.509-SVID.
#[derive(Debug, thiserror::Error)]
pub enum SpiffeError {
    #[error("SPIFFE Workload API at {endpoint}: {message}")]
    Source { endpoint: String, message: String },
    #[error("building the SPIFFE mTLS configuration: {0}")]
    Tls(String),
}

/// Connects to the Workload API at `endpoint` and waits (up to `timeout`)
/// for the first X.509-SVID and bundles; keeps them current afterwards.
pub async fn connect(endpoint: &str, timeout: Duration) -> Result<X509Source, SpiffeError> {
    let source = X509Source::builder()
        .endpoint(endpoint)
        .initial_sync_timeout(timeout)
        .build()
        .await
        .map_err(|e| SpiffeError::Source {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        })?;
    Ok(source)
}

/// This process's SPIFFE ID now, if it has an SVID.
pub fn own_id(source: &X509Source) -> Option<SpiffeId> {
    source.try_svid().map(|svid| svid.spiffe_id().clone())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    /// `authorized` or `unauthorized`.
    result: &'static str,
}

/// Counts of the peers the authorizer judged and of failed handshakes.
#[derive(Clone, Debug, Default)]
pub struct MtlsMetrics {
    peers: Family<PeerLabels, Counter>,
    handshake_failures: Counter,
}

impl MtlsMetrics {
    /// Registers `openflux_spiffe_peers_total{result}` (peers whose
    /// certificate chain verified, by whether their SPIFFE ID was
    /// authorized) and `openflux_spiffe_handshake_failures_total` (mTLS
    /// handshakes that failed, refused peers included).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = MtlsMetrics::default();
        registry.register(
            "openflux_spiffe_peers",
            "Peers with a verified X.509-SVID, by whether their SPIFFE ID was authorized",
            metrics.peers.clone(),
        );
        registry.register(
            "openflux_spiffe_handshake_failures",
            "SPIFFE mTLS handshakes that failed (no or unverifiable SVID, unauthorized ID, timeout)",
            metrics.handshake_failures.clone(),
        );
        metrics
    }

    fn count(&self, result: &'static str) {
        self.peers.get_or_create(&PeerLabels { result }).inc();
    }

    /// One handshake failed.
    pub fn handshake_failed(&self) {
        self.handshake_failures.inc();
    }
}

/// Authorizes a peer by its SPIFFE ID, `self` patterns resolved against
/// the trust domain of this process's SVID at the time of the handshake.
fn authorizer(
    source: X509Source,
    allowed: AuthorizedIds,
    metrics: MtlsMetrics,
    role: &'static str,
) -> impl Fn(&SpiffeId) -> bool + Send + Sync + 'static {
    move |peer: &SpiffeId| {
        let own = own_id(&source);
        let own_domain = own.as_ref().map(SpiffeId::trust_domain_name);
        let ok = allowed.authorizes(own_domain, peer.trust_domain_name(), peer.path());
        if ok {
            metrics.count("authorized");
            tracing::debug!(peer = %peer, "{role} authorized");
        } else {
            metrics.count("unauthorized");
            tracing::warn!(
                peer = %peer,
                authorized = %allowed.describe(),
                "refusing a {role} whose SPIFFE ID is not authorized"
            );
        }
        ok
    }
}

const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A server configuration that presents this process's SVID and admits
/// only clients whose SVID verifies and whose ID `clients` authorizes.
pub fn server_config(
    source: X509Source,
    clients: AuthorizedIds,
    metrics: MtlsMetrics,
) -> Result<rustls::ServerConfig, SpiffeError> {
    spiffe_rustls::mtls_server(source.clone())
        .authorize(authorizer(source, clients, metrics, "client"))
        .with_alpn_protocols(ALPN)
        .build()
        .map_err(|e| SpiffeError::Tls(e.to_string()))
}

/// A client configuration that presents this process's SVID and accepts
/// only servers whose SVID verifies and whose ID `servers` authorizes (as
/// kustomize-controller's `--authorized-artifact-server-spiffe-id` does).
pub fn client_config(
    source: X509Source,
    servers: AuthorizedIds,
    metrics: MtlsMetrics,
) -> Result<rustls::ClientConfig, SpiffeError> {
    spiffe_rustls::mtls_client(source.clone())
        .authorize(authorizer(source, servers, metrics, "server"))
        .with_alpn_protocols([b"http/1.1"])
        .build()
        .map_err(|e| SpiffeError::Tls(e.to_string()))
}
