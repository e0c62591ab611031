//! The flags of `openflux run`, named as Flux controllers name theirs.

use std::net::SocketAddr;

use super::watch::Scope;

/// Flags of `openflux run` (the webhook's are in [`crate::webhook::WebhookArgs`]).
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Address the Prometheus metrics endpoint binds to.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Address the /healthz and /readyz endpoints bind to.
    #[arg(long, default_value = "0.0.0.0:9440")]
    pub health_addr: SocketAddr,
    /// Watch sources and Artifacts in all namespaces; when false, only in --namespace.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub watch_all_namespaces: bool,
    /// The namespace openflux runs in (its leader Lease lives there).
    #[arg(long, env = "RUNTIME_NAMESPACE", default_value = "openflux-system")]
    pub namespace: String,
    /// Reconciles each controller runs at once.
    #[arg(long, default_value_t = 4)]
    pub concurrent: u16,
    /// Elect a leader among replicas before running the controllers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub enable_leader_election: bool,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "openflux-leader-election")]
    pub leader_election_id: String,
    /// Log filter: error, warn, info, debug, trace, or a tracing directive.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Log encoding: console or json.
    #[arg(long, default_value = "console", value_parser = ["console", "json"])]
    pub log_encoding: String,
}

impl RunArgs {
    /// The namespaces watched: all, or only `--namespace`.
    pub fn scope(&self) -> Scope {
        Scope((!self.watch_all_namespaces).then(|| self.namespace.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn defaults_and_scope() {
        let cli = Cli::try_parse_from(["openflux"]).unwrap();
        assert_eq!(cli.run.metrics_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(cli.run.health_addr, "0.0.0.0:9440".parse().unwrap());
        assert_eq!(cli.run.concurrent, 4);
        assert!(cli.run.enable_leader_election);
        assert_eq!(cli.run.scope(), Scope(None));
        let cli = Cli::try_parse_from([
            "openflux",
            "--watch-all-namespaces=false",
            "--namespace=flux",
        ])
        .unwrap();
        assert_eq!(cli.run.scope(), Scope(Some("flux".into())));
    }
}
