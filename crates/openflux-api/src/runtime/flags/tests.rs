use super::*;
use clap::Parser;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

fn parse(args: &[&str]) -> Result<RuntimeArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("controller").chain(args.iter().copied()))
        .map(|c| c.runtime)
}

fn ok(args: &[&str]) -> RuntimeArgs {
    parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn defaults_are_fluxs() {
    let args = ok(&[]);
    assert_eq!(args.metrics_addr.to_string(), ":8080");
    assert_eq!(
        args.metrics_addr.socket_addr(),
        "0.0.0.0:8080".parse().unwrap()
    );
    assert_eq!(args.health_addr.port(), 9440);
    assert_eq!(args.events_url(), None);
    assert_eq!(args.concurrent, 4);
    assert_eq!(args.log.log_level, LogLevel::Info);
    assert_eq!(args.log.log_encoding, LogEncoding::Json);
    let le = args.leader_election;
    assert!(!le.enable_leader_election);
    assert!(le.leader_election_release_on_cancel);
    assert_eq!(le.leader_election_lease_duration, Duration::from_secs(35));
    assert_eq!(le.leader_election_renew_deadline, Duration::from_secs(30));
    assert_eq!(le.leader_election_retry_period, Duration::from_secs(5));
    assert!(args.watch.watch_all_namespaces);
    assert_eq!(args.watch.watch_label_selector, "");
}

#[test]
fn listen_addresses_take_gos_forms() {
    let args = ok(&["--metrics-addr=:9090", "--health-addr", "127.0.0.1:9441"]);
    assert_eq!(
        args.metrics_addr.socket_addr(),
        "0.0.0.0:9090".parse().unwrap()
    );
    assert_eq!(
        args.health_addr.socket_addr(),
        "127.0.0.1:9441".parse().unwrap()
    );
    let v6 = ok(&["--metrics-addr=[::1]:8080"]);
    assert_eq!(v6.metrics_addr.socket_addr(), "[::1]:8080".parse().unwrap());
    let named = ok(&["--metrics-addr=localhost:8080"]);
    assert!(named.metrics_addr.socket_addr().ip().is_loopback());
    for bad in ["8080", ":http", ":99999", "nohost", ""] {
        let err = parse(&["--metrics-addr", bad]).unwrap_err();
        assert!(
            err.to_string().contains("invalid listen address"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn booleans_stand_alone_or_take_a_value_after_equals() {
    let args = ok(&["--enable-leader-election"]);
    assert!(args.leader_election.enable_leader_election);
    for (value, expected) in [("true", true), ("false", false), ("1", true), ("F", false)] {
        let flag = format!("--enable-leader-election={value}");
        assert_eq!(
            ok(&[&flag]).leader_election.enable_leader_election,
            expected,
            "{flag}"
        );
    }
    assert!(parse(&["--enable-leader-election=yes"]).is_err());
    // As in Go, `--flag false` does not give the flag a value.
    assert!(parse(&["--enable-leader-election", "false"]).is_err());

    assert!(
        !ok(&["--watch-all-namespaces=false"])
            .watch
            .watch_all_namespaces
    );
    assert!(ok(&["--watch-all-namespaces"]).watch.watch_all_namespaces);
    assert!(
        !ok(&["--leader-election-release-on-cancel=false"])
            .leader_election
            .leader_election_release_on_cancel
    );
}

#[test]
fn log_flags_take_fluxs_values_only() {
    for (value, level) in [
        ("trace", LogLevel::Trace),
        ("debug", LogLevel::Debug),
        ("info", LogLevel::Info),
        ("error", LogLevel::Error),
    ] {
        let flag = format!("--log-level={value}");
        assert_eq!(ok(&[&flag]).log.log_level, level);
    }
    assert!(parse(&["--log-level=warn"]).is_err());
    assert_eq!(
        ok(&["--log-encoding=console"]).log.log_encoding,
        LogEncoding::Console
    );
    assert_eq!(
        ok(&["--log-encoding", "json"]).log.log_encoding,
        LogEncoding::Json
    );
    assert!(parse(&["--log-encoding=text"]).is_err());
}

#[test]
fn durations_are_go_durations() {
    let args = ok(&[
        "--leader-election-lease-duration=1m30s",
        "--leader-election-renew-deadline=45s",
        "--leader-election-retry-period=500ms",
    ]);
    let le = args.leader_election;
    assert_eq!(le.leader_election_lease_duration, Duration::from_secs(90));
    assert_eq!(le.leader_election_renew_deadline, Duration::from_secs(45));
    assert_eq!(le.leader_election_retry_period, Duration::from_millis(500));
    assert!(parse(&["--leader-election-lease-duration=35"]).is_err());
}

#[test]
fn concurrent_is_a_positive_number() {
    assert_eq!(ok(&["--concurrent=10"]).concurrent, 10);
    assert_eq!(ok(&["--concurrent", "1"]).concurrent, 1);
    assert!(parse(&["--concurrent=0"]).is_err());
    assert!(parse(&["--concurrent=-1"]).is_err());
}

#[test]
fn events_addr_is_an_http_url_or_empty() {
    let args =
        ok(&["--events-addr=http://notification-controller.flux-system.svc.cluster.local./"]);
    assert_eq!(
        args.events_url().map(|u| u.to_string()),
        Some("http://notification-controller.flux-system.svc.cluster.local./".to_string())
    );
    assert_eq!(ok(&["--events-addr="]).events_url(), None);
    assert!(parse(&["--events-addr=notification-controller"]).is_err());
    assert!(parse(&["--events-addr=ftp://nc/"]).is_err());
}

#[test]
fn watch_selects_namespace_and_labels() {
    let args = ok(&["--watch-all-namespaces=false", "--namespace=flux-system"]);
    assert_eq!(args.watch.watched_namespace(), Ok(Some("flux-system")));
    let all = ok(&["--namespace=flux-system"]);
    assert_eq!(all.watch.watched_namespace(), Ok(None));
    assert_eq!(all.watch.runtime_namespace(), Ok("flux-system"));
    let missing = ok(&["--watch-all-namespaces=false", "--namespace="]);
    assert!(missing.watch.watched_namespace().is_err());

    let sharded = ok(&["--watch-label-selector=sharding.fluxcd.io/key=shard1"]);
    assert_eq!(
        sharded.watch.watcher_config().label_selector.as_deref(),
        Some("sharding.fluxcd.io/key=shard1")
    );
    assert_eq!(all.watch.watcher_config().label_selector, None);
}

#[test]
fn label_selectors_are_validated() {
    for good in [
        "",
        "a",
        "!a",
        "a=b",
        "a==b",
        "a!=b",
        "a=",
        "sharding.fluxcd.io/key in (shard1, shard2)",
        "sharding.fluxcd.io/key notin (shard1),!team",
        "app.kubernetes.io/name=web,tier!=db",
    ] {
        assert!(parse_label_selector(good).is_ok(), "{good:?}");
    }
    for bad in [
        "a b",
        "a in b",
        "a in (b",
        "A_/b=c",
        "a=b c",
        "a>1",
        "-a=b",
        "a=-b",
        "/a=b",
        &format!("a={}", "x".repeat(64)),
    ] {
        let err = parse_label_selector(bad).unwrap_err();
        assert!(err.contains("invalid label selector"), "{bad:?}: {err}");
    }
    assert!(parse(&["--watch-label-selector=a in b"]).is_err());
}

#[test]
fn go_booleans() {
    assert_eq!(parse_go_bool("TRUE"), Ok(true));
    assert_eq!(parse_go_bool("0"), Ok(false));
    assert!(parse_go_bool("").is_err());
}

#[test]
fn the_runtime_flags_take_go_forms() {
    use clap::CommandFactory;
    assert_eq!(
        flag_form_problems(&Cli::command(), &["events-addr"]),
        Vec::<String>::new()
    );
}

#[test]
fn flags_that_break_go_forms_are_named() {
    use clap::CommandFactory;
    #[derive(Parser)]
    struct Plain {
        #[arg(long)]
        dry_run: bool,
        #[arg(long, default_value = "0.0.0.0:9443")]
        serve_addr: std::net::SocketAddr,
        #[arg(long, default_value = ":8080")]
        ok_addr: ListenAddr,
        #[arg(long, default_value = "false", action = ArgAction::Set, num_args = 0..=1,
              require_equals = true, default_missing_value = "true")]
        strict: bool,
        #[command(subcommand)]
        sub: Option<Sub>,
    }
    #[derive(clap::Subcommand)]
    enum Sub {
        Print {
            file: String,
            #[arg(long)]
            verbose: bool,
        },
    }
    let problems = flag_form_problems(&Plain::command(), &[]);
    let named = |flag: &str| problems.iter().any(|p| p.contains(flag));
    assert!(named("--dry-run: a boolean"), "{problems:?}");
    assert!(named("--serve-addr: not a listen address"), "{problems:?}");
    assert!(named("print --verbose: a boolean"), "{problems:?}");
    // clap's own bool parser takes true and false but not Go's other forms;
    // --strict stands alone and takes both, so it passes.
    assert!(!named("--strict") && !named("--ok-addr"), "{problems:?}");
    assert_eq!(problems.len(), 3, "{problems:?}");
}
