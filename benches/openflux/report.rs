//! The figures of a run: a table on stdout and the same figures as JSON,
//! with when, on what and with which versions they were measured.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde::Serialize;
use serde_json::{json, Value};

/// How a figure compares with its target.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// The target as a person reads it, e.g. `ratio >= 0.80`.
    pub text: String,
    pub met: bool,
}

/// One measured figure, next to its baseline from the same run.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    /// Which benchmark, e.g. `webhook` or `mirror N=1000`.
    pub section: String,
    /// What was measured, e.g. `p99 latency at 1000 req/s`.
    pub name: String,
    pub unit: String,
    pub openflux: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<f64>,
    /// `openflux / baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
}

impl Figure {
    pub fn new(section: &str, name: &str, unit: &str, openflux: f64) -> Self {
        Figure {
            section: section.to_string(),
            name: name.to_string(),
            unit: unit.to_string(),
            openflux,
            baseline: None,
            ratio: None,
            target: None,
        }
    }

    /// Adds the baseline and the ratio `openflux / baseline`.
    pub fn baseline(mut self, baseline: f64) -> Self {
        self.baseline = Some(baseline);
        self.ratio = (baseline != 0.0 && baseline.is_finite()).then(|| self.openflux / baseline);
        self
    }

    pub fn target(mut self, text: impl Into<String>, met: bool) -> Self {
        self.target = Some(Target {
            text: text.into(),
            met,
        });
        self
    }
}

/// Everything a run produced.
#[derive(Default)]
pub struct Report {
    pub figures: Vec<Figure>,
    /// Parameters of the run (sizes, durations, connections).
    pub parameters: BTreeMap<String, Value>,
    /// Versions of what was measured.
    pub versions: BTreeMap<String, String>,
    /// Remarks a reader needs to trust the figures (skipped parts, load).
    pub notes: Vec<String>,
    /// Raw samples behind the figures, by what they are.
    pub samples: BTreeMap<String, Vec<f64>>,
    /// Whether figures are judged against their targets (not in quick mode).
    pub judged: bool,
}

impl Report {
    pub fn push(&mut self, figure: Figure) {
        self.figures.push(figure);
    }

    pub fn param(&mut self, key: &str, value: impl Serialize) {
        self.parameters.insert(
            key.to_string(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
    }

    pub fn note(&mut self, text: impl Into<String>) {
        let text = text.into();
        eprintln!("note: {text}");
        self.notes.push(text);
    }

    /// Keeps raw samples (rounded to microseconds when in milliseconds).
    pub fn samples(&mut self, what: &str, values: &[f64]) {
        let rounded = values
            .iter()
            .map(|v| (v * 1000.0).round() / 1000.0)
            .collect();
        self.samples.insert(what.to_string(), rounded);
    }

    /// The figures as a fixed-width table.
    pub fn table(&self) -> String {
        let header = [
            "section", "figure", "unit", "openflux", "baseline", "ratio", "target", "",
        ];
        let mut rows: Vec<[String; 8]> = vec![header.map(String::from)];
        for f in &self.figures {
            rows.push([
                f.section.clone(),
                f.name.clone(),
                f.unit.clone(),
                number(f.openflux),
                f.baseline.map(number).unwrap_or_default(),
                f.ratio.map(|r| format!("{r:.2}")).unwrap_or_default(),
                f.target
                    .as_ref()
                    .map(|t| t.text.clone())
                    .unwrap_or_default(),
                match &f.target {
                    Some(_) if !self.judged => "(not judged)".to_string(),
                    Some(t) if t.met => "met".to_string(),
                    Some(_) => "MISSED".to_string(),
                    None => String::new(),
                },
            ]);
        }
        let mut widths = [0usize; 8];
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for (i, row) in rows.iter().enumerate() {
            let line: Vec<String> = row
                .iter()
                .zip(widths)
                .enumerate()
                .map(|(col, (cell, w))| {
                    if (3..=5).contains(&col) {
                        format!("{cell:>w$}")
                    } else {
                        format!("{cell:<w$}")
                    }
                })
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
            if i == 0 {
                let total = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        out
    }

    /// The run as JSON.
    pub fn to_json(&self, date: &str, mode: &str, machine: &Value) -> Value {
        json!({
            "date": date,
            "mode": mode,
            "machine": machine,
            "versions": self.versions,
            "parameters": self.parameters,
            "figures": self.figures,
            "notes": self.notes,
            "samples": self.samples,
        })
    }
}

/// A number with as many decimals as its size deserves.
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a == 0.0 || a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Now, UTC, RFC 3339.
pub fn date() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    read("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the figures were measured on.
pub fn machine() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let meminfo = read("/proc/meminfo");
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    json!({
        "cores": cores,
        "memory_gib": (mem_kib as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0,
        "cpu": cpu,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "load_average_at_start": load_average(),
    })
}

fn command_output(dir: &Path, program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The versions known without a cluster: openflux, its commit, the build
/// profile and the Rust compiler.
pub fn local_versions(versions: &mut BTreeMap<String, String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    versions.insert("openflux".into(), env!("CARGO_PKG_VERSION").into());
    if let Some(commit) = command_output(root, "git", &["rev-parse", "--short=12", "HEAD"]) {
        let dirty = command_output(
            root,
            "git",
            &["status", "--porcelain", "--untracked-files=no"],
        )
        .is_some_and(|s| !s.is_empty());
        let commit = if dirty {
            format!("{commit}-dirty")
        } else {
            commit
        };
        versions.insert("openflux commit".into(), commit);
    }
    if let Some(rustc) = command_output(root, "rustc", &["--version"]) {
        versions.insert("rustc".into(), rustc);
    }
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    versions.insert("build profile".into(), profile.into());
}

/// The pinned versions of the local control plane (`e2e/versions.env`).
pub fn control_plane_versions(versions: &mut BTreeMap<String, String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/versions.env");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let Some(component) = name.strip_suffix("_VERSION") else {
            continue;
        };
        let component = component.to_ascii_lowercase().replace('_', "-");
        versions.insert(component, value.trim().trim_matches('"').to_string());
    }
}
