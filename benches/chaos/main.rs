//! `make chaos`: the webhook and leader election under abuse, each scenario
//! judged against a bound and, where it makes sense, printed beside a
//! baseline measured in the same run. docs/reliability.md explains them.
//!
//! ```text
//! cargo bench -p openflux --bench chaos -- [--quick] [--json FILE]
//!     [--only reviews,rotation,memory,failover,restart] [--reviews N] [--seconds S]
//!     [--updates N]
//! ```
//!
//! Run by `cargo test` (no `--bench` argument) it is a smoke test: small
//! sizes, no cluster scenario, nothing written.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context as _};

#[path = "../../tests/chaos/failover.rs"]
mod failover;
#[path = "../../tests/chaos/restart.rs"]
mod restart;
#[path = "../../tests/chaos/reviews.rs"]
mod reviews;

mod client;
mod scenarios;
mod server;

/// One measured figure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub scenario: &'static str,
    pub measure: String,
    pub value: f64,
    pub unit: &'static str,
    /// What it is compared with: a bound, or a baseline from the same run.
    pub against: String,
    pub pass: bool,
}

impl Row {
    pub fn new(scenario: &'static str, measure: &str, value: f64, unit: &'static str) -> Self {
        Row {
            scenario,
            measure: measure.to_string(),
            value,
            unit,
            against: String::new(),
            pass: true,
        }
    }

    /// Passes when `value <= bound`.
    pub fn at_most(mut self, bound: f64) -> Self {
        self.against = format!("<= {bound}");
        self.pass = self.value <= bound;
        self
    }

    pub fn baseline(mut self, baseline: f64) -> Self {
        self.against = format!("baseline {baseline:.1}");
        self
    }
}

pub struct Options {
    pub quick: bool,
    pub reviews: u64,
    pub seconds: u64,
    pub updates: usize,
}

const USAGE: &str = "usage: cargo bench -p openflux --bench chaos -- [--quick] [--json FILE] \
[--only reviews,rotation,memory,failover,restart] [--reviews N] [--seconds S] [--updates N]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        let dir = args.get(i + 1).map(PathBuf::from).unwrap_or_default();
        return match server::serve(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("chaos webhook: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: {e:#}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> anyhow::Result<bool> {
    let benching = args.iter().any(|a| a == "--bench");
    let mut quick = !benching;
    let mut json = None;
    let mut only: Vec<String> = ["reviews", "rotation", "memory", "failover", "restart"]
        .map(String::from)
        .to_vec();
    if !benching {
        only.retain(|s| s != "failover" && s != "restart");
    }
    let mut options = Options {
        quick,
        reviews: 1_000_000,
        seconds: 10,
        updates: 1000,
    };
    // Under `cargo test` the test harness's own arguments come along:
    // `--list` lists the one smoke test, a filter or `--ignored` that does
    // not select it skips it, the rest is ignored.
    let mut filters = Vec::new();
    let mut it = args.into_iter().filter(|a| a != "--bench");
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .with_context(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--quick" => quick = true,
            "--json" if benching => json = Some(PathBuf::from(value()?)),
            "--only" if benching => only = value()?.split(',').map(String::from).collect(),
            "--reviews" if benching => options.reviews = value()?.parse()?,
            "--seconds" if benching => options.seconds = value()?.parse()?,
            "--updates" if benching => options.updates = value()?.parse()?,
            "--list" if !benching => {
                println!("chaos_smoke: test");
                return Ok(true);
            }
            "--ignored" | "--exact" if !benching => return Ok(true),
            "--test-threads" | "--color" | "--format" | "--logfile" | "--skip" | "-Z"
                if !benching =>
            {
                if inline.is_none() {
                    it.next();
                }
            }
            f if !benching && f.starts_with('-') => {}
            f if !benching => filters.push(f.to_string()),
            other => bail!("unknown argument {other}"),
        }
    }
    if !filters.is_empty() && !filters.iter().any(|f| "chaos_smoke".contains(f.as_str())) {
        return Ok(true);
    }
    if quick {
        options.quick = true;
        options.reviews = options.reviews.min(500);
        options.seconds = options.seconds.min(2);
        options.updates = options.updates.min(100);
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for scenario in &only {
        eprintln!("chaos: {scenario} ...");
        let found = match scenario.as_str() {
            "reviews" => runtime.block_on(scenarios::reviews(&options))?,
            "rotation" => runtime.block_on(scenarios::rotation(&options))?,
            "memory" => runtime.block_on(scenarios::memory(&options))?,
            "failover" => runtime.block_on(scenarios::failover(&options))?,
            "restart" => runtime.block_on(scenarios::restart(&options))?,
            other => bail!("unknown scenario {other}"),
        };
        rows.extend(found);
    }
    println!(
        "\n{:<9} {:<48} {:>12} {:<6} {:<18} result",
        "scenario", "measure", "value", "unit", "against"
    );
    for r in &rows {
        let result = if r.pass { "ok" } else { "FAIL" };
        println!(
            "{:<9} {:<48} {:>12.2} {:<6} {:<18} {result}",
            r.scenario, r.measure, r.value, r.unit, r.against
        );
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("(machine: {cores} cores)");
    if let Some(path) = json {
        let doc = serde_json::json!({"cores": cores, "quick": options.quick, "rows": rows});
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("chaos: wrote {}", path.display());
    }
    Ok(rows.iter().all(|r| r.pass))
}
