//! TLS material for the webhook: creating a CA and a serving certificate,
//! loading PEM files, and a certificate resolver that is swapped on rotation.
//!
//! `openflux certs` writes `ca.crt`, `tls.crt` and `tls.key` for a Secret.
//! `openflux run` serves mounted files and reloads them when their content
//! changes (a mounted Secret is swapped by Kubernetes through a symlink, so
//! the files are polled by content rather than watched), or, without files,
//! creates a CA and serving certificate in memory and renews the serving
//! certificate (same CA) well before it expires, or keeps them in a Secret
//! that every replica serves from and the elected leader creates and renews
//! ([`secret`] and [`renew`], timed by [`rotation`], its content in
//! [`stored`]); the leader also removes from the webhook configurations
//! the CAs that left the Secret ([`retire`]).

pub mod cabundle;
pub mod command;
pub mod keeper;
pub mod material;
pub mod renew;
pub mod retire;
pub mod rotation;
pub mod secret;
pub mod stored;

pub use command::{run, CertsArgs};
pub use keeper::{
    server_config, CertFiles, CertKeeper, CertSource, SwappableCert, CA_FILE, CERT_FILE, KEY_FILE,
    TLS_VERSIONS,
};
pub use material::{
    material_from_pem, parse_certs, pem_of, provider, Authority, CertError, Issued, Material,
    DEFAULT_CA_VALIDITY, DEFAULT_CERT_VALIDITY,
};
pub use rotation::Timing;
pub use secret::{SecretCerts, DEFAULT_SECRET};
pub use stored::Names;
