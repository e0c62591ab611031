//! The benchmark's command line: its sections, sizes and durations, and
//! what `cargo test` (which runs it as a smoke test) passes it.

use std::path::PathBuf;

use anyhow::{bail, Context as _};

use crate::mirror;

const USAGE: &str = "\
usage: cargo bench --bench openflux -- [options]

  --quick                 small sizes and short runs (a smoke check, seconds)
  --json FILE             also write the figures as JSON to FILE
  --only LIST             sections to run, of: parse,siblings,webhook,admission,mirror,e2e,pods
                          (default: all of these) and previous (only when named: it builds
                          two releases)
  --mirror-sizes LIST     numbers of GitRepositories (default 100,1000,5000)
  --pod-sizes LIST        numbers of GitRepositories mirrored by openflux installed as Pods
                          on the nodes cell (default 5000)
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
  --previous-commit REV   the release the previous section compares with (default
                          OPENFLUX_PREVIOUS_RELEASE of e2e/versions.env)
  --rounds N              rounds of the webhook and previous sections (default 2; 1 quick)
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Parse,
    Siblings,
    Webhook,
    Admission,
    Mirror,
    E2e,
    Pods,
    /// This tree's webhook against a previous release's; run only when
    /// named in `--only`.
    Previous,
}

impl Section {
    fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "parse" => Section::Parse,
            "siblings" => Section::Siblings,
            "webhook" => Section::Webhook,
            "admission" => Section::Admission,
            "mirror" => Section::Mirror,
            "e2e" | "end-to-end" => Section::E2e,
            "pods" => Section::Pods,
            "previous" => Section::Previous,
            other => {
                bail!("unknown section {other:?} (parse, siblings, webhook, admission, mirror, e2e, pods, previous)")
            }
        })
    }
}

pub struct Options {
    /// Run by `cargo bench` (else by `cargo test`: a smoke test).
    pub bench: bool,
    pub quick: bool,
    pub json: Option<PathBuf>,
    pub sections: Vec<Section>,
    pub mirror: mirror::Params,
    pub e2e_samples: usize,
    /// Numbers of sources of the `pods` section.
    pub pod_sizes: Vec<usize>,
    pub webhook: WebhookParams,
    /// The commit the `previous` section compares with (default: the
    /// previous release of e2e/versions.env).
    pub previous_commit: Option<String>,
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
    /// profiler ([`crate::webhook_setup::profile`]).
    pub profile: Option<usize>,
}

/// What `cargo test` does with this binary.
pub enum TestMode {
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

pub fn parse_args(args: Vec<String>) -> anyhow::Result<(Options, TestMode)> {
    let bench = args.iter().any(|a| a == "--bench");
    let quick = !bench || args.iter().any(|a| a == "--quick");
    let mut o = Options {
        bench,
        quick,
        json: None,
        sections: vec![
            Section::Parse,
            Section::Siblings,
            Section::Webhook,
            Section::Admission,
            Section::Mirror,
            Section::E2e,
            Section::Pods,
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
        pod_sizes: if quick { vec![50] } else { vec![5000] },
        webhook: WebhookParams {
            seconds: if quick { 1.0 } else { 5.0 },
            warmup: if quick { 0.3 } else { 1.0 },
            rate: 1000.0,
            connections: 8,
            rounds: if quick { 1 } else { 2 },
            log_level: "info".to_string(),
            profile: None,
        },
        previous_commit: None,
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
            "--pod-sizes" => o.pod_sizes = parse_list(&value(&mut it)?)?,
            "--concurrent" => o.mirror.concurrent = value(&mut it)?.parse()?,
            "--webhook-seconds" => o.webhook.seconds = value(&mut it)?.parse()?,
            "--webhook-rate" => o.webhook.rate = value(&mut it)?.parse()?,
            "--connections" => o.webhook.connections = value(&mut it)?.parse()?,
            "--webhook-log-level" => o.webhook.log_level = value(&mut it)?,
            "--webhook-profile" => o.webhook.profile = Some(value(&mut it)?.parse()?),
            "--previous-commit" => o.previous_commit = Some(value(&mut it)?),
            "--rounds" => o.webhook.rounds = value(&mut it)?.parse()?,
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
    o.mirror.measured_after =
        o.sections.contains(&Section::E2e) || o.sections.contains(&Section::Pods);
    if !bench && !filters.is_empty() && !filters.iter().any(|f| "bench_smoke".contains(f.as_str()))
    {
        mode = TestMode::Skip;
    }
    Ok((o, mode))
}
