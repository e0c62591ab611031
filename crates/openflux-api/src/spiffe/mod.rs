//! Serving artifacts over mutual TLS with SPIFFE identities (feature
//! `spiffe`), as source-controller v1.10 does with
//! `--authorized-artifact-client-spiffe-id`: on a cluster where
//! kustomize-controller (or helm-controller, source-watcher) requires
//! `--authorized-artifact-server-spiffe-id`, a producer's artifact URLs
//! must be https and served with an X.509-SVID those consumers authorize.
//!
//! - [`ids`]: the authorized SPIFFE ID patterns, in Flux's syntax;
//! - [`flags`]: the flags (`--authorized-artifact-client-spiffe-id`,
//!   `--spiffe-endpoint-socket` / `SPIFFE_ENDPOINT_SOCKET`);
//! - [`tls`]: the SVID from the Workload API, kept current, and the
//!   server (and client) TLS configurations that authorize peers by ID;
//! - [`serve`]: serving a router with such a configuration.

pub mod flags;
pub mod ids;
pub mod serve;
pub mod tls;

pub use flags::{MtlsSettings, SettingsError, SpiffeArgs};
pub use ids::{AuthorizedIds, IdError, IdPattern};
pub use serve::serve_tls;
pub use tls::{client_config, connect, own_id, server_config, MtlsMetrics, SpiffeError};
