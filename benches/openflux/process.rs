//! `openflux run` as a child process (its PID gives the peak memory), and
//! readings of Prometheus metrics: openflux's own and the API server's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::support::openflux::{binary, free_addr, http_get, stop_child, tail};
use crate::support::{unique_name, Env};

/// A running `openflux run`, stopped on drop.
pub struct Openflux {
    child: Option<Child>,
    pub pid: u32,
    pub metrics_addr: SocketAddr,
    /// Where it serves the webhook (loopback).
    pub webhook_addr: SocketAddr,
    pub log: PathBuf,
    /// When the process was started.
    pub started: Instant,
}

impl Openflux {
    /// Starts `openflux run` with `args` against the bench cluster; does not
    /// wait for it (see [`Openflux::wait_serving`]).
    pub fn spawn(env: &Env, name: &str, args: &[String]) -> anyhow::Result<Self> {
        Self::spawn_binary(env, &binary(), name, args)
    }

    /// [`Openflux::spawn`] of the binary at `binary` (another build of
    /// openflux, taking the same flags).
    pub fn spawn_binary(
        env: &Env,
        binary: &Path,
        name: &str,
        args: &[String],
    ) -> anyhow::Result<Self> {
        let metrics_addr = free_addr();
        let health_addr = free_addr();
        // Every `openflux run` serves the webhook too: keep it on loopback.
        let webhook_addr = free_addr();
        let log = std::env::temp_dir().join(format!("{}.log", unique_name(name)));
        let out = std::fs::File::create(&log).context("creating the openflux log")?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(binary);
        cmd.arg("run")
            .arg(format!("--metrics-addr={metrics_addr}"))
            .arg(format!("--health-addr={health_addr}"))
            .arg(format!("--webhook-addr={webhook_addr}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // As openflux's own identity where the control plane has one: the
        // admission policy on exports lets only that identity write them.
        if let Some(kc) = crate::support::identity::openflux_kubeconfig(env) {
            cmd.env("KUBECONFIG", kc);
        }
        let started = Instant::now();
        let child = cmd.spawn().context("starting openflux")?;
        Ok(Openflux {
            pid: child.id(),
            child: Some(child),
            metrics_addr,
            webhook_addr,
            log,
            started,
        })
    }

    /// Waits (bounded) until the metrics endpoint answers: the process is
    /// up and connected. The benchmarks then wait for the work itself (the
    /// Artifacts, the exports), which proves more than `/readyz` does.
    pub async fn wait_serving(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            if let Some((200, _)) = http_get(self.metrics_addr, "/metrics").await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "openflux did not serve its metrics after {timeout:?}:\n{}",
                    tail(&self.log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fails with the log's tail if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            bail!("openflux exited ({status}):\n{}", tail(&self.log, 40));
        }
        Ok(())
    }

    /// Peak resident set size (VmHWM) in bytes.
    pub fn peak_rss(&self) -> Option<u64> {
        status_kib(self.pid, "VmHWM:").map(|k| k * 1024)
    }

    /// CPU time (user and system, all threads) used so far, in seconds.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // After the command name in parentheses: state, then 10 fields,
        // then utime and stime in clock ticks (proc(5)).
        let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
        let utime: f64 = fields.next()?.parse().ok()?;
        let stime: f64 = fields.next()?.parse().ok()?;
        // SAFETY: sysconf reads a constant of the system.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (ticks > 0).then(|| (utime + stime) / ticks as f64)
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        match http_get(self.metrics_addr, "/metrics").await {
            Some((200, body)) => Ok(body),
            other => bail!("GET openflux /metrics: {other:?}"),
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// SIGTERM, then kill after 10 s.
    pub fn stop(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let Some(child) = self.child.take() else {
            return;
        };
        // The log is kept only when the process had to be killed.
        let status = stop_child(child);
        if status.is_some_and(|s| s.signal() != Some(9)) {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

impl Drop for Openflux {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- openflux log ({}) ----\n{}",
                self.log.display(),
                tail(&self.log, 60)
            );
        }
        self.stop();
    }
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Label names and values of a sample.
type Labels = Vec<(String, String)>;

/// The name, labels and value of one sample line of the Prometheus text format.
fn parse_sample(line: &str) -> Option<(&str, Labels, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let Some(open) = line.find('{') else {
        let mut parts = line.split_whitespace();
        let name = parts.next()?;
        return Some((name, Vec::new(), parts.next()?.parse().ok()?));
    };
    let name = &line[..open];
    let mut labels = Vec::new();
    let mut rest = &line[open + 1..];
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            let value = after.split_whitespace().next()?.parse().ok()?;
            return Some((name, labels, value));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        rest = rest[eq + 1..].strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut close = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next()? {
                    (_, 'n') => value.push('\n'),
                    (_, c) => value.push(c),
                },
                '"' => {
                    close = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        rest = &rest[close? + 1..];
        labels.push((key, value));
    }
}

/// Sum of the samples of metric `name` whose labels satisfy `keep`.
pub fn metric_sum(text: &str, name: &str, keep: impl Fn(&[(String, String)]) -> bool) -> f64 {
    text.lines()
        .filter_map(parse_sample)
        .filter(|(n, labels, _)| *n == name && keep(labels))
        .map(|(_, _, v)| v)
        .sum()
}

/// The value of label `key`, if set.
pub fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Mirror writes openflux counted, for one source kind.
pub fn mirrored_writes(metrics: &str, kind: &str) -> f64 {
    metric_sum(metrics, "openflux_mirrored_writes_total", |l| {
        label(l, "kind") == Some(kind)
    })
}

/// Reconciles the mirror controllers (`<kind>-mirror`) finished.
pub fn mirror_reconciles(metrics: &str) -> f64 {
    metric_sum(metrics, "controller_runtime_reconcile_total", |l| {
        label(l, "controller").is_some_and(|c| c.ends_with("-mirror"))
    })
}

/// The API server's `/metrics` text (the admin kubeconfig may read it).
pub async fn apiserver_metrics(client: &kube::Client) -> anyhow::Result<String> {
    let request = hyper::Request::get("/metrics")
        .body(Vec::new())
        .context("building the request")?;
    client
        .request_text(request)
        .await
        .context("GET /metrics of the API server")
}

/// CPU seconds the API server process has used, from its metrics.
pub fn apiserver_cpu_seconds(metrics: &str) -> f64 {
    metric_sum(metrics, "process_cpu_seconds_total", |_| true)
}

/// Requests that write (create, update, patch, apply, delete) the resource
/// `group`/`resource`, any subresource, counted by the API server.
pub fn apiserver_writes(metrics: &str, group: &str, resource: &str) -> f64 {
    metric_sum(metrics, "apiserver_request_total", |l| {
        label(l, "group") == Some(group)
            && label(l, "resource") == Some(resource)
            && !matches!(
                label(l, "verb"),
                Some("GET" | "LIST" | "WATCH" | "CONNECT") | None
            )
    })
}

/// The API server's requests by verb and resource (`LIST artifacts`,
/// `APPLY gitrepositories/status`) and its watch events by resource
/// (`watch events artifacts`): what a phase asked of it.
pub fn apiserver_requests(metrics: &str) -> BTreeMap<String, f64> {
    let mut counts = BTreeMap::new();
    for (name, labels, value) in metrics.lines().filter_map(parse_sample) {
        let key = match name {
            "apiserver_request_total" => {
                let verb = label(&labels, "verb").unwrap_or("");
                let resource = label(&labels, "resource").unwrap_or("");
                match label(&labels, "subresource").filter(|s| !s.is_empty()) {
                    Some(sub) => format!("{verb} {resource}/{sub}"),
                    None => format!("{verb} {resource}"),
                }
            }
            "apiserver_watch_events_total" => {
                format!("watch events {}", label(&labels, "resource").unwrap_or(""))
            }
            _ => continue,
        };
        *counts.entry(key).or_insert(0.0) += value;
    }
    counts
}

/// What grew between two [`apiserver_requests`] counts, largest first.
pub fn requests_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(String, f64)> {
    let mut grown: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d >= 1.0)
        .collect();
    grown.sort_by(|a, b| b.1.total_cmp(&a.1));
    grown
}

/// Smoke checks of the parser, run with the bench in test mode.
pub fn self_check() {
    let text = "# HELP x\n\
        apiserver_request_total{code=\"201\",component=\"apiserver\",group=\"openflux.dev\",resource=\"artifacts\",scope=\"resource\",subresource=\"\",verb=\"APPLY\",version=\"v1alpha1\"} 7\n\
        apiserver_request_total{code=\"200\",group=\"openflux.dev\",resource=\"artifacts\",subresource=\"status\",verb=\"APPLY\"} 3\n\
        apiserver_request_total{code=\"200\",group=\"openflux.dev\",resource=\"artifacts\",verb=\"WATCH\"} 100\n\
        apiserver_request_total{code=\"200\",group=\"\",resource=\"configmaps\",verb=\"POST\"} 9\n\
        openflux_mirrored_writes_total{kind=\"GitRepository\"} 12\n\
        controller_runtime_reconcile_total{controller=\"gitrepository-mirror\",result=\"success\"} 4\n\
        controller_runtime_reconcile_total{controller=\"ocirepository-mirror\",result=\"error\"} 1\n\
        controller_runtime_reconcile_total{controller=\"artifact\",result=\"success\"} 2\n\
        odd{msg=\"a,b=\\\"c\\\"\",kind=\"GitRepository\"} 1.5e3\n\
        apiserver_watch_events_total{group=\"openflux.dev\",resource=\"artifacts\",version=\"v1\"} 30\n\
        process_cpu_seconds_total 12.5\n\
        plain 4\n";
    assert_eq!(apiserver_writes(text, "openflux.dev", "artifacts"), 10.0);
    assert_eq!(apiserver_writes(text, "", "configmaps"), 9.0);
    assert_eq!(mirrored_writes(text, "GitRepository"), 12.0);
    assert_eq!(mirror_reconciles(text), 5.0);
    assert_eq!(
        metric_sum(text, "odd", |l| label(l, "kind") == Some("GitRepository")),
        1500.0
    );
    assert_eq!(metric_sum(text, "plain", |_| true), 4.0);
    assert_eq!(apiserver_cpu_seconds(text), 12.5);
    let after = apiserver_requests(text);
    assert_eq!(after["APPLY artifacts/status"], 3.0);
    assert_eq!(after["watch events artifacts"], 30.0);
    let mut before = after.clone();
    before.insert("APPLY artifacts".into(), 5.0);
    let grown = requests_between(&before, &after);
    assert_eq!(grown, vec![("APPLY artifacts".to_string(), 2.0)]);
}
