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

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controllers (mirror, export) and the admission webhook.
    Run(openflux::run::RunArgs),
    /// Print the CustomResourceDefinitions of openflux's API as YAML.
    Crds,
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
        Command::Run(args) => {
            openflux::telemetry::init_logging(&args.log_level, args.log_encoding == "json")?;
            let client = client(cli.kubeconfig).await?;
            openflux::run::run(args, client, |_shared| async { Ok(()) }).await
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
