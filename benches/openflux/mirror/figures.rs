//! The figures of one size of the mirror benchmark, and their targets.

use std::time::Duration;

use crate::report::{Figure, Report};
use crate::stats::summarize;

/// What one size of the mirror benchmark measured.
pub struct Measured {
    /// openflux start to all Artifacts present.
    pub present: Duration,
    /// N ConfigMap applies, and N Artifact applies, by a plain client.
    pub baseline_sync: Duration,
    pub artifact_sync: Duration,
    /// Per source, during the initial sync.
    pub sync_writes: f64,
    pub sync_reconciles: f64,
    /// Propagation latencies (ms): to the Artifact, and of the source itself.
    pub via_openflux: Vec<f64>,
    pub via_source: Vec<f64>,
    pub peak_rss: Option<f64>,
    /// Writes per change and per no-op status write, by openflux's metric
    /// and by the API server's.
    pub of_writes: f64,
    pub api_writes: f64,
    pub of_noop_writes: f64,
    pub api_noop_writes: f64,
}

/// Pushes the figures of size `n` into `report`.
pub fn push(section: &str, n: usize, m: &Measured, report: &mut Report) {
    let present = m.present.as_secs_f64();
    let baseline = m.baseline_sync.as_secs_f64();
    let mut f = Figure::new(
        section,
        "initial sync: start to all Artifacts present",
        "s",
        present,
    )
    .baseline(baseline);
    if n == 5000 {
        f = f.target("ratio <= 2.0", present / baseline <= 2.0);
    }
    report.push(f);
    report.push(
        Figure::new(
            section,
            "initial sync vs. N Artifact applies by a plain client",
            "s",
            present,
        )
        .baseline(m.artifact_sync.as_secs_f64()),
    );
    report.push(
        Figure::new(
            section,
            "initial sync: API writes per source (API server)",
            "writes",
            m.sync_writes,
        )
        .target("= 1", (m.sync_writes - 1.0).abs() < 0.005),
    );
    report.push(Figure::new(
        section,
        "initial sync: mirror reconciles per source",
        "reconciles",
        m.sync_reconciles,
    ));
    let of_lat = summarize(m.via_openflux.clone());
    let src_lat = summarize(m.via_source.clone());
    eprintln!(
        "{section}: {} changes: p50/p99 {:.1}/{:.1} ms via openflux, {:.1}/{:.1} ms for the source itself",
        of_lat.n, of_lat.p50, of_lat.p99, src_lat.p50, src_lat.p99
    );
    report.push(Figure::new(section, "propagation p50", "ms", of_lat.p50).baseline(src_lat.p50));
    let mut f = Figure::new(section, "propagation p99", "ms", of_lat.p99).baseline(src_lat.p99);
    if n == 1000 || n == 10_000 {
        f = f.target("<= baseline + 10 ms", of_lat.p99 <= src_lat.p99 + 10.0);
    }
    report.push(f);
    if let Some(rss) = m.peak_rss {
        let mut f = Figure::new(section, "openflux peak RSS (VmHWM)", "MiB", rss);
        if n == 5000 {
            f = f.target("<= 64 MiB", rss <= 64.0);
        } else if n == 50_000 {
            f = f.target("<= 256 MiB", rss <= 256.0);
        }
        report.push(f);
    }
    let writes = [
        ("writes per change (openflux metric)", m.of_writes, 1),
        ("writes per change (API server)", m.api_writes, 1),
        (
            "writes per no-op write (openflux metric)",
            m.of_noop_writes,
            0,
        ),
        ("writes per no-op write (API server)", m.api_noop_writes, 0),
    ];
    for (what, value, want) in writes {
        let exact = (value - f64::from(want)).abs() < 1e-9;
        report.push(Figure::new(section, what, "writes", value).target(format!("= {want}"), exact));
    }
    report.samples(
        &format!("{section} propagation via openflux (ms)"),
        &m.via_openflux,
    );
    report.samples(
        &format!("{section} propagation of the source itself (ms)"),
        &m.via_source,
    );
}
