//! Line charts of the mirror's figures against the number of sources, as
//! SVG files written beside the JSON: peak RSS, and propagation latency next
//! to its baseline. Hand-written SVG: no plotting library, nothing to load.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::report::{Figure, Report};

/// One line of a chart: its name, colour and points (sources, value).
pub struct Series {
    pub name: String,
    pub colour: &'static str,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels and its lines. The x axis is logarithmic
/// (sizes span 100 to 50,000 sources).
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Horizontal lines worth seeing (a limit), with their label.
    pub limits: Vec<(f64, String)>,
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round step for about `ticks` divisions of `0..max`.
fn step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(f64::MIN_POSITIVE);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
}

fn label(v: f64) -> String {
    if v >= 1000.0 && (v / 1000.0).fract() == 0.0 {
        format!("{}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

impl Chart {
    /// The chart as an SVG document; `None` without a point to draw.
    pub fn svg(&self) -> Option<String> {
        let points = self.series.iter().flat_map(|s| &s.points);
        let xs: Vec<f64> = points.clone().map(|p| p.0).filter(|x| *x > 0.0).collect();
        let (x_min, x_max) = (
            xs.iter().copied().fold(f64::INFINITY, f64::min),
            xs.iter().copied().fold(0.0, f64::max),
        );
        if xs.is_empty() {
            return None;
        }
        let y_top = points
            .map(|p| p.1)
            .chain(self.limits.iter().map(|l| l.0))
            .fold(0.0, f64::max)
            * 1.1;
        let y_step = step(y_top, 5.0);
        let y_max = (y_top / y_step).ceil().max(1.0) * y_step;
        let (lx_min, lx_max) = (
            x_min.log10().floor(),
            x_max.log10().ceil().max(x_min.log10().floor() + 1.0),
        );
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let x = |v: f64| LEFT + (v.log10() - lx_min) / (lx_max - lx_min) * plot_w;
        let y = |v: f64| TOP + plot_h - v / y_max * plot_h;

        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="20" font-size="14" font-weight="bold">{}</text>"#,
            LEFT,
            escape(&self.title)
        );
        // Grid and y labels.
        let mut v = 0.0;
        while v <= y_max + y_step / 2.0 {
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + plot_w,
                y(v),
                y(v),
                LEFT - 6.0,
                y(v) + 4.0,
                label(v)
            );
            v += y_step;
        }
        // Decades on x, and each measured size.
        let mut sizes: Vec<f64> = xs.clone();
        sizes.sort_by(f64::total_cmp);
        sizes.dedup();
        for s in &sizes {
            let _ = writeln!(
                out,
                r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}" stroke="#eee"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
                x(*s),
                TOP,
                TOP + plot_h,
                TOP + plot_h + 16.0,
                label(*s)
            );
        }
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#444"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 10.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            out,
            r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );
        for (value, text) in &self.limits {
            let (x_end, line_y) = (LEFT + plot_w, y(*value));
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" x2="{x_end:.1}" y1="{line_y:.1}" y2="{line_y:.1}" stroke="#c00" stroke-dasharray="2 3"/><text x="{:.1}" y="{:.1}" fill="#c00">{}</text>"##,
                x_end + 6.0,
                line_y + 4.0,
                escape(text)
            );
        }
        for (i, s) in self.series.iter().enumerate() {
            let mut pts: Vec<(f64, f64)> = s.points.clone();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let path: Vec<String> = pts
                .iter()
                .map(|(px, py)| format!("{:.1},{:.1}", x(*px), y(*py)))
                .collect();
            let dash = if s.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
                path.join(" "),
                s.colour
            );
            for (px, py) in &pts {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                    x(*px),
                    y(*py),
                    s.colour
                );
            }
            let ly = TOP + 12.0 + 18.0 * i as f64;
            let _ = writeln!(
                out,
                r#"<line x1="{0:.1}" x2="{1:.1}" y1="{2:.1}" y2="{2:.1}" stroke="{3}" stroke-width="2"{dash}/><text x="{4:.1}" y="{5:.1}">{6}</text>"#,
                LEFT + plot_w + 6.0,
                LEFT + plot_w + 24.0,
                ly,
                s.colour,
                LEFT + plot_w + 28.0,
                ly + 4.0,
                escape(&s.name)
            );
        }
        out.push_str("</svg>\n");
        Some(out)
    }
}

/// The number of sources of a `mirror N=<n>` section.
fn sources(section: &str) -> Option<f64> {
    section.strip_prefix("mirror N=")?.parse().ok()
}

/// Points (sources, value) of the figure named `name`, openflux's value or
/// the baseline's.
fn curve(figures: &[Figure], name: &str, baseline: bool) -> Vec<(f64, f64)> {
    figures
        .iter()
        .filter(|f| f.name == name)
        .filter_map(|f| {
            let n = sources(&f.section)?;
            let v = if baseline { f.baseline? } else { f.openflux };
            v.is_finite().then_some((n, v))
        })
        .collect()
}

/// The charts of a run's mirror figures.
pub fn charts(report: &Report) -> Vec<(&'static str, Chart)> {
    let f = &report.figures;
    let rss = Chart {
        title: "openflux peak RSS by number of sources".into(),
        x_label: "sources (log scale)".into(),
        y_label: "MiB".into(),
        series: vec![Series {
            name: "peak RSS".into(),
            colour: "#1f77b4",
            dashed: false,
            points: curve(f, "openflux peak RSS (VmHWM)", false),
        }],
        limits: vec![
            (64.0, "64 MiB at 5k".into()),
            (256.0, "256 MiB at 50k".into()),
        ],
    };
    let propagation = Chart {
        title: "Propagation latency by number of sources".into(),
        x_label: "sources (log scale)".into(),
        y_label: "ms".into(),
        series: vec![
            Series {
                name: "openflux p99".into(),
                colour: "#d62728",
                dashed: false,
                points: curve(f, "propagation p99", false),
            },
            Series {
                name: "watch p99".into(),
                colour: "#d62728",
                dashed: true,
                points: curve(f, "propagation p99", true),
            },
            Series {
                name: "openflux p50".into(),
                colour: "#1f77b4",
                dashed: false,
                points: curve(f, "propagation p50", false),
            },
            Series {
                name: "watch p50".into(),
                colour: "#1f77b4",
                dashed: true,
                points: curve(f, "propagation p50", true),
            },
        ],
        limits: vec![],
    };
    vec![("rss", rss), ("propagation", propagation)]
}

/// Writes each chart with points beside `json` as `<stem>-<chart>.svg`;
/// returns the files written.
pub fn write_beside(json: &Path, report: &Report) -> std::io::Result<Vec<PathBuf>> {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "openflux".into());
    let dir = json.parent().unwrap_or(Path::new("."));
    let mut written = Vec::new();
    for (name, chart) in charts(report) {
        if chart.series.iter().all(|s| s.points.is_empty()) {
            continue;
        }
        let Some(svg) = chart.svg() else { continue };
        let path = dir.join(format!("{stem}-{name}.svg"));
        std::fs::write(&path, svg)?;
        written.push(path);
    }
    Ok(written)
}
