//! The figures of one size of the mirror benchmark, and their targets.

use std::time::Duration;

use super::restart::Restart;
use crate::report::{Figure, Report};
use crate::stats::summarize;

/// What one size of the mirror benchmark measured.
pub struct Measured {
    /// openflux start to all Artifacts present.
    pub present: Duration,
    /// openflux start to the first Artifact present: its start-up.
    pub first: Duration,
    /// N ConfigMap applies, and the N Artifacts openflux writes applied by a
    /// plain client as openflux.
    pub baseline_sync: Duration,
    pub artifact_sync: Duration,
    /// The two-hop relay's first list of the same sources to all its
    /// Artifacts present: reads the sources as openflux does.
    pub relay_sync: Duration,
    /// Per source, during the initial sync.
    pub sync_writes: f64,
    pub sync_reconciles: f64,
    /// CPU seconds of the API server during the initial sync and during
    /// the ConfigMap baseline, and of openflux during the initial sync.
    pub sync_api_cpu: f64,
    pub baseline_api_cpu: f64,
    pub sync_openflux_cpu: Option<f64>,
    /// Propagation latencies (ms): to the Artifact, of the source itself,
    /// and through the two-hop relay.
    pub via_openflux: Vec<f64>,
    pub via_source: Vec<f64>,
    pub via_relay: Vec<f64>,
    /// Peak RSS of the first start, MiB.
    pub peak_rss: Option<f64>,
    pub restart: Restart,
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
    if n == 5000 || n == 50_000 {
        f = f.target("ratio <= 1.2", present / baseline <= 1.2);
    }
    report.push(f);
    report.push(Figure::new(
        section,
        "initial sync: start to the first Artifact",
        "s",
        m.first.as_secs_f64(),
    ));
    report.push(
        Figure::new(
            section,
            "initial sync vs. the same Artifacts by a plain client",
            "s",
            present,
        )
        .baseline(m.artifact_sync.as_secs_f64()),
    );
    report.push(
        Figure::new(
            section,
            "initial sync vs. the two-hop relay's sync of the same sources",
            "s",
            present,
        )
        .baseline(m.relay_sync.as_secs_f64()),
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
    // Where the initial sync's time goes, on cores the API server and
    // openflux share.
    report.push(
        Figure::new(section, "initial sync: API server CPU", "s", m.sync_api_cpu)
            .baseline(m.baseline_api_cpu),
    );
    if let Some(cpu) = m.sync_openflux_cpu {
        report.push(Figure::new(section, "initial sync: openflux CPU", "s", cpu));
    }
    let of_lat = summarize(m.via_openflux.clone());
    let src_lat = summarize(m.via_source.clone());
    let relay_lat = summarize(m.via_relay.clone());
    eprintln!(
        "{section}: {} changes: p50/p99 {:.1}/{:.1} ms via openflux, {:.1}/{:.1} ms through the relay, {:.1}/{:.1} ms for the source itself",
        of_lat.n, of_lat.p50, of_lat.p99, relay_lat.p50, relay_lat.p99, src_lat.p50, src_lat.p99
    );
    let judged = n == 1000 || n == 10_000;
    for (what, openflux, relay, source) in [
        ("p50", of_lat.p50, relay_lat.p50, src_lat.p50),
        ("p99", of_lat.p99, relay_lat.p99, src_lat.p99),
    ] {
        let mut f = Figure::new(
            section,
            &format!("propagation {what} vs. two-hop relay"),
            "ms",
            openflux,
        )
        .baseline(relay);
        if judged {
            f = f.target("ratio <= 1.2", openflux <= 1.2 * relay);
        }
        report.push(f);
        report.push(
            Figure::new(
                section,
                &format!("propagation {what} vs. the source's own update"),
                "ms",
                openflux,
            )
            .baseline(source),
        );
    }
    if let Some(rss) = m.peak_rss {
        let mut f = Figure::new(section, "openflux peak RSS (VmHWM)", "MiB", rss);
        if n == 5000 {
            f = f.target("<= 64 MiB", rss <= 64.0);
        } else if n == 50_000 {
            f = f.target("<= 128 MiB", rss <= 128.0);
        }
        report.push(f);
    }
    if let (Some(restart), Some(first)) = (m.restart.peak_rss, m.peak_rss) {
        let mut f = Figure::new(section, "restart peak RSS vs. first start", "MiB", restart)
            .baseline(first);
        if n == 10_000 || n == 50_000 {
            f = f.target("<= first start", restart <= first);
        }
        report.push(f);
    }
    report.push(Figure::new(
        section,
        "restart: start to every source reconciled",
        "s",
        m.restart.reconciled.as_secs_f64(),
    ));
    report.push(
        Figure::new(
            section,
            "restart: API writes per source",
            "writes",
            m.restart.writes,
        )
        .target("= 0", m.restart.writes.abs() < 1e-9),
    );
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
    report.samples(
        &format!("{section} propagation through the two-hop relay (ms)"),
        &m.via_relay,
    );
}
