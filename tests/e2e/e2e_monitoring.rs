//! End to end: the shipped monitoring (`manifests/monitoring/`) against a
//! real Prometheus (Debian's `prometheus`, with its `promtool`) scraping
//! openflux on the local control plane.
//!
//! promtool checks the alert rules; then openflux runs with its webhook and
//! sees what an operator must see (a mirrored GitRepository, a custom source
//! exported and a consumer rewritten to it, a denied reference, a mirror
//! whose Artifact name is taken, an Artifact from a writer that may not
//! speak for its source), and every dashboard
//! query returns data, every alert expression's series exist, and the alert
//! for an untrusted Artifact fires.

use openflux_testkit as support;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use support::openflux::publish;
use support::webhook::openflux_with_webhook;
use support::writers::{self, Written};
use support::{cluster, unique_name, wait_for, Env, TIMEOUT};

const ALERTS: &str = include_str!("../../manifests/monitoring/alerts.yaml");
const DASHBOARD: &str = include_str!("../../manifests/monitoring/dashboard.json");
const TEST_GROUP: &str = "monitoring.e2e.openflux.dev";
const TEST_SOURCE: &str = "monitoring.e2e.openflux.dev/v1";

/// Prometheus and promtool: Debian's `prometheus` package, installed when
/// missing (as root, like the rest of the local control plane's packages).
fn prometheus_tools() {
    // One install at a time: the tests of this file run in parallel, and a
    // second apt-get waits for no lock, it fails.
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALLING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let present = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if present("prometheus") && present("promtool") {
        return;
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = [
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "prometheus",
    ];
    // A new machine has no package lists yet.
    let installed = apt(&install) || (apt(&["update", "-qq"]) && apt(&install));
    assert!(
        installed && present("promtool"),
        "this test needs Debian's prometheus package (prometheus and promtool); install it with `apt-get install prometheus`"
    );
}

/// The `spec` of the shipped PrometheusRule: a plain Prometheus rule file.
fn rule_file(dir: &Path) -> std::path::PathBuf {
    let rule: Value = serde_yaml_ng::from_str(ALERTS).expect("alerts.yaml parses");
    let path = dir.join("alerts.rules.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&rule["spec"]).unwrap()).unwrap();
    path
}

fn alert_rules() -> Vec<(String, String)> {
    let rule: Value = serde_yaml_ng::from_str(ALERTS).expect("alerts.yaml parses");
    rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or_default().to_string(),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("dashboard.json parses");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queries.push((
                panel["title"].as_str().unwrap_or_default().to_string(),
                target["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    queries
}

/// The metric names an expression reads.
fn metric_names(expr: &str) -> Vec<String> {
    const NOT_METRICS: &[&str] = &[
        "sum",
        "max",
        "rate",
        "increase",
        "histogram_quantile",
        "by",
        "le",
        "and",
        "or",
    ];
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        rest = &rest[start..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        let after = rest[end..].trim_start();
        let is_metric = (word.starts_with("openflux_") || word.starts_with("controller_runtime_"))
            && !after.starts_with('=')
            && !NOT_METRICS.contains(&word);
        if is_metric && !names.iter().any(|n| n == word) {
            names.push(word.to_string());
        }
        // Skip label matchers' values.
        rest = &rest[end..];
        if let Some(stripped) = rest.strip_prefix("=\"").or(rest.strip_prefix("~\"")) {
            rest = stripped.split_once('"').map_or("", |(_, r)| r);
        }
    }
    names
}

struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_prometheus(dir: &Path, target: std::net::SocketAddr, rules: &Path) -> Prometheus {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: openflux\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            rules.display(),
            target.port()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting prometheus");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

async fn query(prometheus: &Prometheus, expr: &str) -> Option<Vec<Value>> {
    let url = reqwest::Url::parse_with_params(
        &format!("{}/api/v1/query", prometheus.url),
        &[("query", expr)],
    )
    .ok()?;
    let text = reqwest::get(url).await.ok()?.text().await.ok()?;
    let body: Value = serde_json::from_str(&text).ok()?;
    (body["status"] == "success").then(|| {
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    })
}

async fn has_data(prometheus: &Prometheus, what: &str, expr: &str) {
    wait_for(
        &format!("{what}: `{expr}` to return data"),
        TIMEOUT,
        || async {
            let result = query(prometheus, expr).await?;
            (!result.is_empty()).then_some(())
        },
    )
    .await;
}

#[test]
fn promtool_accepts_the_alert_rules() {
    prometheus_tools();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(rule_file(dir.path()))
        .output()
        .expect("running promtool");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_metric_names_of_an_expression_are_read_as_prometheus_reads_them() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le, controller) (rate(controller_runtime_reconcile_time_seconds_bucket{controller=~".+-mirror"}[5m])))"#
        ),
        ["controller_runtime_reconcile_time_seconds_bucket"]
    );
    assert_eq!(
        metric_names(r#"sum(openflux_artifacts{ready="False", reason="openflux_x"}) > 0"#),
        ["openflux_artifacts"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alerts_read_what_openflux_exports() {
    prometheus_tools();
    let env = cluster().await;
    install(&env).await;
    let ns = env.namespace("monitoring").await;
    let n = ns.name().to_string();
    let (of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;

    // What an operator watches: a mirrored GitRepository ...
    let (repo, _) = env
        .fixtures()
        .create_repo(
            &unique_name("monitoring"),
            &[("cm.yaml", &support::configmap_yaml("m"))],
        )
        .expect("a git repository");
    env.apply(&json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
        "metadata": {"name": "app", "namespace": n},
        "spec": {"url": repo.url, "interval": "10m", "ref": {"branch": "main"}}
    }))
    .await
    .expect("creating the GitRepository");
    // ... a GitRepository whose mirrored Artifact's name someone else's
    // Artifact holds ...
    let taken = publish(
        env.fixtures(),
        &n,
        "taken",
        "v1",
        &[("cm.yaml", &support::configmap_yaml("t"))],
    );
    env.apply(&json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
        "metadata": {"name": "gitrepository-conflict", "namespace": n},
        "spec": taken,
    }))
    .await
    .expect("an Artifact under a mirror's name");
    env.apply(&json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
        "metadata": {"name": "conflict", "namespace": n},
        "spec": {"url": repo.url, "interval": "10m", "ref": {"branch": "main"}}
    }))
    .await
    .expect("creating the conflicting GitRepository");
    // ... a custom source whose own controller publishes it, a consumer
    // rewritten to it, a reference openflux denies ...
    writers::intruder_and_producer(&env, TEST_GROUP, &n).await;
    let own = writers::test_source(&env, TEST_GROUP, &n, "own").await;
    writers::write_as(
        &env,
        &n,
        "producer",
        Written {
            group: TEST_GROUP,
            name: "own",
            source: "own",
            uid: &own,
            labels: None,
        },
    )
    .await;
    env.apply(&kustomization(
        &n,
        "app",
        json!({"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "own"}),
    ))
    .await
    .expect("a consumer of the custom source");
    let denied = env
        .apply(&kustomization(
            &n,
            "denied",
            json!({"kind": "NoSuchSourceKind", "name": "x"}),
        ))
        .await;
    assert!(
        denied.is_err(),
        "a reference to a kind nobody serves is denied"
    );
    // ... and an Artifact from a writer that may not speak for its source.
    let victim = writers::test_source(&env, TEST_GROUP, &n, "victim").await;
    writers::write_as(
        &env,
        &n,
        "intruder",
        Written {
            group: TEST_GROUP,
            name: "victim",
            source: "victim",
            uid: &victim,
            labels: None,
        },
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let rules = rule_file(dir.path());
    let prometheus = start_prometheus(dir.path(), of.metrics_addr, &rules);
    has_data(
        &prometheus,
        "openflux is scraped",
        r#"up{job="openflux"} == 1"#,
    )
    .await;

    for (title, expr) in dashboard_queries() {
        has_data(&prometheus, &format!("dashboard panel {title:?}"), &expr).await;
    }
    for (alert, expr) in alert_rules() {
        for name in metric_names(&expr) {
            has_data(
                &prometheus,
                &format!("alert {alert}"),
                &format!("count({name})"),
            )
            .await;
        }
    }
    let firing = r#"ALERTS{alertname="OpenfluxUntrustedArtifact", alertstate="firing"}"#;
    has_data(&prometheus, "the untrusted Artifact's alert", firing).await;
    ns.delete().await;
}

async fn install(env: &Env) {
    support::install_artifact_crd(env).await;
    support::install_test_source_crd(env, TEST_GROUP).await;
    support::wait_established(
        env,
        &[
            "artifacts.openflux.dev",
            &format!("testsources.{TEST_GROUP}"),
        ],
    )
    .await;
}

fn kustomization(ns: &str, name: &str, source_ref: Value) -> Value {
    json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"interval": "10m", "path": "./", "prune": true, "sourceRef": source_ref},
    })
}
