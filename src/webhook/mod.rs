//! The mutating admission webhook.
//!
//! Flux consumers (Kustomization, HelmRelease, ArtifactGenerator) whose
//! source reference names a custom source are rewritten to the object
//! openflux exports for it; see [`rewrite`] for the decision and
//! [`consumers`] for the table of consumers. The webhook answers from the
//! in-memory owner index only: no API call on the request path.
//!
//! [`serve`] runs it: HTTPS on `--webhook-addr` with a certificate from
//! mounted files (reloaded on change) or made in memory, and, with
//! `--webhook-configuration`, the CA bundle kept in that
//! MutatingWebhookConfiguration.

pub mod answer;
pub mod cabundle;
pub mod decision;
pub mod large;
pub mod limits;
pub mod metrics;
pub mod review;
pub mod rewrite;
pub mod server;
pub mod validate;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::certs::{self, CertFiles, CertKeeper, CertSource};

pub use server::Knowledge;

pub use decision::{Decision, Options};
pub use metrics::{register, WebhookMetrics};
pub use rewrite::decide;

/// Flags of the webhook, part of `openflux run`.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct WebhookArgs {
    /// Address the HTTPS admission webhook listens on.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// PEM certificate (chain) to serve, reloaded when it changes; without it
    /// openflux makes a CA and certificate in memory.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA bundle clients verify --tls-cert-file with [default: ca.crt
    /// beside the certificate, else the chain's last certificate].
    #[arg(long, requires = "tls_cert_file")]
    pub tls_ca_file: Option<PathBuf>,
    /// DNS name of the in-memory certificate (repeatable).
    #[arg(long = "webhook-dns-name", value_name = "NAME", default_values = ["localhost"])]
    pub webhook_dns_names: Vec<String>,
    /// IP address of the in-memory certificate (repeatable).
    #[arg(long = "webhook-ip", value_name = "IP", default_values = ["127.0.0.1"])]
    pub webhook_ips: Vec<IpAddr>,
    /// MutatingWebhookConfiguration and ValidatingWebhookConfiguration (of
    /// this one name) whose webhooks get the CA bundle of the served
    /// certificate.
    #[arg(long, value_name = "NAME")]
    pub webhook_configuration: Option<String>,
    /// Deny references to sources in another namespace, like Flux's flag.
    #[arg(long)]
    pub no_cross_namespace_refs: bool,
    /// Seconds between checks of the certificate files.
    #[arg(long, default_value_t = 5, hide = true)]
    pub tls_reload_interval_seconds: u64,
}

impl WebhookArgs {
    /// Where the certificate comes from.
    pub fn cert_source(&self) -> CertSource {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => CertSource::Files(CertFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: self.tls_ca_file.clone(),
            }),
            _ => CertSource::InMemory {
                dns_names: self.webhook_dns_names.clone(),
                ips: self.webhook_ips.clone(),
            },
        }
    }

    /// The options of the decision.
    pub fn options(&self) -> Options {
        Options {
            no_cross_namespace_refs: self.no_cross_namespace_refs,
        }
    }
}

/// Serves the webhook on `--webhook-addr` until `shutdown` completes.
///
/// `client` is used only to keep the CA bundle in `--webhook-configuration`;
/// without a client that flag is ignored with a warning. Errors only when the
/// address cannot be bound or the first certificate cannot be loaded.
pub async fn serve(
    args: WebhookArgs,
    client: Option<kube::Client>,
    knowledge: Knowledge,
    metrics: WebhookMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.webhook_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.webhook_addr))?;
    serve_on(listener, args, client, knowledge, metrics, shutdown).await
}

/// [`serve`] on a listener already bound (tests bind port 0).
pub async fn serve_on(
    listener: TcpListener,
    args: WebhookArgs,
    client: Option<kube::Client>,
    knowledge: Knowledge,
    metrics: WebhookMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let keeper =
        CertKeeper::start(args.cert_source()).context("cannot load the webhook certificate")?;
    let tls = certs::server_config(keeper.resolver()).context("cannot configure TLS")?;
    let (stop_tx, stop_rx) = watch::channel(false);

    let ca_bundle = keeper.ca_bundle();
    let interval = Duration::from_secs(args.tls_reload_interval_seconds.max(1));
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(keeper.run(interval, stop_rx.clone()));
    match (&args.webhook_configuration, client.clone()) {
        (Some(name), Some(client)) => {
            use k8s_openapi::api::admissionregistration::v1 as admission;
            tasks.spawn(cabundle::keep_injected::<
                admission::MutatingWebhookConfiguration,
            >(
                client.clone(),
                name.clone(),
                ca_bundle.clone(),
                stop_rx.clone(),
            ));
            tasks.spawn(cabundle::keep_injected::<
                admission::ValidatingWebhookConfiguration,
            >(
                client, name.clone(), ca_bundle, stop_rx.clone()
            ));
        }
        (Some(name), None) => {
            tracing::warn!(configuration = %name, "no Kubernetes client: not writing the CA bundle into the webhook configuration");
        }
        (None, _) => {}
    }
    if let Some(client) = &client {
        tasks.spawn(crate::policy::watch::run(
            client.clone(),
            knowledge.policies.clone(),
            knowledge.readiness.clone(),
            stop_rx.clone(),
        ));
    }

    let app = server::router(server::AppState::new(knowledge, metrics, args.options()));
    tracing::info!(
        addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "serving the admission webhook"
    );
    server::serve_tls(listener, Arc::new(tls), app, shutdown).await;
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        webhook: WebhookArgs,
    }

    #[test]
    fn flags_and_defaults() {
        let cli = Cli::try_parse_from(["openflux"]).unwrap();
        assert_eq!(cli.webhook.webhook_addr, "0.0.0.0:9443".parse().unwrap());
        assert_eq!(cli.webhook.webhook_dns_names, vec!["localhost"]);
        assert_eq!(
            cli.webhook.webhook_ips,
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert!(matches!(
            cli.webhook.cert_source(),
            CertSource::InMemory { .. }
        ));
        let cli = Cli::try_parse_from([
            "openflux",
            "--tls-cert-file",
            "/c/tls.crt",
            "--tls-key-file",
            "/c/tls.key",
            "--webhook-configuration",
            "openflux",
            "--no-cross-namespace-refs",
            "--webhook-dns-name",
            "a",
            "--webhook-dns-name",
            "b",
        ])
        .unwrap();
        assert!(cli.webhook.options().no_cross_namespace_refs);
        assert_eq!(cli.webhook.webhook_dns_names, vec!["a", "b"]);
        assert_eq!(
            cli.webhook.cert_source(),
            CertSource::Files(CertFiles {
                cert: "/c/tls.crt".into(),
                key: "/c/tls.key".into(),
                ca: None
            })
        );
        assert!(Cli::try_parse_from(["openflux", "--tls-cert-file", "/c/tls.crt"]).is_err());
    }

    /// `openflux run` spawns the webhook beside the controllers.
    #[test]
    fn serve_can_be_spawned() {
        fn spawnable<T: Future + Send + 'static>(_: &T) {}
        let cli = Cli::try_parse_from(["openflux"]).unwrap();
        let future = serve(
            cli.webhook,
            None,
            Knowledge::default(),
            WebhookMetrics::default(),
            async {},
        );
        spawnable(&future);
    }
}
