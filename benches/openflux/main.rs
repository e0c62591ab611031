//! openflux benchmarks. Every figure is printed next to a baseline measured
//! in the same run, on the same machine, with the same client, and as the
//! ratio of the two; docs/benchmarks.md explains each figure.
//!
//! ```text
//! cargo bench --bench openflux -- [--quick] [--json FILE] [--only parse,siblings,webhook,admission,mirror,e2e,pods,previous]
//!     [--mirror-sizes 100,1000,5000] [--samples 200] [--e2e-samples 5] [--pod-sizes 5000]
//! ```
//!
//! `e2e/bench` brings up the local control plane and runs this. Without a
//! `KUBECONFIG` in the environment the cluster benchmarks start the local
//! control plane themselves (as the end-to-end tests do); the `pods`
//! section starts the nodes cell (`e2e/cluster cell nodes up`) as its
//! tests do.
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
mod options;
mod parse;
mod plot;
mod pods;
mod previous;
mod process;
mod report;
mod siblings;
mod stats;
mod webhook;
mod webhook_setup;

use std::process::ExitCode;
use std::time::Duration;

use options::{parse_args, Section, TestMode};
use report::Report;

pub use options::WebhookParams;

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
    if options.sections.contains(&Section::Siblings) {
        if let Err(e) = siblings::run(options.quick, &mut report) {
            eprintln!("siblings benchmark failed: {e:#}");
            failed.push(format!("siblings: {e:#}"));
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
        .filter(|s| !matches!(s, Section::Parse | Section::Siblings | Section::Webhook))
        .collect();
    if !cluster_sections.is_empty() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async {
            // The local control plane, unless only the nodes cell is used.
            let main_plane = cluster_sections.iter().any(|s| *s != Section::Pods);
            let env = if main_plane {
                Some(support::cluster().await)
            } else {
                None
            };
            report::control_plane_versions(&mut report.versions);
            if let Some(env) = &env {
                if let Ok(v) = env.client.apiserver_version().await {
                    report
                        .versions
                        .insert("kube-apiserver".into(), v.git_version);
                }
            }
            for section in cluster_sections {
                let result = match (section, &env) {
                    (Section::Pods, _) => {
                        let concurrency = options.mirror.setup_concurrency;
                        pods::run(&options.pod_sizes, concurrency, &mut report).await
                    }
                    (_, None) => unreachable!("the local control plane is up for {section:?}"),
                    (_, Some(env)) => match section {
                        Section::Mirror => mirror::run(env, &options.mirror, &mut report).await,
                        Section::Admission => {
                            let (quick, in_flight) = (options.quick, options.webhook.connections);
                            admission::run(env, quick, in_flight, &mut report).await
                        }
                        Section::E2e => {
                            let wait = !options.quick;
                            e2e::run(env, options.e2e_samples, wait, &mut report).await
                        }
                        Section::Previous => {
                            let commit = options.previous_commit.as_deref();
                            previous::run(env, &options.webhook, commit, &mut report).await
                        }
                        Section::Parse | Section::Siblings | Section::Webhook | Section::Pods => {
                            Ok(())
                        }
                    },
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
