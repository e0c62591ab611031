//! Logs in the shape Flux controllers write them, so the same log queries
//! and dashboards work.
//!
//! Flux logs through controller-runtime's zap logger
//! (`fluxcd/pkg/runtime/logger`): with `--log-encoding=json`, one object a
//! line to stderr, starting with `level` (`trace`, `debug`, `info`,
//! `error`), `ts` (ISO 8601, milliseconds, UTC) and `msg`, followed by the
//! keys of the reconcile: `controller` (the kind in lower case),
//! `controllerGroup`, `controllerKind`, an object named after the kind with
//! `name` and `namespace`, then `namespace`, `name` and `reconcileID`, and
//! last the keys of the message itself (`error` for an error):
//!
//! ```text
//! {"level":"info","ts":"2025-06-01T10:00:00.123Z","msg":"stored artifact","controller":"httpsource","controllerGroup":"sources.openflux.dev","controllerKind":"HttpSource","HttpSource":{"name":"podinfo","namespace":"apps"},"namespace":"apps","name":"podinfo","reconcileID":"0b6f…","revision":"sha256:3f1c…"}
//! ```
//!
//! `--log-encoding=console` writes zap's console form: time, level, message
//! and the keys as one JSON object, separated by tabs.
//!
//! Events of the `tracing` crate are written this way; the keys of the
//! enclosing spans come first, outermost first. [`reconcile_span`] opens the
//! span of one reconcile. Warnings are written with level `error` (Flux has
//! no warning level and logs failures as errors), and `--log-level=error`
//! shows them.

use std::borrow::Cow;
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Span, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use super::flags::{LogArgs, LogEncoding, LogLevel};
use super::id::ControllerId;

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("setting up logging: {0}")]
pub struct LogError(String);

/// Installs the process-wide logger: Flux's shape on stderr, filtered by
/// `--log-level`.
pub fn init(args: &LogArgs) -> Result<(), LogError> {
    let layer =
        FluxLog::new(args.log_encoding, std::io::stderr).with_filter(filter(args.log_level));
    tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .map_err(|e| LogError(e.to_string()))
}

/// What `--log-level` lets through. Below info, the HTTP, TLS and
/// Kubernetes client plumbing stays at info.
pub fn filter(level: LogLevel) -> Targets {
    let max = match level {
        LogLevel::Trace => LevelFilter::TRACE,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Error => LevelFilter::WARN,
    };
    let plumbing = max.min(LevelFilter::INFO);
    // rustls warns once per connection about what a peer sent (an illegal
    // SNI name, a warning alert): any client could fill the log. Below
    // debug only its errors are shown.
    let tls = if max >= LevelFilter::DEBUG {
        plumbing
    } else {
        LevelFilter::ERROR
    };
    [
        "hyper",
        "hyper_util",
        "h2",
        "tower",
        "globset",
        "kube_client",
    ]
    .into_iter()
    .fold(Targets::new().with_default(max), |targets, target| {
        targets.with_target(target, plumbing)
    })
    .with_target("rustls", tls)
}

/// The span of one reconcile of `namespace`/`name`, with controller-runtime's
/// keys and a fresh `reconcileID`. It is an error-level span so that its keys
/// are on every line the reconcile logs, whatever `--log-level` is.
pub fn reconcile_span(controller: &ControllerId, namespace: &str, name: &str) -> Span {
    tracing::error_span!(
        "reconcile",
        controller = %controller.name,
        controllerGroup = %controller.group,
        controllerKind = %controller.kind,
        namespace = %namespace,
        name = %name,
        reconcileID = %super::id::random_id(),
    )
}

/// A `tracing` layer writing Flux's log lines to `writer`.
pub struct FluxLog<W> {
    encoding: LogEncoding,
    writer: W,
}

impl<W> FluxLog<W> {
    pub fn new(encoding: LogEncoding, writer: W) -> Self {
        FluxLog { encoding, writer }
    }
}

/// The keys a span recorded, in order, each value already written as JSON:
/// a line copies them as they are.
#[derive(Default)]
struct Fields(Vec<(Cow<'static, str>, String)>);

impl Fields {
    fn put(&mut self, key: &'static str, value: String) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, old)) => *old = value,
            None => self.0.push((Cow::Borrowed(key), value)),
        }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Adds `<Kind>: {"name", "namespace"}` after `controllerKind`, as
    /// controller-runtime logs the reconciled object.
    fn add_object_key(&mut self) {
        let (Some(kind), Some(name), Some(namespace)) = (
            self.get("controllerKind"),
            self.get("name"),
            self.get("namespace"),
        ) else {
            return;
        };
        let Ok(kind) = serde_json::from_str::<String>(kind) else {
            return;
        };
        let object = format!("{{\"name\":{name},\"namespace\":{namespace}}}");
        let at = self
            .0
            .iter()
            .position(|(k, _)| k == "controllerKind")
            .map_or(self.0.len(), |i| i + 1);
        self.0.insert(at, (Cow::Owned(kind), object));
    }

    /// Writes the keys as `"key":value` pairs, each after a comma.
    fn write_to(&self, out: &mut Vec<u8>) {
        for (key, value) in &self.0 {
            out.push(b',');
            json_string(out, key);
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
        }
    }
}

/// `value` as a JSON string, into `out`.
fn json_string(out: &mut Vec<u8>, value: &str) {
    // Writing a string into memory cannot fail.
    let _ = serde_json::to_writer(out, value);
}

/// `value` as JSON text.
fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_string())
}

/// Collects the fields of a span or event; an event's `message` is its msg.
struct Collect<'a> {
    fields: &'a mut Fields,
    message: Option<&'a mut String>,
}

impl Collect<'_> {
    /// A value already written as JSON (a message that is not text, as
    /// its JSON).
    fn put(&mut self, field: &Field, value: String) {
        match (&mut self.message, field.name()) {
            (Some(message), "message") => **message = value,
            _ => self.fields.put(field.name(), value),
        }
    }

    /// A text value: the message as it is, any other field as JSON.
    fn put_text(&mut self, field: &Field, value: &str) {
        match (&mut self.message, field.name()) {
            (Some(message), "message") => value.clone_into(*message),
            _ => self.put(field, json(value)),
        }
    }
}

impl Visit for Collect<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, json(&value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.to_string());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put_text(field, value);
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put_text(field, &value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put_text(field, &format!("{value:?}"));
    }
}

impl<S, W> Layer<S> for FluxLog<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut Collect {
            fields: &mut fields,
            message: None,
        });
        fields.add_object_key();
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(&mut Collect {
                    fields,
                    message: None,
                });
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut message = String::new();
        let mut own = Fields::default();
        event.record(&mut Collect {
            fields: &mut own,
            message: Some(&mut message),
        });
        // The keys of the enclosing spans, outermost first, then the event's.
        let mut keys = Vec::with_capacity(256);
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<Fields>() {
                    fields.write_to(&mut keys);
                }
            }
        }
        own.write_to(&mut keys);
        let line = format_line(
            self.encoding,
            *event.metadata().level(),
            &timestamp(),
            &message,
            &keys,
        );
        // A log line that cannot be written has nowhere else to go.
        let _ = self.writer.make_writer().write_all(&line);
    }
}

/// Flux's name of a level.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::TRACE => "trace",
        Level::DEBUG => "debug",
        Level::INFO => "info",
        _ => "error",
    }
}

/// Now, as zap's ISO 8601 encoder writes it in UTC.
fn timestamp() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%S%.3fZ", now)
        .unwrap_or_else(|_| now.to_string())
}

/// One log line, newline included. `keys` holds the line's keys as
/// `"key":value` pairs, each after a comma.
fn format_line(
    encoding: LogEncoding,
    level: Level,
    ts: &str,
    message: &str,
    keys: &[u8],
) -> Vec<u8> {
    let mut line = Vec::with_capacity(64 + message.len() + keys.len());
    match encoding {
        LogEncoding::Json => {
            line.extend_from_slice(b"{\"level\":\"");
            line.extend_from_slice(level_name(level).as_bytes());
            line.extend_from_slice(b"\",\"ts\":");
            json_string(&mut line, ts);
            line.extend_from_slice(b",\"msg\":");
            json_string(&mut line, message);
            line.extend_from_slice(keys);
            line.extend_from_slice(b"}\n");
        }
        LogEncoding::Console => {
            let level = level_name(level).to_ascii_uppercase();
            line.extend_from_slice(format!("{ts}\t{level}\t{message}").as_bytes());
            if let Some(pairs) = keys.strip_prefix(b",") {
                line.extend_from_slice(b"\t{");
                line.extend_from_slice(pairs);
                line.push(b'}');
            }
            line.push(b'\n');
        }
    }
    line
}

#[cfg(test)]
mod tests;
