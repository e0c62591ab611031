use super::*;
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// A writer into memory.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn controller() -> ControllerId {
    ControllerId {
        name: "httpsource".into(),
        group: "sources.openflux.dev".into(),
        kind: "HttpSource".into(),
    }
}

/// Logs `f` with `encoding` at `level` and returns the lines.
fn logged(encoding: LogEncoding, level: LogLevel, f: impl FnOnce()) -> Vec<String> {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let layer = FluxLog::new(encoding, move || writer.clone()).with_filter(filter(level));
    tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), f);
    buffer.lines()
}

/// The keys of a JSON line, in the order written.
fn keys(line: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut de = serde_json::Deserializer::from_str(line);
    let value = serde::de::Deserializer::deserialize_map(&mut de, KeyOrder(&mut keys));
    value.unwrap();
    keys
}

struct KeyOrder<'a>(&'a mut Vec<String>);

impl<'de> serde::de::Visitor<'de> for KeyOrder<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some((k, _)) = map.next_entry::<String, serde::de::IgnoredAny>()? {
            self.0.push(k);
        }
        Ok(())
    }
}

#[test]
fn json_lines_have_fluxs_shape() {
    let lines = logged(LogEncoding::Json, LogLevel::Info, || {
        let span = reconcile_span(&controller(), "apps", "podinfo");
        let _entered = span.enter();
        tracing::info!(revision = "sha256:aa", files = 3, "stored artifact");
        tracing::warn!(error = "connection refused", "fetch failed");
        tracing::debug!("not shown at info");
    });
    assert_eq!(lines.len(), 2, "{lines:#?}");

    let info: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        keys(&lines[0]),
        [
            "level",
            "ts",
            "msg",
            "controller",
            "controllerGroup",
            "controllerKind",
            "HttpSource",
            "namespace",
            "name",
            "reconcileID",
            "revision",
            "files"
        ]
    );
    assert_eq!(info["level"], "info");
    assert_eq!(info["msg"], "stored artifact");
    assert_eq!(info["controller"], "httpsource");
    assert_eq!(info["controllerGroup"], "sources.openflux.dev");
    assert_eq!(info["controllerKind"], "HttpSource");
    assert_eq!(
        info["HttpSource"],
        serde_json::json!({"name": "podinfo", "namespace": "apps"})
    );
    assert_eq!(info["namespace"], "apps");
    assert_eq!(info["name"], "podinfo");
    assert_eq!(info["files"], 3);
    let ts = info["ts"].as_str().unwrap();
    assert_eq!(ts.len(), "2025-06-01T10:00:00.123Z".len(), "{ts}");
    assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T' && ts.as_bytes()[19] == b'.');

    let warning: Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(warning["level"], "error");
    assert_eq!(warning["error"], "connection refused");
    assert_eq!(warning["reconcileID"], info["reconcileID"]);
}

#[test]
fn each_reconcile_gets_its_own_id() {
    let lines = logged(LogEncoding::Json, LogLevel::Info, || {
        for _ in 0..2 {
            let span = reconcile_span(&controller(), "apps", "podinfo");
            let _entered = span.enter();
            tracing::info!("reconciled");
        }
    });
    let ids: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["reconcileID"].clone())
        .collect();
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn the_error_level_keeps_the_reconcile_keys() {
    let lines = logged(LogEncoding::Json, LogLevel::Error, || {
        let span = reconcile_span(&controller(), "apps", "podinfo");
        let _entered = span.enter();
        tracing::info!("hidden");
        tracing::error!(error = "boom", "reconcile failed");
    });
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["msg"], "reconcile failed");
    assert_eq!(line["name"], "podinfo");
}

#[test]
fn console_lines_are_tab_separated() {
    let lines = logged(LogEncoding::Console, LogLevel::Debug, || {
        tracing::debug!(addr = "0.0.0.0:8080", "metrics server listening");
        tracing::info!("no keys");
    });
    let parts: Vec<&str> = lines[0].split('\t').collect();
    assert_eq!(parts.len(), 4, "{}", lines[0]);
    assert_eq!(parts[1], "DEBUG");
    assert_eq!(parts[2], "metrics server listening");
    assert_eq!(
        serde_json::from_str::<Value>(parts[3]).unwrap(),
        serde_json::json!({"addr": "0.0.0.0:8080"})
    );
    assert_eq!(lines[1].split('\t').count(), 3);
}

#[test]
fn strings_are_escaped() {
    let lines = logged(LogEncoding::Json, LogLevel::Info, || {
        tracing::info!(path = "a\"b\n", "quote \" and newline \n");
    });
    assert_eq!(lines.len(), 1);
    let line: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(line["msg"], "quote \" and newline \n");
    assert_eq!(line["path"], "a\"b\n");
}

#[test]
fn the_filter_follows_fluxs_levels() {
    let enabled =
        |level: LogLevel, target: &str, at: Level| filter(level).would_enable(target, &at);
    assert!(enabled(LogLevel::Error, "openflux", Level::WARN));
    assert!(!enabled(LogLevel::Error, "openflux", Level::INFO));
    assert!(enabled(LogLevel::Info, "openflux", Level::INFO));
    assert!(!enabled(LogLevel::Info, "openflux", Level::DEBUG));
    assert!(enabled(LogLevel::Debug, "openflux", Level::DEBUG));
    assert!(!enabled(
        LogLevel::Debug,
        "hyper_util::client",
        Level::DEBUG
    ));
    assert!(enabled(LogLevel::Trace, "openflux", Level::TRACE));
    assert!(!enabled(LogLevel::Trace, "kube_client", Level::DEBUG));
    // What a TLS peer sent ("Illegal SNI extension") is not worth a line
    // per connection, except when debugging.
    let sni = "rustls::msgs::handshake";
    assert!(!enabled(LogLevel::Info, sni, Level::WARN));
    assert!(enabled(LogLevel::Info, sni, Level::ERROR));
    assert!(enabled(LogLevel::Debug, sni, Level::WARN));
}

/// `line` with its timestamp replaced by `TS`.
fn without_ts(line: &str) -> String {
    let ts = "2025-06-01T10:00:00.123Z".len();
    match line.find("\"ts\":\"") {
        Some(at) => format!("{}TS{}", &line[..at + 6], &line[at + 6 + ts..]),
        None => format!("TS{}", &line[ts..]),
    }
}

#[test]
fn a_line_is_written_exactly() {
    let lines = logged(LogEncoding::Json, LogLevel::Info, || {
        let span = reconcile_span(&controller(), "apps", "podinfo");
        let _entered = span.enter();
        let inner = tracing::info_span!("write", attempt = 1u64, later = tracing::field::Empty);
        inner.record("later", true);
        inner.record("attempt", 2u64);
        let _inner = inner.enter();
        tracing::info!(ratio = 0.5, delta = -3, path = ?"a/b", "stored {} files", 3);
        tracing::info!(message = 7, "ok" = false);
    });
    let id = serde_json::from_str::<Value>(&lines[0]).unwrap()["reconcileID"]
        .as_str()
        .unwrap()
        .to_string();
    let keys = format!(
        "\"controller\":\"httpsource\",\"controllerGroup\":\"sources.openflux.dev\",\
         \"controllerKind\":\"HttpSource\",\"HttpSource\":{{\"name\":\"podinfo\",\"namespace\":\"apps\"}},\
         \"namespace\":\"apps\",\"name\":\"podinfo\",\"reconcileID\":\"{id}\",\"attempt\":2,\"later\":true"
    );
    assert_eq!(
        lines.iter().map(|l| without_ts(l)).collect::<Vec<_>>(),
        [
            format!(
                "{{\"level\":\"info\",\"ts\":\"TS\",\"msg\":\"stored 3 files\",{keys},\
                 \"ratio\":0.5,\"delta\":-3,\"path\":\"\\\"a/b\\\"\"}}"
            ),
            format!("{{\"level\":\"info\",\"ts\":\"TS\",\"msg\":\"7\",{keys},\"ok\":false}}"),
        ]
    );

    let console = logged(LogEncoding::Console, LogLevel::Info, || {
        let span = reconcile_span(&controller(), "apps", "podinfo");
        let _entered = span.enter();
        tracing::warn!(error = "refused", "fetch failed");
    });
    let id = console[0].split("\"reconcileID\":\"").nth(1).unwrap()[..id.len()].to_string();
    assert_eq!(
        without_ts(&console[0]),
        format!(
            "TS\tERROR\tfetch failed\t{{\"controller\":\"httpsource\",\"controllerGroup\":\"sources.openflux.dev\",\
             \"controllerKind\":\"HttpSource\",\"HttpSource\":{{\"name\":\"podinfo\",\"namespace\":\"apps\"}},\
             \"namespace\":\"apps\",\"name\":\"podinfo\",\"reconcileID\":\"{id}\",\"error\":\"refused\"}}"
        )
    );
}
