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
    use clap::{Args, FromArgMatches};

    fn parsed(args: &[&str]) -> RunArgs {
        let command = RunArgs::augment_args(clap::Command::new("openflux"));
        let matches = command.try_get_matches_from(args).unwrap();
        RunArgs::from_arg_matches(&matches).unwrap()
    }

    #[test]
    fn defaults_and_scope() {
        let run = parsed(&["openflux"]);
        assert_eq!(
            (
                run.metrics_addr.port(),
                run.health_addr.port(),
                run.concurrent
            ),
            (8080, 9440, 4)
        );
        assert!(run.enable_leader_election && run.watch_all_namespaces);
        assert_eq!(run.scope(), Scope(None));
        let run = parsed(&[
            "openflux",
            "--watch-all-namespaces=false",
            "--namespace=flux",
        ]);
        assert_eq!(run.scope(), Scope(Some("flux".into())));
    }
}
