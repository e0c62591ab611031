//! The flags of `openflux run`: Flux's common controller flags (the
//! openflux-api runtime kit's, with Flux's names, defaults and forms) and
//! openflux's own.

use crate::api::runtime::flags::{FlagError, RuntimeArgs};

use crate::cluster::target::ExportMode;
use crate::shard::Shard;
use crate::watch::Scope;

/// Name of the leader election Lease, in the runtime namespace.
pub const LEADER_ELECTION_ID: &str = "openflux-leader-election";

/// Flags of `openflux run` (the webhook's are in [`crate::webhook::WebhookArgs`]).
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Flux's common flags: `--metrics-addr`, `--health-addr`,
    /// `--events-addr`, `--concurrent`, `--log-level`, `--log-encoding`,
    /// `--enable-leader-election` and its timings, `--watch-all-namespaces`,
    /// `--watch-label-selector` and `--namespace`.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// What custom sources are exported as: `external-artifact`
    /// (ExternalArtifact; the consumers' controllers must accept it),
    /// `shadow` (a suspended OCIRepository whose status openflux writes;
    /// every Flux from 2.3 reads it), or `auto`: ExternalArtifact for each
    /// consumer whose controller accepts it, a shadow for the others.
    #[arg(long, default_value = "auto", value_parser = parse_export_mode)]
    pub export: ExportMode,
    /// Namespace of the Flux controllers, whose Deployments say whether
    /// their ExternalArtifact feature gate is on.
    #[arg(long, default_value = "flux-system")]
    pub flux_namespace: String,
    /// Export an Artifact of a custom source only when its writer (recorded
    /// by the webhook) may update that source's status. `false` trusts every
    /// Artifact: anyone who may write Artifacts in a namespace then chooses
    /// what its consumers deploy; only for clusters without openflux's
    /// webhook for Artifacts.
    #[rustfmt::skip]
    #[arg(long, default_value = "true", action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = crate::api::runtime::flags::parse_go_bool)]
    pub verify_artifact_writers: bool,
}

fn parse_export_mode(value: &str) -> Result<ExportMode, String> {
    value.parse()
}

impl RunArgs {
    /// The shard of this replica: the objects `--watch-label-selector`
    /// selects (all without one).
    pub fn shard(&self) -> Result<Shard, FlagError> {
        Ok(Shard::new(self.runtime.watch.label_selector()?))
    }

    /// The leader election Lease: [`LEADER_ELECTION_ID`], and with
    /// `--watch-label-selector` a suffix derived from it, as Flux names each
    /// shard's Lease.
    pub fn lease_name(&self) -> String {
        crate::shard::lease_name(LEADER_ELECTION_ID, &self.runtime.watch.watch_label_selector)
    }

    /// What is watched: all namespaces or only the runtime namespace, and
    /// the objects `--watch-label-selector` selects.
    pub fn scope(&self) -> Result<Scope, FlagError> {
        let watch = &self.runtime.watch;
        Ok(Scope {
            namespace: watch.watched_namespace()?.map(str::to_string),
            labels: watch.watch_label_selector.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    fn parsed(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let command = RunArgs::augment_args(clap::Command::new("openflux"));
        let matches = command.try_get_matches_from(args)?;
        RunArgs::from_arg_matches(&matches)
    }

    #[test]
    fn flux_defaults_and_forms() {
        let run = parsed(&["openflux"]).unwrap();
        let rt = &run.runtime;
        assert_eq!(
            (rt.metrics_addr.port(), rt.health_addr.port(), rt.concurrent),
            (8080, 9440, 4)
        );
        assert!(!rt.leader_election.enable_leader_election);
        assert!(rt.events_url().is_none());
        assert_eq!(run.scope().unwrap(), Scope::default());
        let run = parsed(&[
            "openflux",
            "--metrics-addr=:8081",
            "--enable-leader-election",
            "--log-level=debug",
            "--log-encoding=console",
            "--events-addr=http://notification-controller.flux-system.svc.cluster.local./",
        ])
        .unwrap();
        assert_eq!(run.runtime.metrics_addr.port(), 8081);
        assert!(run.runtime.leader_election.enable_leader_election);
        assert!(run.runtime.events_url().is_some());
        assert!(parsed(&["openflux", "--log-encoding=xml"]).is_err());
        assert_eq!(parsed(&["openflux"]).unwrap().export, ExportMode::Auto);
        assert_eq!(
            parsed(&["openflux", "--export=shadow"]).unwrap().export,
            ExportMode::Shadow
        );
        let bad = parsed(&["openflux", "--export=bucket"])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("auto, external-artifact or shadow"), "{bad}");
    }

    #[test]
    fn scope_from_namespace_and_label_selector() {
        let run = parsed(&[
            "openflux",
            "--watch-all-namespaces=false",
            "--namespace=flux",
            "--watch-label-selector=sharding.fluxcd.io/key=shard1",
        ])
        .unwrap();
        let scope = run.scope().unwrap();
        assert_eq!(scope.namespace.as_deref(), Some("flux"));
        assert_eq!(scope.labels, "sharding.fluxcd.io/key=shard1");
        assert_eq!(
            scope.config().label_selector.as_deref(),
            Some("sharding.fluxcd.io/key=shard1")
        );
        // Watching one namespace needs to know which.
        let no_ns = parsed(&["openflux", "--watch-all-namespaces=false"]).unwrap();
        if std::env::var_os("RUNTIME_NAMESPACE").is_none() {
            assert!(no_ns.scope().is_err());
        }
        assert!(parsed(&["openflux", "--watch-label-selector=a b"]).is_err());
    }

    #[test]
    fn each_shard_has_its_lease_and_its_objects() {
        let main = parsed(&["openflux", "--watch-label-selector=!sharding.fluxcd.io/key"]).unwrap();
        let one = parsed(&[
            "openflux",
            "--watch-label-selector=sharding.fluxcd.io/key=shard1",
        ])
        .unwrap();
        let all = parsed(&["openflux"]).unwrap();
        assert_eq!(all.lease_name(), LEADER_ELECTION_ID);
        assert_ne!(main.lease_name(), one.lease_name());
        assert!(one.lease_name().starts_with("openflux-leader-election-"));
        let labelled = [(crate::shard::SHARD_LABEL.to_string(), "shard1".to_string())].into();
        assert!(one.shard().unwrap().owns(&labelled));
        assert!(!main.shard().unwrap().owns(&labelled));
        assert!(all.shard().unwrap().owns(&labelled));
    }
}
