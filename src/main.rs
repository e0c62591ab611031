//! The `openflux` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc: with thousands of cached objects made and dropped by the
/// watches, it keeps the process about a tenth smaller than the system
/// allocator (docs/benchmarks.md, "Where the memory goes"). Built without
/// asking for transparent huge pages (feature `no_thp`): on a kernel that
/// grants them on request, its regions grew in 2 MiB steps, and a first
/// start with 10,000 sources peaked 16 to 19 MiB higher.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `openflux --version`: the release and the commit it was built from
/// (build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OPENFLUX_BUILD_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(
    name = "openflux",
    version = VERSION,
    about = "Opens upstream Flux to custom source types"
)]
struct Cli {
    /// Path to a kubeconfig; by default in-cluster config or $KUBECONFIG.
    #[arg(long, global = true, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
struct RunCmd {
    #[command(flatten)]
    run: openflux::runtime::RunArgs,
    #[command(flatten)]
    webhook: openflux::webhook::WebhookArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controllers (mirror, export) and the admission webhook.
    /// A flag given twice takes its last value, so that extra arguments
    /// (the chart's `extraArgs`) override the shipped ones.
    #[command(args_override_self = true)]
    Run(Box<RunCmd>),
    /// Print the CustomResourceDefinitions of openflux's API as YAML.
    Crds {
        /// Print the SourcePolicy CRD instead of the Artifact CRD.
        #[rustfmt::skip]
        #[arg(long, default_value = "false", action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = openflux::api::runtime::flags::parse_go_bool)]
        source_policy: bool,
    },
    /// Write a CA and a serving certificate for the webhook.
    Certs(openflux::certs::CertsArgs),
}

async fn client(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .map_err(|e| anyhow::anyhow!("cannot read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn main_inner(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crds { source_policy } => {
            if source_policy {
                print!("{}", openflux::api::policy::source_policy_crd_yaml()?);
            } else {
                print!("{}", openflux::api::crd_yaml()?);
            }
            Ok(())
        }
        Command::Certs(args) => openflux::certs::run(args),
        Command::Run(cmd) => {
            let RunCmd { run: args, webhook } = *cmd;
            openflux::api::runtime::logging::init(&args.runtime.log)?;
            let client = client(cli.kubeconfig).await?;
            let namespace = args
                .runtime
                .watch
                .runtime_namespace()
                .ok()
                .map(str::to_string);
            // A shard other than the main one serves the certificate and the
            // configuration the main shard's leader keeps, and writes
            // neither: to it, no term ever starts. (A selector that does not
            // parse stops `run` with its error.)
            let keeps_shared = args.shard().map_or(true, |shard| shard.keeps_shared());
            openflux::runtime::run(args, client, move |shared| {
                let metrics =
                    openflux::webhook::register(&mut openflux::locks::lock(&shared.registry));
                openflux::webhook::serve(
                    webhook,
                    Some(openflux::webhook::InCluster {
                        client: shared.client.clone(),
                        namespace,
                        readiness: Some(shared.readiness.clone()),
                        leading: Some(if keeps_shared {
                            shared.leading.clone()
                        } else {
                            tokio::sync::watch::channel(None).1
                        }),
                        events: Some(shared.events.clone()),
                    }),
                    openflux::webhook::Knowledge {
                        index: shared.index.clone(),
                        facts: shared.facts.clone(),
                        fresh: Some(shared.fresh.clone()),
                        readiness: Some(shared.readiness.clone()),
                        ..Default::default()
                    },
                    metrics,
                    shared.shutdown.clone().cancelled_owned(),
                )
            })
            .await
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    openflux::runtime::allocator::purge_freed_memory_at_once();
    let cli = Cli::parse();
    match main_inner(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("openflux: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment() -> serde_json::Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/deployment.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        serde_yaml_ng::from_str(&text).unwrap()
    }

    /// The arguments of the openflux container of the shipped Deployment.
    fn deployment_args() -> Vec<String> {
        let args = &deployment()["spec"]["template"]["spec"]["containers"][0]["args"];
        serde_json::from_value(args.clone()).unwrap()
    }

    /// Every flag stands alone or takes `=true`/`=false` as in Go, and
    /// every listen address takes `:port`.
    #[test]
    fn every_flag_takes_fluxs_forms() {
        use clap::CommandFactory;
        let problems =
            openflux::api::runtime::flags::flag_form_problems(&Cli::command(), &["events-addr"]);
        assert_eq!(problems, Vec::<String>::new());
    }

    /// The Deployment's shutdown timings cover openflux's own bounds: the
    /// preStop sleep, then the webhook's drain and the controllers' stop
    /// and the Lease release, which run side by side.
    #[test]
    fn the_grace_period_covers_the_shutdown_bounds() {
        let pod = &deployment()["spec"]["template"]["spec"];
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        let pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap();
        let runtime = openflux::runtime::CONTROLLERS_STOP_GRACE
            + openflux::api::runtime::leader::RELEASE_TIMEOUT
            + openflux::runtime::SERVER_STOP_GRACE;
        // The webhook drains, then lets requests in flight finish, beside
        // the controllers' stop.
        let webhook =
            openflux::webhook::server::SHUTDOWN_DRAIN + openflux::webhook::server::SHUTDOWN_GRACE;
        let shutdown = runtime.max(webhook);
        assert!(
            shutdown < std::time::Duration::from_secs(10),
            "{shutdown:?}"
        );
        assert!(pre_stop >= 1);
        assert!(grace >= pre_stop + 10, "{grace} s < {pre_stop} s + 10 s");
    }

    fn webhook_args(args: Vec<String>) -> openflux::webhook::WebhookArgs {
        let cli = Cli::try_parse_from(std::iter::once("openflux".to_string()).chain(args))
            .unwrap_or_else(|e| panic!("manifests/deployment.yaml: {e}"));
        let Command::Run(cmd) = cli.command else {
            panic!("the Deployment runs `openflux run`");
        };
        cmd.webhook
    }

    /// Extra arguments come after the shipped ones: a flag given again
    /// takes its last value instead of being refused.
    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let cli = Cli::try_parse_from([
            "openflux",
            "run",
            "--log-level=info",
            "--concurrent=4",
            "--webhook-addr=:9443",
            "--log-level=debug",
            "--concurrent=8",
            "--webhook-addr=:10443",
        ])
        .unwrap();
        let Command::Run(cmd) = cli.command else {
            panic!("parsed as `openflux run`");
        };
        let runtime = &cmd.run.runtime;
        assert_eq!(
            runtime.log.log_level,
            openflux::api::runtime::flags::LogLevel::Debug
        );
        assert_eq!(runtime.concurrent, 8);
        assert_eq!(cmd.webhook.webhook_addr, ":10443".parse().unwrap());
    }

    /// `WebhookArgs::default()`, which tests start from, is what
    /// `openflux run` has with no webhook flag.
    #[test]
    fn the_webhook_args_default_is_openflux_run_with_no_webhook_flag() {
        let run = webhook_args(vec!["run".into()]);
        assert_eq!(run, openflux::webhook::WebhookArgs::default());
        assert_eq!(run.webhook_addr, ":9443".parse().unwrap());
    }

    /// The shipped Deployment starts with nothing prepared: openflux keeps
    /// its certificates in a Secret it makes, and nothing is mounted. The
    /// mounted-certs component turns it back to a Secret made outside
    /// (cert-manager, `openflux certs`), mounted.
    #[test]
    fn the_shipped_deployment_needs_no_secret_and_the_component_mounts_one() {
        let deployment = deployment();
        let pod = &deployment["spec"]["template"]["spec"];
        assert!(pod["volumes"].is_null(), "{}", pod["volumes"]);
        assert!(pod["containers"][0]["volumeMounts"].is_null());
        let webhook = webhook_args(deployment_args());
        assert_eq!(
            webhook.webhook_cert_secret.as_deref(),
            Some(openflux::certs::DEFAULT_SECRET)
        );
        assert!(webhook
            .webhook_dns_names
            .contains(&"openflux-webhook.openflux-system.svc".to_string()));
        webhook.timing().validate().unwrap();

        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/manifests/components/mounted-certs/kustomization.yaml"
        );
        let component: serde_json::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let patch: json_patch::Patch =
            serde_yaml_ng::from_str(component["patches"][0]["patch"].as_str().unwrap()).unwrap();
        let mut mounted = deployment.clone();
        json_patch::patch(&mut mounted, &patch).unwrap();
        let args = &mounted["spec"]["template"]["spec"]["containers"][0]["args"];
        let webhook = webhook_args(serde_json::from_value(args.clone()).unwrap());
        assert_eq!(webhook.webhook_cert_secret, None);
        assert!(matches!(
            webhook.cert_source(),
            openflux::certs::CertSource::Files(_)
        ));
        let volume = &mounted["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"];
        assert_eq!(volume, openflux::certs::DEFAULT_SECRET);
    }

    /// The Service sends /mutate to every openflux Pod by port number, and
    /// /validate only to Pods that declare the named container port the
    /// `validate` port targets: this Deployment's and every shard's, which
    /// publish the validating configuration for that Service and port.
    #[test]
    fn the_shipped_service_sends_validating_calls_only_to_pods_that_serve_them() {
        let read = |path: &str| -> serde_json::Value {
            let path = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
            serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
        };
        let service = read("manifests/service.yaml");
        let ports = service["spec"]["ports"].as_array().unwrap();
        let port = |name: &str| ports.iter().find(|p| p["name"] == name).unwrap().clone();
        for path in [
            "manifests/deployment.yaml",
            "manifests/components/sharding/shard/deployment.yaml",
        ] {
            let deployment = read(path);
            let container = &deployment["spec"]["template"]["spec"]["containers"][0];
            let args = serde_json::from_value(container["args"].clone()).unwrap();
            let webhook = webhook_args(args);
            assert_eq!(
                webhook.validating_webhook_service.as_deref(),
                service["metadata"]["name"].as_str(),
                "{path}"
            );
            assert_eq!(webhook.webhook_configuration, vec!["openflux"], "{path}");
            let validate = port(&webhook.validating_webhook_port);
            let target = validate["targetPort"].as_str().expect("a port name");
            let declared = container["ports"].as_array().unwrap();
            let served = declared.iter().find(|p| p["name"] == target).unwrap();
            assert_eq!(
                served["containerPort"].as_u64(),
                Some(u64::from(webhook.webhook_addr.port())),
                "{path}"
            );
            assert_eq!(
                port("https")["targetPort"].as_u64(),
                Some(u64::from(webhook.webhook_addr.port())),
                "{path}: /mutate by number, for Pods of every release"
            );
        }
    }

    #[test]
    fn the_shipped_deployment_parses_with_flux_conventions() {
        let args = deployment_args();
        let cli = Cli::try_parse_from(std::iter::once("openflux".to_string()).chain(args))
            .unwrap_or_else(|e| panic!("manifests/deployment.yaml: {e}"));
        let Command::Run(cmd) = cli.command else {
            panic!("the Deployment runs `openflux run`");
        };
        let runtime = &cmd.run.runtime;
        assert!(runtime.leader_election.enable_leader_election);
        assert_eq!(
            runtime.log.log_encoding,
            openflux::api::runtime::flags::LogEncoding::Json
        );
        assert_eq!(
            (runtime.metrics_addr.port(), runtime.health_addr.port()),
            (8080, 9440)
        );
    }

    /// openflux's Events reach notification-controller (Alerts, `flux
    /// events`), at the address the HttpSource controller's Deployment and
    /// Flux's own controllers use.
    #[test]
    fn the_shipped_deployment_sends_events_to_notification_controller() {
        let events_addr = |path: &str| {
            let text =
                std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let deployment: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
            let args: Vec<String> = serde_json::from_value(
                deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
            )
            .unwrap();
            args.iter()
                .find_map(|a| a.strip_prefix("--events-addr=").map(str::to_string))
        };
        let openflux = events_addr("manifests/deployment.yaml");
        assert_eq!(
            openflux,
            events_addr("manifests/http-source/deployment.yaml")
        );
        let url = openflux.expect("manifests/deployment.yaml sets --events-addr");
        assert!(
            url.starts_with("http://notification-controller.flux-system."),
            "{url}"
        );
    }
}
