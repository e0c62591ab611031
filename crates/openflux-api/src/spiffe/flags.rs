//! The flags of an artifact server that requires SPIFFE mutual TLS, named
//! as source-controller names them.

use std::time::Duration;

use super::ids::{AuthorizedIds, IdPattern};

/// Environment variable of the Workload API socket, as go-spiffe (and so
/// every Flux controller) reads it.
pub const ENDPOINT_ENV: &str = "SPIFFE_ENDPOINT_SOCKET";

/// Serving artifacts over SPIFFE mTLS. Off unless at least one
/// `--authorized-artifact-client-spiffe-id` is given, as in Flux.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpiffeArgs {
    /// SPIFFE ID authorized to fetch artifacts from the artifact server
    /// (exact, `spiffe://<trust domain>` for a whole trust domain, a
    /// trailing `/` for a prefix, `spiffe://self/...` for this process's
    /// own trust domain). Can be repeated; any one turns the artifact
    /// server to HTTPS with mutual TLS and https artifact URLs.
    #[arg(
        long = "authorized-artifact-client-spiffe-id",
        value_name = "SPIFFE_ID"
    )]
    pub authorized_artifact_client_spiffe_id: Vec<IdPattern>,
    /// The SPIFFE Workload API socket the X.509-SVID and trust bundles are
    /// read from (`unix:///path`, or an absolute path).
    #[arg(long, env = ENDPOINT_ENV, value_name = "ADDRESS")]
    pub spiffe_endpoint_socket: Option<String>,
    /// How long to wait at start for the first X.509-SVID.
    #[arg(long, default_value = "2m", value_parser = crate::runtime::flags::parse_duration)]
    pub spiffe_initial_timeout: Duration,
}

/// What the flags ask for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MtlsSettings {
    /// The Workload API endpoint, as the SPIFFE endpoint syntax writes it.
    pub endpoint: String,
    pub clients: AuthorizedIds,
    pub initial_timeout: Duration,
}

/// Flags that do not make a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "--authorized-artifact-client-spiffe-id needs the SPIFFE Workload API socket: \
         set --spiffe-endpoint-socket or {ENDPOINT_ENV}"
    )]
    NoEndpoint,
    #[error(
        "invalid SPIFFE Workload API socket {0:?}: use unix:///absolute/path or an absolute path"
    )]
    BadEndpoint(String),
}

impl SpiffeArgs {
    /// `None` when mTLS is off (no authorized client).
    pub fn settings(&self) -> Result<Option<MtlsSettings>, SettingsError> {
        if self.authorized_artifact_client_spiffe_id.is_empty() {
            return Ok(None);
        }
        let raw = self
            .spiffe_endpoint_socket
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or(SettingsError::NoEndpoint)?;
        Ok(Some(MtlsSettings {
            endpoint: endpoint(raw)?,
            clients: AuthorizedIds::new(self.authorized_artifact_client_spiffe_id.clone()),
            initial_timeout: self.spiffe_initial_timeout,
        }))
    }
}

/// A unix socket address in the SPIFFE endpoint syntax: `unix:///path`
/// and `unix:/path` as given, a bare absolute path made `unix://`.
fn endpoint(raw: &str) -> Result<String, SettingsError> {
    let path = raw
        .strip_prefix("unix://")
        .or_else(|| raw.strip_prefix("unix:"))
        .unwrap_or(raw);
    if !path.starts_with('/') || path.contains('\0') || path.contains('?') || path.contains('#') {
        return Err(SettingsError::BadEndpoint(raw.to_string()));
    }
    Ok(format!("unix://{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spiffe: SpiffeArgs,
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
    }

    #[test]
    fn off_without_an_authorized_client() {
        let cli = parse(&["--spiffe-endpoint-socket=/run/spire/agent.sock"]).unwrap();
        assert_eq!(cli.spiffe.settings().unwrap(), None);
    }

    #[test]
    fn repeated_ids_and_a_socket_make_settings() {
        let cli = parse(&[
            "--authorized-artifact-client-spiffe-id=spiffe://td.example/kc",
            "--authorized-artifact-client-spiffe-id",
            "spiffe://self/flux/",
            "--spiffe-endpoint-socket=/run/spire/agent.sock",
            "--spiffe-initial-timeout=5s",
        ])
        .unwrap();
        let settings = cli.spiffe.settings().unwrap().unwrap();
        assert_eq!(settings.endpoint, "unix:///run/spire/agent.sock");
        assert_eq!(
            settings.clients.describe(),
            "spiffe://td.example/kc,spiffe://self/flux/"
        );
        assert_eq!(settings.initial_timeout, Duration::from_secs(5));
        assert!(settings
            .clients
            .authorizes(Some("own.example"), "own.example", "/flux/kc"));
    }

    #[test]
    fn bad_flags_are_refused_with_the_reason() {
        let err = parse(&["--authorized-artifact-client-spiffe-id=spiffe://TD/x"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("lower-case"), "{err}");
        let cli = parse(&["--authorized-artifact-client-spiffe-id=spiffe://td.example/x"]).unwrap();
        // SPIFFE_ENDPOINT_SOCKET may be set in the environment of the test.
        if std::env::var_os(ENDPOINT_ENV).is_none() {
            assert_eq!(cli.spiffe.settings(), Err(SettingsError::NoEndpoint));
        }
        for bad in [
            "relative/agent.sock",
            "tcp://127.0.0.1:8081",
            "unix://",
            "unix:rel",
        ] {
            let mut args = cli.spiffe.clone();
            args.spiffe_endpoint_socket = Some(bad.to_string());
            let err = args.settings().unwrap_err();
            assert_eq!(err, SettingsError::BadEndpoint(bad.to_string()), "{bad}");
        }
        for (given, want) in [
            ("unix:///a/b.sock", "unix:///a/b.sock"),
            ("unix:/a/b.sock", "unix:///a/b.sock"),
            ("/a/b.sock", "unix:///a/b.sock"),
        ] {
            let mut args = cli.spiffe.clone();
            args.spiffe_endpoint_socket = Some(given.to_string());
            assert_eq!(args.settings().unwrap().unwrap().endpoint, want);
        }
    }
}
