//! openflux-http-source: the HttpSource controller shipped with openflux.
//!
//! It is written the way any third-party source is: it uses nothing of
//! openflux but `openflux-api`, the Artifact API with its producer kit
//! (packing, storage, publishing) and its runtime kit (Flux's flags, logs,
//! metrics, events and leader election). It fetches URLs on an interval,
//! stores normalized artifacts, serves them over HTTP and publishes each as
//! an `Artifact` owned by its HttpSource.

mod api;
mod archive;
mod artifact;
mod context;
mod controller;
mod credentials;
mod fetch;
mod guard;
mod heal;
mod http;
mod metrics;
mod netpolicy;
mod plan;
mod reconcile;
mod redact;
mod redirect;
mod report;
mod schedule;
mod serve;
mod status;
mod transport;
mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::Reporter;
use kube::CustomResourceExt;
use openflux_api::producer::archive::IgnoreRules;
use openflux_api::producer::storage::{Retention, Storage};
use openflux_api::runtime::events::{Notifier, RetryPolicy};
use openflux_api::runtime::flags::{parse_duration, ListenAddr, RuntimeArgs};
use openflux_api::runtime::health::serve;
use openflux_api::runtime::leader::{lease_name, Elector};
use openflux_api::runtime::{logging, metrics as flux_metrics};
use openflux_api::runtime::{ControllerId, EventRecorder, Health, Metrics};
use openflux_api::spiffe::{self as flux_spiffe, MtlsMetrics, SpiffeArgs};
use prometheus_client::registry::Registry;
use tracing::info;

use crate::context::{Context, Parts, FIELD_MANAGER};
use crate::controller::Watch;
use crate::guard::Guard;
use crate::metrics::SourceMetrics;
use crate::netpolicy::{Cidr, NetworkPolicy};
use crate::serve::Catalog;

/// `openflux-http-source --version`: the release and the commit it was
/// built from (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OPENFLUX_BUILD_COMMIT"),
    ")"
);

/// The HttpSource controller: fetches tar.gz archives or YAML files over
/// HTTP(S) and publishes them as openflux Artifacts.
/// A flag given twice takes its last value, so that extra arguments (the
/// chart's `extraArgs`) override the shipped ones.
#[derive(Parser, Debug)]
#[command(name = "openflux-http-source", version = VERSION, args_override_self = true)]
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
    /// Flux's controller flags.
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Directory artifacts are stored in.
    #[arg(long, default_value = "/data")]
    storage_path: PathBuf,
    /// Serving artifacts over SPIFFE mutual TLS.
    #[command(flatten)]
    spiffe: SpiffeArgs,
    /// Address the artifact server listens on.
    #[arg(long, default_value = ":9090")]
    storage_addr: ListenAddr,
    /// `host[:port]` advertised in artifact URLs (default: this host's name
    /// and the port of --storage-addr).
    #[arg(long, default_value = "")]
    storage_adv_addr: String,
    /// How long superseded artifacts stay downloadable (Go duration).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    artifact_retention_ttl: Duration,
    /// Artifacts kept per source, the current one included.
    #[arg(long, default_value_t = 2)]
    artifact_retention_records: usize,
    /// Largest artifact accepted, in decompressed bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_SIZE)]
    max_artifact_size: u64,
    /// How long a fetch waits for the server to send anything (the
    /// response, or the next bytes of its body) before it fails, whatever
    /// the HttpSource's timeout (Go duration, more than 0s).
    #[arg(long, default_value = "30s", value_parser = parse_stall_timeout)]
    fetch_stall_timeout: Duration,
    /// Address ranges HttpSources may be fetched from although they are
    /// refused by default (loopback, private, link-local, CGNAT, ...), e.g.
    /// `10.0.0.0/8` or `192.168.1.10/32`; repeat the flag or separate
    /// ranges with commas. Cluster-internal names are fetched only when all
    /// their addresses are allowed. The Kubernetes API server never is.
    #[arg(
        long = "allow-network",
        value_name = "CIDR",
        value_delimiter = ',',
        value_parser = parse_cidr
    )]
    allow_network: Vec<Cidr>,
}

fn parse_cidr(s: &str) -> Result<Cidr, netpolicy::InvalidCidr> {
    s.parse()
}

fn parse_stall_timeout(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be more than 0s".into()),
        d => Ok(d),
    }
}

/// The HttpSource CRD as YAML, as committed in `manifests/http-source/crd.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(&api::HttpSource::crd())
}

/// The advertised storage address, Flux's way: the flag when set, else
/// this host's name with the listen port.
fn advertised_addr(flag: &str, listen_port: u16) -> String {
    if !flag.is_empty() {
        return flag.to_string();
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{listen_port}")
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

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let flux = &args.runtime;
    logging::init(&flux.log)?;
    // reqwest and kube share the process-wide rustls provider: ring.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let namespace = flux.watch.watched_namespace()?.map(str::to_string);
    let retention = Retention {
        ttl: args.artifact_retention_ttl,
        records: args.artifact_retention_records.max(1),
    };
    std::fs::create_dir_all(&args.storage_path)
        .with_context(|| format!("creating storage path {:?}", args.storage_path))?;
    let mtls = args.spiffe.settings()?;
    let mut storage = Storage::new(
        &args.storage_path,
        advertised_addr(&args.storage_adv_addr, args.storage_addr.port()),
    );
    if mtls.is_some() {
        storage = storage.https();
    }

    let client = kube_client(args.kubeconfig.as_ref()).await?;
    // Fetches go through the network policy; the API server's address is
    // the one a pod is given.
    let api_server = std::env::var("KUBERNETES_SERVICE_HOST").ok();
    let policy = NetworkPolicy::new(args.allow_network.clone(), api_server);
    let allowed: Vec<String> = policy.allowed().iter().map(Cidr::to_string).collect();
    info!(allowed = %allowed.join(","), "fetching from public addresses and the allowed networks only");
    let fetches = http::Http::new(Guard::new(policy), args.fetch_stall_timeout)?;
    // Events go to notification-controller, inside the cluster: not a fetch.
    let http = reqwest::Client::builder()
        .user_agent(concat!("openflux-http-source/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")?;
    let reporter = Reporter {
        controller: FIELD_MANAGER.to_string(),
        instance: std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok(),
    };
    let notifier = flux.events_url().map(|url| {
        info!(%url, "posting events to notification-controller");
        Notifier::spawn(url, http.clone(), RetryPolicy::default())
    });
    let events = EventRecorder::new(client.clone(), reporter, notifier);

    let mut registry = Registry::default();
    let controller_metrics = Metrics::register(&mut registry)
        .controller(&ControllerId::of::<api::HttpSource>(), flux.concurrent);
    let source_metrics = SourceMetrics::register(&mut registry);
    let health = Health::default();

    let catalog = Arc::new(Catalog::default());
    let artifacts = serve::router(&storage, catalog.clone());
    match mtls {
        None => {
            serve("artifact", args.storage_addr.socket_addr(), artifacts).await?;
        }
        Some(mtls) => {
            info!(
                endpoint = %mtls.endpoint,
                "waiting for this controller's X.509-SVID from the SPIFFE Workload API"
            );
            let source = flux_spiffe::connect(&mtls.endpoint, mtls.initial_timeout).await?;
            let own = flux_spiffe::own_id(&source).map(|id| id.to_string());
            info!(
                spiffe_id = own.as_deref().unwrap_or("<none>"),
                authorized = %mtls.clients.describe(),
                "artifact server will use mTLS via SPIFFE"
            );
            let metrics = MtlsMetrics::register(&mut registry);
            let config = flux_spiffe::server_config(source, mtls.clients, metrics.clone())?;
            let addr = args.storage_addr.socket_addr();
            flux_spiffe::serve_tls("artifact", addr, artifacts, config, metrics).await?;
        }
    }
    serve(
        "metrics",
        flux.metrics_addr.socket_addr(),
        flux_metrics::router(registry),
    )
    .await?;
    serve("health", flux.health_addr.socket_addr(), health.router()).await?;
    info!(
        storage = %args.storage_path.display(),
        namespace = namespace.as_deref().unwrap_or("<all>"),
        "starting the HttpSource controller"
    );

    let ctx = Arc::new(Context::new(Parts {
        client: client.clone(),
        http: fetches,
        storage,
        storage_root: args.storage_path.clone(),
        catalog,
        events,
        metrics: controller_metrics,
        source_metrics,
        max_size: args.max_artifact_size,
        retention,
        retry: flux.retry,
        workers: workers::Workers::new(
            usize::from(flux.concurrent),
            workers::share(usize::from(flux.concurrent), namespace.is_some()),
        ),
    }));
    let watch = Watch {
        namespace,
        config: flux.watch.watcher_config(),
    };
    let controller = controller::run(ctx, health, watch);
    if flux.leader_election.enable_leader_election {
        flux.leader_election.validate()?;
        let lease_namespace = flux.watch.runtime_namespace()?;
        let elector = Elector::new(
            client,
            lease_namespace,
            &lease_name(FIELD_MANAGER),
            &flux.leader_election,
        );
        info!(
            identity = elector.identity(),
            "attempting to acquire the leader lease"
        );
        elector.run(controller).await?;
    } else {
        controller.await;
    }
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use openflux_api::runtime::flags::{LogEncoding, LogLevel};

    #[test]
    fn every_flag_takes_fluxs_forms() {
        use clap::CommandFactory;
        let not_listen = ["events-addr", "storage-adv-addr"];
        let problems =
            openflux_api::runtime::flags::flag_form_problems(&Cli::command(), &not_listen);
        assert_eq!(problems, Vec::<String>::new());
    }

    #[test]
    fn advertises_the_flag_or_the_host_name() {
        assert_eq!(advertised_addr("svc.ns:80", 9090), "svc.ns:80");
        assert!(advertised_addr("", 9090).ends_with(":9090"));
    }

    /// The shipped Deployment passes flags this binary accepts, and exposes
    /// the ports it listens on.
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
        let run = &cli.run;
        assert_eq!(run.storage_path, PathBuf::from("/data"));
        assert!(run.storage_adv_addr.starts_with("openflux-http-source."));
        assert!(run.runtime.leader_election.enable_leader_election);
        assert!(run.runtime.watch.watch_all_namespaces);
        assert_eq!(run.runtime.log.log_encoding, LogEncoding::Json);
        assert_eq!(run.runtime.log.log_level, LogLevel::Info);
        let ports: Vec<i64> = container["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|p| p["containerPort"].as_i64().unwrap())
            .collect();
        for addr in [
            &run.storage_addr,
            &run.runtime.metrics_addr,
            &run.runtime.health_addr,
        ] {
            assert!(ports.contains(&(addr.port() as i64)), "{addr}");
        }
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let cli = Cli::try_parse_from([
            "openflux-http-source",
            "--log-level=info",
            "--concurrent=4",
            "--fetch-stall-timeout=30s",
            "--log-level=debug",
            "--concurrent=2",
            "--fetch-stall-timeout=1m",
        ])
        .unwrap();
        let flux = &cli.run.runtime;
        assert_eq!(
            flux.log.log_level,
            openflux_api::runtime::flags::LogLevel::Debug
        );
        assert_eq!(flux.concurrent, 2);
        assert_eq!(cli.run.fetch_stall_timeout, Duration::from_secs(60));
    }

    #[test]
    fn flags_follow_flux_conventions() {
        let cli = Cli::try_parse_from([
            "openflux-http-source",
            "--watch-all-namespaces=false",
            "--namespace",
            "flux-system",
            "--concurrent=2",
            "--log-encoding=console",
            "--events-addr=http://notification-controller.flux-system.svc.cluster.local./",
        ])
        .unwrap();
        let flux = &cli.run.runtime;
        assert!(!flux.watch.watch_all_namespaces);
        assert_eq!(flux.watch.watched_namespace().unwrap(), Some("flux-system"));
        assert_eq!(flux.concurrent, 2);
        assert_eq!(flux.log.log_encoding, LogEncoding::Console);
        assert!(flux.events_url().is_some());
        let cli = Cli::try_parse_from(["openflux-http-source", "--watch-all-namespaces"]).unwrap();
        assert!(cli.run.runtime.watch.watch_all_namespaces);
        assert_eq!(cli.run.max_artifact_size, 50 * 1024 * 1024);
        assert_eq!(cli.run.artifact_retention_ttl, Duration::from_secs(60));
        assert_eq!(cli.run.fetch_stall_timeout, Duration::from_secs(30));
        let cli =
            Cli::try_parse_from(["openflux-http-source", "--fetch-stall-timeout=2m"]).unwrap();
        assert_eq!(cli.run.fetch_stall_timeout, Duration::from_secs(120));
        assert!(Cli::try_parse_from(["openflux-http-source", "--fetch-stall-timeout=0s"]).is_err());
        assert!(Cli::try_parse_from(["openflux-http-source", "--log-json"]).is_err());
        assert!(
            Cli::try_parse_from(["openflux-http-source", "--artifact-retention-ttl=1d"]).is_err()
        );
        let cli = Cli::try_parse_from(["openflux-http-source", "crds"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Crds)));
    }

    /// The SPIFFE flags are the controller's: off by default (plain HTTP),
    /// on with an authorized client and a socket; a bad ID is refused.
    #[test]
    fn spiffe_flags_turn_the_artifact_server_to_mtls() {
        let cli = Cli::try_parse_from(["openflux-http-source"]).unwrap();
        assert!(cli.run.spiffe.settings().unwrap().is_none());
        let cli = Cli::try_parse_from([
            "openflux-http-source",
            "--authorized-artifact-client-spiffe-id=spiffe://self/ns/flux-system/",
            "--authorized-artifact-client-spiffe-id=spiffe://td.example/ns/flux-system/sa/helm-controller",
            "--spiffe-endpoint-socket=/run/spire/sockets/agent.sock",
        ])
        .unwrap();
        let mtls = cli.run.spiffe.settings().unwrap().unwrap();
        assert_eq!(mtls.endpoint, "unix:///run/spire/sockets/agent.sock");
        assert!(mtls
            .clients
            .authorizes(Some("td.example"), "td.example", "/ns/flux-system/sa/kc"));
        let err = Cli::try_parse_from([
            "openflux-http-source",
            "--authorized-artifact-client-spiffe-id=spiffe://td.example/../x",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("invalid SPIFFE ID"), "{err}");
    }

    /// `--allow-network` takes ranges, repeated or comma-separated; nothing
    /// is allowed by default, and a bad range is refused at start.
    #[test]
    fn allow_network_takes_ranges() {
        let cli = Cli::try_parse_from(["openflux-http-source"]).unwrap();
        assert!(cli.run.allow_network.is_empty());
        assert!(!cli.run.runtime.leader_election.enable_leader_election);
        let cli = Cli::try_parse_from([
            "openflux-http-source",
            "--allow-network=127.0.0.1/32,10.0.0.0/8",
            "--allow-network",
            "fd00::/8",
        ])
        .unwrap();
        let ranges: Vec<String> = cli.run.allow_network.iter().map(Cidr::to_string).collect();
        assert_eq!(ranges, ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]);
        let err = Cli::try_parse_from(["openflux-http-source", "--allow-network=10.0.0.0/40"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid network"), "{err}");
    }
}
