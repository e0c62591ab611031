//! The command-line flags every Flux controller takes, with Flux's names,
//! defaults and forms, as a clap [`Args`] struct to flatten into a binary's
//! own:
//!
//! ```
//! use clap::Parser;
//! use openflux_api::runtime::flags::RuntimeArgs;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     runtime: RuntimeArgs,
//!     // the controller's own flags
//! }
//!
//! let cli = Cli::parse_from(["my-source-controller", "--enable-leader-election"]);
//! assert!(cli.runtime.leader_election.enable_leader_election);
//! ```
//!
//! As in Go's flag package (which Flux uses), a boolean flag stands alone
//! (`--enable-leader-election`) or takes its value after `=`
//! (`--watch-all-namespaces=false`); `--flag false` is not a value.
//! Durations are Go durations (`35s`, `1m30s`). A listen address `:8080`
//! means all interfaces.
//!
//! From `fluxcd/pkg/runtime` (the version the pinned Flux controllers use):
//! `client` (`--kube-api-qps`, `--kube-api-burst`) has no counterpart here,
//! as kube-rs does not rate-limit its client; `--watch-configs-label-selector`
//! is left to controllers that watch ConfigMaps and Secrets.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};

use super::selector::LabelSelector;
use crate::duration;

/// Flux's common controller flags.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct RuntimeArgs {
    /// The address the metric endpoint binds to.
    #[arg(long, env = "METRICS_ADDR", default_value = ":8080")]
    pub metrics_addr: ListenAddr,
    /// The address the health endpoint binds to.
    #[arg(long, default_value = ":9440")]
    pub health_addr: ListenAddr,
    /// The address of the events receiver (notification-controller, e.g.
    /// http://notification-controller.flux-system.svc.cluster.local./);
    /// empty: Kubernetes Events only.
    #[arg(long, env = "EVENTS_ADDR", default_value = "", value_parser = parse_events_addr)]
    pub events_addr: String,
    /// The number of concurrent reconciles per controller.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent: u16,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub leader_election: LeaderElectionArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
    #[command(flatten)]
    pub retry: super::retry::RetryArgs,
}

impl RuntimeArgs {
    /// The events receiver, when `--events-addr` is set.
    pub fn events_url(&self) -> Option<reqwest::Url> {
        // Validated when parsed: an unparsable value never gets here.
        (!self.events_addr.is_empty())
            .then(|| reqwest::Url::parse(&self.events_addr).ok())
            .flatten()
    }
}

/// `--log-level` and `--log-encoding` (`fluxcd/pkg/runtime/logger`).
#[derive(Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogArgs {
    /// Log verbosity level.
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// Log encoding format.
    #[arg(long, value_enum, default_value_t = LogEncoding::Json)]
    pub log_encoding: LogEncoding,
}

/// Flux's log levels. `error` also shows warnings: Flux has no warning
/// level and logs failures as errors.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Error,
}

/// Flux's log encodings.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogEncoding {
    /// One JSON object a line (zap's production encoder).
    Json,
    /// Tab-separated text for people (zap's console encoder).
    Console,
}

/// Leader election (`fluxcd/pkg/runtime/leaderelection`).
#[derive(Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderElectionArgs {
    /// Enable leader election for controller manager. Enabling this will
    /// ensure there is only one active controller manager.
    #[rustfmt::skip]
    #[arg(long, default_value = "false", action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_leader_election: bool,
    /// Defines if the leader should step down voluntarily on controller
    /// manager shutdown.
    #[rustfmt::skip]
    #[arg(long, default_value = "true", action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub leader_election_release_on_cancel: bool,
    /// Interval at which non-leader candidates will wait to force acquire
    /// leadership (duration string).
    #[arg(long, default_value = "35s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// Duration that the leading controller manager will retry refreshing
    /// leadership before giving up (duration string).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,
    /// Duration the LeaderElector clients should wait between tries of
    /// actions (duration string).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,
}

/// What to watch (`fluxcd/pkg/runtime/controller` WatchOptions).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct WatchArgs {
    /// Watch for resources in all namespaces, if set to false it will only
    /// watch the runtime namespace.
    #[rustfmt::skip]
    #[arg(long, default_value = "true", action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub watch_all_namespaces: bool,
    /// Watch for resources with matching labels e.g.
    /// 'sharding.fluxcd.io/key=shard1'.
    #[arg(long, default_value = "", value_parser = parse_label_selector)]
    pub watch_label_selector: String,
    /// The runtime namespace: watched when --watch-all-namespaces=false, and
    /// where the leader election Lease lives. Flux reads it from
    /// RUNTIME_NAMESPACE only; the flag is an addition.
    #[arg(long, env = "RUNTIME_NAMESPACE")]
    pub namespace: Option<String>,
}

/// A flag combination that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

impl WatchArgs {
    /// The namespace to watch: `None` for all namespaces.
    pub fn watched_namespace(&self) -> Result<Option<&str>, FlagError> {
        if self.watch_all_namespaces {
            return Ok(None);
        }
        self.runtime_namespace().map(Some)
    }

    /// The runtime namespace (`--namespace` or `RUNTIME_NAMESPACE`).
    pub fn runtime_namespace(&self) -> Result<&str, FlagError> {
        self.namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .ok_or_else(|| {
                FlagError(
                    "the runtime namespace is not set: pass --namespace or set RUNTIME_NAMESPACE"
                        .into(),
                )
            })
    }

    /// `--watch-label-selector`, parsed, to match objects in memory.
    pub fn label_selector(&self) -> Result<LabelSelector, FlagError> {
        self.watch_label_selector.parse().map_err(FlagError)
    }

    /// The watcher configuration `--watch-label-selector` implies.
    pub fn watcher_config(&self) -> kube::runtime::watcher::Config {
        let config = kube::runtime::watcher::Config::default();
        if self.watch_label_selector.is_empty() {
            config
        } else {
            config.labels(&self.watch_label_selector)
        }
    }
}

/// A listen address as Go takes it: `host:port`, or `:port` for all
/// interfaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    text: String,
    addr: SocketAddr,
}

impl ListenAddr {
    pub fn socket_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("invalid listen address {s:?}: expected host:port or :port");
        let addr = if let Some(port) = s.strip_prefix(':') {
            let port: u16 = port.parse().map_err(|_| invalid())?;
            SocketAddr::from(([0, 0, 0, 0], port))
        } else if let Ok(addr) = s.parse::<SocketAddr>() {
            addr
        } else {
            // A host name (resolved once, at start).
            let (host, port) = s.rsplit_once(':').ok_or_else(invalid)?;
            let port: u16 = port.parse().map_err(|_| invalid())?;
            (host, port)
                .to_socket_addrs()
                .map_err(|e| format!("{}: {e}", invalid()))?
                .next()
                .ok_or_else(invalid)?
        };
        Ok(ListenAddr {
            text: s.to_string(),
            addr,
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?}: use true or false")),
    }
}

/// What in `command`'s flags (and its subcommands') breaks Flux's forms, a
/// line each: a boolean flag must stand alone and take `=true` and `=false`
/// (Go's flag package; clap's default boolean takes no value), and a flag
/// named `*-addr` must be a [`ListenAddr`] (so `:port` works) unless it is
/// in `not_listen` (addresses to reach, not to listen on). Each binary's
/// tests run it over its whole command line.
pub fn flag_form_problems(command: &clap::Command, not_listen: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut command = command.clone();
    command.build();
    let path = [command.get_name().to_string()];
    check_forms(&command, &path, not_listen, &mut problems);
    problems
}

fn check_forms(
    command: &clap::Command,
    path: &[String],
    not_listen: &[&str],
    problems: &mut Vec<String>,
) {
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let flag = format!("{} --{long}", path.join(" "));
        if matches!(
            arg.get_action(),
            ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
        ) {
            problems.push(format!("{flag}: a boolean that refuses =true and =false"));
            continue;
        }
        // Parsed by this (sub)command alone, required values waived.
        let parsed = |value: Option<&str>| {
            let form = match value {
                Some(value) => format!("--{long}={value}"),
                None => format!("--{long}"),
            };
            let name = command.get_name().to_string();
            command
                .clone()
                .ignore_errors(true)
                .try_get_matches_from([name, form])
        };
        let is_bool = parsed(Some("true")).ok().is_some_and(|m| {
            matches!(m.try_get_one::<bool>(arg.get_id().as_str()), Ok(Some(true)))
        });
        if is_bool {
            for (value, want) in [(None, true), (Some("true"), true), (Some("false"), false)] {
                let got = parsed(value).ok().and_then(|m| {
                    m.try_get_one::<bool>(arg.get_id().as_str())
                        .ok()
                        .flatten()
                        .copied()
                });
                if got != Some(want) {
                    let form = value.map(|v| format!("={v}")).unwrap_or_default();
                    problems.push(format!("{flag}{form}: read as {got:?}, not {want}"));
                }
            }
        }
        if long.ends_with("-addr") && !not_listen.contains(&long) {
            let listen = parsed(Some(":18080")).ok().is_some_and(|m| {
                m.try_get_one::<ListenAddr>(arg.get_id().as_str())
                    .is_ok_and(|addr| addr.is_some_and(|a| a.port() == 18080))
            });
            if !listen {
                problems.push(format!("{flag}: not a listen address that takes :port"));
            }
        }
    }
    for sub in command.get_subcommands() {
        let mut path = path.to_vec();
        path.push(sub.get_name().to_string());
        check_forms(sub, &path, not_listen, problems);
    }
}

/// A Go duration (`35s`, `1m30s`, `500ms`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    duration::parse(s).map_err(|e| e.to_string())
}

fn parse_events_addr(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Ok(String::new());
    }
    let url = reqwest::Url::parse(s).map_err(|e| format!("invalid events address {s:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "invalid events address {s:?}: the scheme must be http or https"
        ));
    }
    Ok(s.to_string())
}

/// A label selector as `metav1.ParseToLabelSelector` accepts it: comma
/// separated `key`, `!key`, `key=value`, `key==value`, `key!=value`,
/// `key in (a,b)` and `key notin (a,b)` (see [`LabelSelector`]).
pub fn parse_label_selector(s: &str) -> Result<String, String> {
    s.parse::<LabelSelector>().map(|parsed| parsed.to_string())
}

#[cfg(test)]
mod tests;
