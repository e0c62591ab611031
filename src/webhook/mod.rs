//! The mutating admission webhook.
//!
//! Flux consumers (Kustomization, HelmRelease, ArtifactGenerator) whose
//! source reference names a custom source are rewritten to the object
//! openflux exports for it; see [`crate::rewrite`] for the decision and
//! [`consumers`] for the table of consumers. The webhook answers from the
//! in-memory owner index only: no API call on the request path.
//!
//! [`serve`] runs it: HTTPS on `--webhook-addr` with a certificate from
//! mounted files (reloaded on change), from a Secret openflux keeps itself
//! (`--webhook-cert-secret`), or made in memory, and, with
//! `--webhook-configuration`, the CA bundle kept in those
//! MutatingWebhookConfigurations.

pub mod answer;
mod connection;
pub mod drain;
pub mod large;
pub mod limits;
pub mod metrics;
mod refused;
pub mod review;
pub mod server;

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::runtime::flags::{parse_duration, parse_go_bool, ListenAddr};
use crate::api::runtime::EventRecorder;
use crate::certs::{self, CertFiles, CertKeeper, CertSource, Names, SecretCerts, Timing};
use crate::telemetry::Readiness;

pub use server::Knowledge;

pub use crate::rewrite::mutate::decide;
pub use crate::rewrite::{Decision, Options};
pub use metrics::{register, WebhookMetrics};

/// Flags of the webhook, part of `openflux run`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct WebhookArgs {
    /// Address the HTTPS admission webhook listens on (`:9443` for every
    /// interface).
    #[arg(long, default_value = ":9443")]
    pub webhook_addr: ListenAddr,
    /// PEM certificate (chain) to serve, reloaded when it changes (a
    /// Secret made by hand or by cert-manager, mounted); without it and
    /// without --webhook-cert-secret openflux makes a CA and certificate in
    /// memory, for one replica.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA bundle clients verify --tls-cert-file with [default: ca.crt
    /// beside the certificate, else the chain's last certificate].
    #[arg(long, requires = "tls_cert_file")]
    pub tls_ca_file: Option<PathBuf>,
    /// Keep the CA and serving certificate in this Secret of openflux's
    /// namespace (default name openflux-webhook-tls): the leader creates
    /// and renews it, every replica serves from it.
    #[arg(long, value_name = "NAME", num_args = 0..=1, require_equals = true,
          default_missing_value = certs::DEFAULT_SECRET, conflicts_with = "tls_cert_file")]
    pub webhook_cert_secret: Option<String>,
    /// Validity of a CA made for --webhook-cert-secret (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "87600h", value_parser = parse_duration)]
    pub webhook_ca_validity: Duration,
    /// Validity of a serving certificate made for --webhook-cert-secret.
    #[arg(long, value_name = "DURATION", default_value = "8760h", value_parser = parse_duration)]
    pub webhook_cert_validity: Duration,
    /// Share of a certificate's validity after which it is renewed.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.67)]
    pub webhook_cert_renew_fraction: f64,
    /// DNS name of a certificate openflux makes (repeatable).
    #[arg(long = "webhook-dns-name", value_name = "NAME", default_values = ["localhost"])]
    pub webhook_dns_names: Vec<String>,
    /// IP address of a certificate openflux makes (repeatable).
    #[arg(long = "webhook-ip", value_name = "IP", default_values = ["127.0.0.1"])]
    pub webhook_ips: Vec<IpAddr>,
    /// MutatingWebhookConfiguration and ValidatingWebhookConfiguration (of
    /// each name) whose webhooks get the CA bundle of the served certificate
    /// (repeatable).
    #[arg(long, value_name = "NAME")]
    pub webhook_configuration: Vec<String>,
    /// Service (in openflux's namespace) through which the API server calls
    /// `/validate`: openflux then creates and keeps the
    /// ValidatingWebhookConfiguration named by the first
    /// --webhook-configuration, once a ready endpoint of the Service's port
    /// --validating-webhook-port serves it.
    #[arg(long, value_name = "NAME")]
    pub validating_webhook_service: Option<String>,
    /// Name of that Service's port whose target only Pods that serve
    /// `/validate` declare.
    #[arg(long, value_name = "NAME", default_value = "validate")]
    pub validating_webhook_port: String,
    /// Deny references to sources in another namespace, like Flux's flag.
    #[rustfmt::skip]
    #[arg(long, default_value = "false", action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub no_cross_namespace_refs: bool,
    /// Seconds between checks of the certificate files.
    #[arg(long, default_value_t = 5, hide = true)]
    pub tls_reload_interval_seconds: u64,
}

/// The flags' defaults: what `openflux run` has when no webhook flag is
/// given.
impl Default for WebhookArgs {
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Alone {
            #[command(flatten)]
            webhook: WebhookArgs,
        }
        <Alone as clap::Parser>::try_parse_from(["openflux"])
            .expect("every webhook flag has a default or is optional")
            .webhook
    }
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

    /// The timing of certificates kept in a Secret.
    pub fn timing(&self) -> Timing {
        Timing {
            ca_validity: self.webhook_ca_validity,
            cert_validity: self.webhook_cert_validity,
            renew_fraction: self.webhook_cert_renew_fraction,
        }
    }

    /// The options of the decision.
    pub fn options(&self) -> Options {
        Options {
            no_cross_namespace_refs: self.no_cross_namespace_refs,
        }
    }
}

/// What the webhook needs of the cluster: a client to keep the CA bundle in
/// the webhook configurations, and, for certificates kept in a Secret,
/// openflux's namespace, its readiness and its terms of leadership.
#[derive(Clone)]
pub struct InCluster {
    pub client: kube::Client,
    /// openflux's namespace, where the certificate Secret is.
    pub namespace: Option<String>,
    /// Held back until a certificate is served.
    pub readiness: Option<Arc<Readiness>>,
    /// The current term while this replica leads (cancelled when it ends).
    pub leading: Option<watch::Receiver<Option<CancellationToken>>>,
    /// Events on the certificate Secret.
    pub events: Option<EventRecorder>,
}

impl From<kube::Client> for InCluster {
    fn from(client: kube::Client) -> Self {
        InCluster {
            client,
            namespace: None,
            readiness: None,
            leading: None,
            events: None,
        }
    }
}

/// Serves the webhook on `--webhook-addr` until `shutdown` completes.
///
/// `cluster` is used to keep the CA bundle in `--webhook-configuration`
/// (without it that flag is ignored with a warning) and for
/// `--webhook-cert-secret`, which needs it. Errors when the address cannot
/// be bound, the first certificate cannot be loaded or the flags do not fit.
pub async fn serve(
    args: WebhookArgs,
    cluster: Option<InCluster>,
    knowledge: Knowledge,
    metrics: WebhookMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.webhook_addr.socket_addr())
        .await
        .with_context(|| format!("cannot listen on --webhook-addr {}", args.webhook_addr))?;
    serve_on(listener, args, cluster, knowledge, metrics, shutdown).await
}

/// [`serve`] on a listener already bound (tests bind port 0).
pub async fn serve_on(
    listener: TcpListener,
    args: WebhookArgs,
    cluster: Option<InCluster>,
    knowledge: Knowledge,
    metrics: WebhookMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let (resolver, ca_bundle) = match &args.webhook_cert_secret {
        Some(name) => from_secret(&args, name, cluster.as_ref(), &mut tasks, &stop_rx)?,
        None => {
            let keeper = CertKeeper::start(args.cert_source())
                .context("cannot load the webhook certificate")?;
            let interval = Duration::from_secs(args.tls_reload_interval_seconds.max(1));
            let found = (keeper.resolver(), keeper.ca_bundle());
            tasks.spawn(keeper.run(interval, stop_rx.clone()));
            found
        }
    };
    let tls = certs::server_config(resolver).context("cannot configure TLS")?;
    for name in &args.webhook_configuration {
        match &cluster {
            Some(cluster) => {
                use k8s_openapi::api::admissionregistration::v1 as admission;
                tasks.spawn(certs::cabundle::keep_injected::<
                    admission::MutatingWebhookConfiguration,
                >(
                    cluster.client.clone(),
                    name.clone(),
                    ca_bundle.clone(),
                    stop_rx.clone(),
                ));
                tasks.spawn(certs::cabundle::keep_injected::<
                    admission::ValidatingWebhookConfiguration,
                >(
                    cluster.client.clone(),
                    name.clone(),
                    ca_bundle.clone(),
                    stop_rx.clone(),
                ));
            }
            None => {
                tracing::warn!(configuration = %name, "no Kubernetes client: not writing the CA bundle into the webhook configuration");
            }
        }
    }
    if let Some(service) = &args.validating_webhook_service {
        let (cluster, registration) = registration_for(&args, service, cluster.as_ref())?;
        tasks.spawn(crate::registration::keep(
            cluster.client.clone(),
            registration,
            cluster.events.clone(),
            ca_bundle.clone(),
            cluster.leading.clone(),
            stop_rx.clone(),
        ));
    }
    if let Some(cluster) = &cluster {
        tasks.spawn(crate::policy::watch::run(
            cluster.client.clone(),
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

/// What `--validating-webhook-service` asks to publish, or why it cannot.
fn registration_for<'a>(
    args: &WebhookArgs,
    service: &str,
    cluster: Option<&'a InCluster>,
) -> anyhow::Result<(&'a InCluster, crate::registration::Registration)> {
    let cluster = cluster.context("--validating-webhook-service needs a Kubernetes client")?;
    let namespace = cluster.namespace.clone().context(
        "--validating-webhook-service needs openflux's namespace: pass --namespace or set RUNTIME_NAMESPACE",
    )?;
    let configuration = args.webhook_configuration.first().context(
        "--validating-webhook-service needs --webhook-configuration to name the configuration it publishes",
    )?;
    let registration = crate::registration::Registration {
        configuration: configuration.clone(),
        namespace,
        service: service.to_string(),
        port_name: args.validating_webhook_port.clone(),
    };
    Ok((cluster, registration))
}

type Served = (Arc<certs::SwappableCert>, watch::Receiver<Vec<u8>>);

/// Starts serving from the Secret `name` (every replica) and keeping it
/// (while leading); the resolver has no certificate until the Secret's is
/// loaded.
fn from_secret(
    args: &WebhookArgs,
    name: &str,
    cluster: Option<&InCluster>,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<Served> {
    let cluster = cluster.context("--webhook-cert-secret needs a Kubernetes client")?;
    let namespace = cluster.namespace.clone().context(
        "--webhook-cert-secret needs openflux's namespace: pass --namespace or set RUNTIME_NAMESPACE",
    )?;
    let timing = args.timing();
    timing
        .validate()
        .map_err(|e| anyhow::anyhow!("--webhook-cert-validity and its kin: {e}"))?;
    let secret = SecretCerts {
        namespace,
        name: name.to_string(),
        names: Names {
            dns_names: args.webhook_dns_names.clone(),
            ips: args.webhook_ips.clone(),
        },
        timing,
        configurations: args.webhook_configuration.clone(),
    };
    let resolver = Arc::new(certs::SwappableCert::default());
    let (bundle_tx, bundle_rx) = watch::channel(Vec::new());
    let (seen_tx, seen_rx) = watch::channel(0u64);
    let readiness = cluster.readiness.clone().unwrap_or_default();
    tasks.spawn(certs::secret::serve(
        cluster.client.clone(),
        secret.clone(),
        cluster.events.clone(),
        resolver.clone(),
        bundle_tx,
        readiness.serving_watch("webhook certificate Secret"),
        seen_tx,
        stop.clone(),
    ));
    match cluster.leading.clone() {
        Some(terms) => {
            tasks.spawn(certs::renew::keep(
                cluster.client.clone(),
                secret,
                cluster.events.clone(),
                terms,
                seen_rx,
                stop.clone(),
            ));
        }
        None => {
            tracing::warn!(secret = %name, "not taking part in leadership: serving the Secret, never writing it")
        }
    }
    Ok((resolver, bundle_rx))
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
        assert_eq!(
            cli.webhook.webhook_addr.socket_addr(),
            "0.0.0.0:9443".parse().unwrap()
        );
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
        assert_eq!(cli.webhook.webhook_configuration, vec!["openflux"]);
    }

    #[test]
    fn the_secret_mode_has_a_default_name_and_timings() {
        let cli = Cli::try_parse_from(["openflux"]).unwrap();
        assert_eq!(cli.webhook.webhook_cert_secret, None);
        let timing = cli.webhook.timing();
        assert_eq!(timing.ca_validity, Duration::from_secs(87600 * 3600));
        assert_eq!(timing.cert_validity, Duration::from_secs(8760 * 3600));
        timing.validate().unwrap();
        let cli = Cli::try_parse_from(["openflux", "--webhook-cert-secret"]).unwrap();
        assert_eq!(
            cli.webhook.webhook_cert_secret.as_deref(),
            Some("openflux-webhook-tls")
        );
        let cli = Cli::try_parse_from([
            "openflux",
            "--webhook-cert-secret=certs",
            "--webhook-cert-validity=30s",
            "--webhook-ca-validity=1m",
            "--webhook-configuration=a",
            "--webhook-configuration=b",
        ])
        .unwrap();
        assert_eq!(cli.webhook.webhook_cert_secret.as_deref(), Some("certs"));
        assert_eq!(cli.webhook.timing().cert_validity, Duration::from_secs(30));
        assert_eq!(cli.webhook.webhook_configuration, vec!["a", "b"]);
        // A Secret or files, not both.
        assert!(Cli::try_parse_from([
            "openflux",
            "--webhook-cert-secret",
            "--tls-cert-file=/c/tls.crt",
            "--tls-key-file=/c/tls.key",
        ])
        .is_err());
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
