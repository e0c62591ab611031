//! openflux benchmarks. Every figure is printed next to a baseline measured
//! in the same run, on the same machine, with the same client, and as the
//! ratio of the two; docs/benchmarks.md explains each figure.
//!
//! ```text
//! cargo bench --bench openflux -- [--quick] [--json FILE] [--only parse,webhook,admission,mirror,e2e]
//!     [--mirror-sizes 100,1000,5000] [--samples 200] [--e2e-samples 5]
//! ```
//!
//! `e2e/bench` brings up the local control plane and runs this. Without a
//! `KUBECONFIG` in the environment the cluster benchmarks start the local
//! control plane themselves (as the end-to-end tests do).
//!
//! Run by `cargo test` (which, unlike `cargo bench`, passes no `--bench`
//! argument) it is a smoke test: the quick mode, nothing written, no figure
//! judged.

use openflux_testkit as support;

/// openflux's allocator, set as `openflux run` sets it: the webhook is
/// measured in this process, and its allocations cost what they cost in
/// the shipped binary (the servers it is compared with run on it too).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod admission;
mod cluster;
mod e2e;
mod loadgen;
mod mirror;
mod observe;
mod parse;
mod plot;
mod process;
mod report;
mod stats;
mod webhook;
mod webhook_setup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};

use report::Report;

const USAGE: &str = "\
usage: cargo bench --bench openflux -- [options]

  --quick                 small sizes and short runs (a smoke check, seconds)
  --json FILE             also write the figures as JSON to FILE
  --only LIST             sections to run, of: parse,webhook,admission,mirror,e2e (default: all)
  --mirror-sizes LIST     numbers of GitRepositories (default 100,1000,5000)
  --samples N             timed status writes per mirror size (default 200)
  --noop-samples N        status writes that change no artifact (default 50)
  --e2e-samples N         changes timed per end-to-end path (default 5)
  --concurrent N          openflux --concurrent and the baseline's concurrency (default 4)
  --webhook-seconds S     measured seconds per webhook run (default 5)
  --webhook-rate R        requests per second of the latency runs (default 1000)
  --connections N         load generator connections, HTTP/1.1, and creates in flight
                          through the API server (admission) (default 8)
  --webhook-profile N     only the webhook's in-process router phase, N requests each
                          (openflux, then the constant answer), for a profiler
  --webhook-log-level L   log filter of the webhook, as openflux run --log-level (default info)
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Parse,
    Webhook,
    Admission,
    Mirror,
    E2e,
}

impl Section {
    fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "parse" => Section::Parse,
            "webhook" => Section::Webhook,
            "admission" => Section::Admission,
            "mirror" => Section::Mirror,
            "e2e" | "end-to-end" => Section::E2e,
            other => bail!("unknown section {other:?} (parse, webhook, admission, mirror, e2e)"),
        })
    }
}

struct Options {
    /// Run by `cargo bench` (else by `cargo test`: a smoke test).
    bench: bool,
    quick: bool,
    json: Option<PathBuf>,
    sections: Vec<Section>,
    mirror: mirror::Params,
    e2e_samples: usize,
    webhook: WebhookParams,
}

/// Parameters of the webhook benchmark.
#[derive(Clone, Debug)]
pub struct WebhookParams {
    pub seconds: f64,
    pub warmup: f64,
    pub rate: f64,
    pub connections: usize,
    /// Rounds of each measurement, alternating baseline and openflux.
    pub rounds: usize,
    /// Log filter the webhook runs with (`openflux run --log-level`).
    pub log_level: String,
    /// Only the in-process router phase, this many requests each, for a
    /// profiler ([`webhook_setup::profile`]).
    pub profile: Option<usize>,
}

/// What `cargo test` does with this binary.
enum TestMode {
    Run,
    List,
    Skip,
}

fn parse_list<T: std::str::FromStr>(v: &str) -> anyhow::Result<Vec<T>> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("bad number {s:?}"))
        })
        .collect()
}

fn parse_args(args: Vec<String>) -> anyhow::Result<(Options, TestMode)> {
    let bench = args.iter().any(|a| a == "--bench");
    let quick = !bench || args.iter().any(|a| a == "--quick");
    let mut o = Options {
        bench,
        quick,
        json: None,
        sections: vec![
            Section::Parse,
            Section::Webhook,
            Section::Admission,
            Section::Mirror,
            Section::E2e,
        ],
        mirror: mirror::Params {
            sizes: if quick {
                vec![50]
            } else {
                vec![100, 1000, 5000]
            },
            samples: if quick { 20 } else { 200 },
            noop_samples: if quick { 10 } else { 50 },
            concurrent: 4,
            setup_concurrency: 16,
            wait_cleanup: !quick,
            measured_after: true,
        },
        e2e_samples: if quick { 1 } else { 5 },
        webhook: WebhookParams {
            seconds: if quick { 1.0 } else { 5.0 },
            warmup: if quick { 0.3 } else { 1.0 },
            rate: 1000.0,
            connections: 8,
            rounds: if quick { 1 } else { 2 },
            log_level: "info".to_string(),
            profile: None,
        },
    };
    let mut mode = TestMode::Run;
    let mut filters = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let value = |it: &mut std::vec::IntoIter<String>| -> anyhow::Result<String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it.next().with_context(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "--bench" | "--quick" => {}
            "--json" => o.json = Some(PathBuf::from(value(&mut it)?)),
            "--only" => {
                o.sections = value(&mut it)?
                    .split(',')
                    .map(Section::parse)
                    .collect::<anyhow::Result<_>>()?
            }
            "--mirror-sizes" => o.mirror.sizes = parse_list(&value(&mut it)?)?,
            "--samples" => o.mirror.samples = value(&mut it)?.parse()?,
            "--noop-samples" => o.mirror.noop_samples = value(&mut it)?.parse()?,
            "--e2e-samples" => o.e2e_samples = value(&mut it)?.parse()?,
            "--concurrent" => o.mirror.concurrent = value(&mut it)?.parse()?,
            "--webhook-seconds" => o.webhook.seconds = value(&mut it)?.parse()?,
            "--webhook-rate" => o.webhook.rate = value(&mut it)?.parse()?,
            "--connections" => o.webhook.connections = value(&mut it)?.parse()?,
            "--webhook-log-level" => o.webhook.log_level = value(&mut it)?,
            "--webhook-profile" => o.webhook.profile = Some(value(&mut it)?.parse()?),
            "-h" | "--help" if bench => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            // Under `cargo test`: the test harness's own arguments.
            "--list" if !bench => mode = TestMode::List,
            "--ignored" | "--exact" if !bench => mode = TestMode::Skip,
            "--test-threads" | "--color" | "--format" | "--logfile" | "--skip" | "-Z" if !bench => {
                if inline.is_none() {
                    it.next();
                }
            }
            f if !bench && f.starts_with('-') => {}
            f if !bench => filters.push(f.to_string()),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    o.mirror.measured_after = o.sections.contains(&Section::E2e);
    if !bench && !filters.is_empty() && !filters.iter().any(|f| "bench_smoke".contains(f.as_str()))
    {
        mode = TestMode::Skip;
    }
    Ok((o, mode))
}

fn main() -> ExitCode {
    openflux::runtime::allocator::purge_freed_memory_at_once();
    let (options, mode) = match parse_args(std::env::args().skip(1).collect()) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("openflux bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    if !options.bench {
        match mode {
            TestMode::List => {
                println!("bench_smoke: test");
                return ExitCode::SUCCESS;
            }
            TestMode::Skip => return ExitCode::SUCCESS,
            TestMode::Run => {
                stats::self_check();
                process::self_check();
            }
        }
    }
    let mut report = Report {
        judged: !options.quick,
        ..Report::default()
    };
    let started_at = report::date();
    let machine = report::machine();
    report::local_versions(&mut report.versions);
    if options.quick {
        report.note("quick mode: small sizes and short runs; a smoke check, not results");
    }
    let mut failed = Vec::new();

    if options.sections.contains(&Section::Parse) {
        if let Err(e) = parse::run(options.quick, &mut report) {
            eprintln!("parse benchmark failed: {e:#}");
            failed.push(format!("parse: {e:#}"));
        }
    }
    if let Some(requests) = options.webhook.profile {
        return match webhook_setup::profile(&options.webhook, requests) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("webhook profile failed: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if options.sections.contains(&Section::Webhook) {
        if let Err(e) = webhook::run(&options.webhook, &mut report) {
            eprintln!("webhook benchmark failed: {e:#}");
            failed.push(format!("webhook: {e:#}"));
        }
    }
    let cluster_sections: Vec<Section> = options
        .sections
        .iter()
        .copied()
        .filter(|s| !matches!(s, Section::Parse | Section::Webhook))
        .collect();
    if !cluster_sections.is_empty() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async {
            let env = support::cluster().await;
            report::control_plane_versions(&mut report.versions);
            if let Ok(v) = env.client.apiserver_version().await {
                report
                    .versions
                    .insert("kube-apiserver".into(), v.git_version);
            }
            for section in cluster_sections {
                let result = match section {
                    Section::Mirror => mirror::run(&env, &options.mirror, &mut report).await,
                    Section::Admission => {
                        let (quick, in_flight) = (options.quick, options.webhook.connections);
                        admission::run(&env, quick, in_flight, &mut report).await
                    }
                    Section::E2e => {
                        let wait = !options.quick;
                        e2e::run(&env, options.e2e_samples, wait, &mut report).await
                    }
                    Section::Parse | Section::Webhook => Ok(()),
                };
                if let Err(e) = result {
                    eprintln!("{section:?} benchmark failed: {e:#}");
                    failed.push(format!("{section:?}: {e:#}"));
                }
            }
        });
        // Leave nothing running (watches, spawned waits) behind.
        runtime.shutdown_timeout(Duration::from_secs(5));
    }

    for f in &failed {
        report.note(format!("failed: {f}"));
    }
    let mut machine = machine;
    machine["load_average_at_end"] = report::load_average().into();
    println!();
    println!(
        "openflux benchmarks, {} ({} mode)",
        started_at,
        if options.quick { "quick" } else { "full" }
    );
    println!(
        "machine: {} cores, {} GiB, {}; load average {} at start, {} at end",
        machine["cores"],
        machine["memory_gib"],
        machine["cpu"].as_str().unwrap_or("?"),
        machine["load_average_at_start"].as_str().unwrap_or("?"),
        machine["load_average_at_end"].as_str().unwrap_or("?"),
    );
    let versions: Vec<String> = report
        .versions
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    println!("versions: {}", versions.join(", "));
    println!();
    print!("{}", report.table());
    for note in &report.notes {
        println!("note: {note}");
    }
    if let Some(path) = &options.json {
        let mode = if options.quick { "quick" } else { "full" };
        let json = report.to_json(&started_at, mode, &machine);
        let written = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|_| {
                std::fs::write(
                    path,
                    serde_json::to_string_pretty(&json).unwrap_or_default() + "\n",
                )
            });
        match written {
            Ok(()) => {
                println!("figures written to {}", path.display());
                match plot::write_beside(path, &report) {
                    Ok(charts) => {
                        for chart in charts {
                            println!("chart written to {}", chart.display());
                        }
                    }
                    Err(e) => {
                        eprintln!("writing the charts beside {}: {e}", path.display());
                        return ExitCode::FAILURE;
                    }
                }
            }
            Err(e) => {
                eprintln!("writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
