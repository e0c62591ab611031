//! openflux-http-source: the HttpSource controller shipped with openflux.
//!
//! It is written the way any third-party source is: it uses nothing of
//! openflux but the public Artifact API (the `openflux-api` crate). It fetches URLs
//! on an interval, stores normalized artifacts, serves them over HTTP and
//! publishes each as an `Artifact` owned by its HttpSource.

mod api;
mod archive;
mod controller;
mod fetch;
mod metrics;
mod schedule;
mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgAction, Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::Reporter;
use kube::CustomResourceExt;
use tracing::info;
use tracing_subscriber::EnvFilter;

use crate::controller::Context;
use crate::metrics::{Health, Metrics};
use openflux_api::duration;
use openflux_api::producer::archive::IgnoreRules;
use openflux_api::producer::storage::{Retention, Storage};

/// The HttpSource controller: fetches tar.gz archives or YAML files over
/// HTTP(S) and publishes them as openflux Artifacts.
#[derive(Parser, Debug)]
#[command(name = "openflux-http-source", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the HttpSource CustomResourceDefinition as YAML.
    Crds,
    /// Print the digest the controller would publish for a local file (a
    /// tar.gz, a tar or a YAML file), for use in `spec.digest`.
    Digest {
        /// The file.
        file: PathBuf,
        /// The URL the file will be served from (names a single YAML file
        /// in the artifact; defaults to the file's own name).
        #[arg(long)]
        url: Option<String>,
        /// The `spec.ignore` patterns (Flux's defaults when unset).
        #[arg(long)]
        ignore: Option<String>,
        /// Largest artifact accepted, in decompressed bytes.
        #[arg(long, default_value_t = DEFAULT_MAX_SIZE)]
        max_artifact_size: u64,
    },
}

const DEFAULT_MAX_SIZE: u64 = 50 * 1024 * 1024;

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Path to a kubeconfig. Without it, KUBECONFIG, ~/.kube/config or the
    /// in-cluster configuration are used, in that order.
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Number of HttpSources reconciled at the same time.
    #[arg(long, default_value_t = 4)]
    concurrent: u16,
    /// Address of the Prometheus metrics endpoint (`/metrics`).
    #[arg(long, default_value = ":8080")]
    metrics_addr: String,
    /// Address of the health endpoints (`/healthz`, `/readyz`).
    #[arg(long, default_value = ":9440")]
    health_addr: String,
    /// Log level: trace, debug, info, warn or error.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    /// Watch HttpSources in all namespaces; when false, only in --namespace.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    watch_all_namespaces: bool,
    /// The namespace watched when --watch-all-namespaces=false.
    #[arg(long, env = "RUNTIME_NAMESPACE")]
    namespace: Option<String>,
    /// Directory artifacts are stored in.
    #[arg(long, default_value = "/data")]
    storage_path: PathBuf,
    /// Address the artifact server listens on.
    #[arg(long, default_value = ":9090")]
    storage_addr: String,
    /// `host[:port]` advertised in artifact URLs (default: this host's name
    /// and the port of --storage-addr).
    #[arg(long, default_value = "")]
    storage_adv_addr: String,
    /// How long superseded artifacts stay downloadable (Go duration).
    #[arg(long, default_value = "60s")]
    artifact_retention_ttl: String,
    /// Artifacts kept per source, the current one included.
    #[arg(long, default_value_t = 2)]
    artifact_retention_records: usize,
    /// Largest artifact accepted, in decompressed bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_SIZE)]
    max_artifact_size: u64,
}

/// The HttpSource CRD as YAML, as committed in `manifests/http-source/crd.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(&api::HttpSource::crd())
}

/// Parses a listen address; `:port` means all interfaces, as in Go.
fn listen_addr(addr: &str) -> anyhow::Result<SocketAddr> {
    let full = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    };
    full.parse()
        .with_context(|| format!("invalid listen address {addr:?}"))
}

/// The advertised storage address, Flux's way: the flag when set, else
/// this host's name with the listen port.
fn advertised_addr(flag: &str, listen: &SocketAddr) -> String {
    if !flag.is_empty() {
        return flag.to_string();
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", listen.port())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crds) => {
            print!("{}", crd_yaml()?);
            Ok(())
        }
        Some(Command::Digest {
            file,
            url,
            ignore,
            max_artifact_size,
        }) => {
            let bytes = std::fs::read(&file).with_context(|| format!("reading {file:?}"))?;
            let url_path = url
                .as_deref()
                .and_then(|u| reqwest::Url::parse(u).ok())
                .map(|u| u.path().to_string())
                .unwrap_or_else(|| file.to_string_lossy().into_owned());
            let rules = IgnoreRules::parse(ignore.as_deref()).map_err(anyhow::Error::msg)?;
            let packed = archive::build(&bytes, &url_path, &rules, max_artifact_size)?;
            println!("{}", packed.digest);
            Ok(())
        }
        None => run(cli.run).await,
    }
}

fn init_logging(args: &RunArgs) -> anyhow::Result<()> {
    let level = args.log_level.to_ascii_lowercase();
    if !["trace", "debug", "info", "warn", "error"].contains(&level.as_str()) {
        anyhow::bail!("invalid --log-level {level:?}: use trace, debug, info, warn or error");
    }
    // The HTTP and TLS plumbing stays at info when the controller is more verbose.
    let quiet = [
        "hyper_util",
        "h2",
        "tower",
        "rustls",
        "globset",
        "kube_client",
    ]
    .map(|c| format!(",{c}=info"))
    .concat();
    let directives = if matches!(level.as_str(), "trace" | "debug") {
        format!("{level}{quiet}")
    } else {
        level
    };
    let filter = EnvFilter::try_new(&directives).context("building the log filter")?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if args.log_json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
    Ok(())
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {path:?}"))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn serve(name: &'static str, addr: SocketAddr, router: axum::Router) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {name} server to {addr}"))?;
    info!(%addr, "{name} server listening");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "{name} server stopped");
        }
    });
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(&args)?;
    // reqwest and kube share the process-wide rustls provider: ring.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let namespace = if args.watch_all_namespaces {
        None
    } else {
        Some(
            args.namespace
                .clone()
                .context("--watch-all-namespaces=false needs --namespace (or RUNTIME_NAMESPACE)")?,
        )
    };
    let ttl = duration::parse(&args.artifact_retention_ttl).context("--artifact-retention-ttl")?;
    let retention = Retention {
        ttl,
        records: args.artifact_retention_records.max(1),
    };
    let storage_addr = listen_addr(&args.storage_addr)?;
    let metrics_addr = listen_addr(&args.metrics_addr)?;
    let health_addr = listen_addr(&args.health_addr)?;
    std::fs::create_dir_all(&args.storage_path)
        .with_context(|| format!("creating storage path {:?}", args.storage_path))?;
    let storage = Storage::new(
        &args.storage_path,
        advertised_addr(&args.storage_adv_addr, &storage_addr),
    );

    let client = kube_client(args.kubeconfig.as_ref()).await?;
    let http = reqwest::Client::builder()
        .user_agent(concat!("openflux-http-source/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let reporter = Reporter {
        controller: controller::FIELD_MANAGER.to_string(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let metrics = Arc::new(Metrics::default());
    let health = Health::default();

    serve("artifact", storage_addr, storage.router()).await?;
    serve("metrics", metrics_addr, metrics.router()).await?;
    serve("health", health_addr, health.router()).await?;
    info!(
        storage = %args.storage_path.display(),
        namespace = namespace.as_deref().unwrap_or("<all>"),
        "starting the HttpSource controller"
    );

    let ctx = Arc::new(Context::new(
        client,
        http,
        storage,
        reporter,
        metrics,
        args.max_artifact_size,
        retention,
    ));
    controller::run(ctx, health, namespace, args.concurrent).await;
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_listen_addresses() {
        assert_eq!(
            listen_addr(":9090").unwrap(),
            "0.0.0.0:9090".parse().unwrap()
        );
        assert_eq!(
            listen_addr("127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert!(listen_addr("nope").is_err());
        let listen = "0.0.0.0:9090".parse().unwrap();
        assert_eq!(advertised_addr("svc.ns:80", &listen), "svc.ns:80");
    }

    /// The shipped Deployment passes flags this binary accepts.
    #[test]
    fn the_deployment_args_parse() {
        let deployment: serde_yaml_ng::Value = serde_yaml_ng::from_str(include_str!(
            "../../../manifests/http-source/deployment.yaml"
        ))
        .unwrap();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<String> = container["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let cli =
            Cli::try_parse_from(std::iter::once("openflux-http-source".to_string()).chain(args))
                .unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.storage_path, PathBuf::from("/data"));
        assert!(cli
            .run
            .storage_adv_addr
            .starts_with("openflux-http-source."));
        let ports: Vec<i64> = container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].as_i64().unwrap())
            .collect();
        for addr in [
            &cli.run.storage_addr,
            &cli.run.metrics_addr,
            &cli.run.health_addr,
        ] {
            assert!(
                ports.contains(&(listen_addr(addr).unwrap().port() as i64)),
                "{addr}"
            );
        }
    }

    #[test]
    fn flags_follow_flux_conventions() {
        let cli = Cli::try_parse_from([
            "openflux-http-source",
            "--watch-all-namespaces=false",
            "--namespace",
            "flux-system",
            "--concurrent=2",
        ])
        .unwrap();
        assert!(!cli.run.watch_all_namespaces);
        assert_eq!(cli.run.concurrent, 2);
        let cli = Cli::try_parse_from(["openflux-http-source", "--watch-all-namespaces"]).unwrap();
        assert!(cli.run.watch_all_namespaces);
        assert_eq!(cli.run.max_artifact_size, 50 * 1024 * 1024);
        let cli = Cli::try_parse_from(["openflux-http-source", "crds"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Crds)));
    }
}
