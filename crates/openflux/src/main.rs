//! The `openflux` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "openflux",
    version,
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
    Run(Box<RunCmd>),
    /// Print the CustomResourceDefinitions of openflux's API as YAML.
    Crds,
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
        Command::Crds => {
            print!("{}", openflux::api::crd_yaml()?);
            Ok(())
        }
        Command::Certs(args) => openflux::certs::run(args),
        Command::Run(cmd) => {
            let RunCmd { run: args, webhook } = *cmd;
            openflux::telemetry::init_logging(&args.log_level, args.log_encoding == "json")?;
            let client = client(cli.kubeconfig).await?;
            openflux::runtime::run(args, client, move |shared| {
                let metrics =
                    openflux::webhook::register(&mut openflux::locks::lock(&shared.registry));
                openflux::webhook::serve(
                    webhook,
                    Some(shared.client.clone()),
                    shared.index.clone(),
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
    let cli = Cli::parse();
    match main_inner(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("openflux: {e:#}");
            ExitCode::FAILURE
        }
    }
}
