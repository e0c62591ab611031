//! Admission metrics, and the log line of each request.

use super::answer::Answer;
use super::limits::LogBudget;
use crate::rewrite::Decision;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    consumer: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConsumerLabels {
    consumer: &'static str,
}

fn duration_histogram() -> Histogram {
    // 0.5 ms .. ~1 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 12))
}

/// The webhook's metrics; cheap to clone, all clones count together.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<ConsumerLabels, Histogram, fn() -> Histogram>,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl WebhookMetrics {
    /// Registers the metrics in `registry` (give the root registry: the
    /// names carry their `openflux_` prefix):
    /// `openflux_admission_requests_total{consumer, outcome}` and
    /// `openflux_admission_duration_seconds{consumer}`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "openflux_admission_requests",
            "Admission requests answered, by consumer resource and outcome (unchanged, rewritten, denied, error)",
            metrics.requests.clone(),
        );
        registry.register(
            "openflux_admission_duration_seconds",
            "Time to answer an admission request, by consumer resource",
            metrics.duration.clone(),
        );
        metrics
    }

    /// Counts one answered request. The labels are static strings, so
    /// counting allocates nothing on the request path.
    pub fn observe(&self, consumer: &'static str, outcome: &'static str, seconds: f64) {
        self.requests
            .get_or_create(&RequestLabels { consumer, outcome })
            .inc();
        self.duration
            .get_or_create(&ConsumerLabels { consumer })
            .observe(seconds);
    }
}

/// Shorthand for [`WebhookMetrics::register`].
pub fn register(registry: &mut Registry) -> WebhookMetrics {
    WebhookMetrics::register(registry)
}

/// Logs what happened to one request. Lines at info and above are about
/// what a client sent, so they come out of the log budget.
pub fn note(logs: &LogBudget, answer: &Answer) {
    let [uid, namespace, name] = &answer.subject;
    let consumer = answer.consumer;
    let outcome = answer.outcome;
    match (&answer.decision, &answer.review) {
        (Some(Decision::Unchanged), _) => {
            tracing::debug!(%uid, consumer, %namespace, %name, outcome, "admitted unchanged")
        }
        (Some(Decision::Rewrite { patch, warnings }), _) => {
            // Debug: every re-apply of such an object is rewritten again.
            tracing::debug!(%uid, consumer, %namespace, %name, outcome, %patch, ?warnings, "rewrote source reference")
        }
        (decision, review) => {
            let Some(suppressed) = logs.allow() else {
                return;
            };
            match (decision, review) {
                (Some(Decision::Deny { message } | Decision::NotServed { message }), _) => {
                    tracing::info!(%uid, consumer, %namespace, %name, outcome, reason = %message, suppressed, "denied")
                }
                (Some(Decision::Error { code, message }), _) if *code >= 500 => {
                    tracing::error!(%uid, consumer, %namespace, %name, outcome, code, error = %message, suppressed, "not decided")
                }
                (Some(Decision::Error { code, message }), _) => {
                    tracing::warn!(%uid, consumer, %namespace, %name, outcome, code, error = %message, suppressed, "not decided")
                }
                (_, Err(message)) => {
                    let status = answer.status.as_u16();
                    tracing::warn!(status, error = %message, suppressed, "admission request refused")
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A writer into memory, for the log lines of a test.
    #[derive(Clone, Default)]
    pub(in crate::webhook) struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Lines {
        /// A subscriber writing Flux's JSON lines here.
        pub(in crate::webhook) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
            use crate::api::runtime::flags::LogEncoding;
            use crate::api::runtime::logging::FluxLog;
            use tracing_subscriber::layer::SubscriberExt;
            let writer = self.clone();
            tracing_subscriber::registry()
                .with(FluxLog::new(LogEncoding::Json, move || writer.clone()))
        }

        /// The lines written, parsed.
        pub(in crate::webhook) fn parsed(&self) -> Vec<serde_json::Value> {
            let text = String::from_utf8(crate::locks::lock(&self.0).clone()).unwrap();
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }
    }

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            crate::locks::lock(&self.0).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Each line about a request keeps its own msg, and what the decision
    /// or the refusal said is a field beside it: a field named `message`
    /// would be taken as the line's msg.
    #[test]
    fn a_decisions_message_is_a_field_beside_the_lines_msg() {
        let lines = Lines::default();
        let subscriber = lines.subscriber();
        let answered = |decision: Option<Decision>, review: Result<Vec<u8>, String>| Answer {
            status: axum::http::StatusCode::BAD_REQUEST,
            review,
            consumer: "kustomizations",
            outcome: "denied",
            subject: ["u".into(), "n".into(), "k".into()],
            decision,
        };
        tracing::subscriber::with_default(subscriber, || {
            let logs = LogBudget::default();
            note(
                &logs,
                &answered(
                    Some(Decision::Deny {
                        message: "no such source".into(),
                    }),
                    Ok(Vec::new()),
                ),
            );
            note(
                &logs,
                &answered(
                    Some(Decision::Error {
                        code: 400,
                        message: "kind too long".into(),
                    }),
                    Ok(Vec::new()),
                ),
            );
            note(&logs, &answered(None, Err("not an AdmissionReview".into())));
        });
        let logged = lines.parsed();
        let pairs: Vec<_> = logged
            .iter()
            .map(|l| {
                (
                    l["msg"].as_str(),
                    l["reason"].as_str().or(l["error"].as_str()),
                )
            })
            .collect();
        assert_eq!(
            pairs,
            [
                (Some("denied"), Some("no such source")),
                (Some("not decided"), Some("kind too long")),
                (
                    Some("admission request refused"),
                    Some("not an AdmissionReview")
                ),
            ],
            "{logged:?}"
        );
    }

    #[test]
    fn encodes_counts_and_durations() {
        let mut registry = Registry::default();
        let metrics = register(&mut registry);
        metrics.observe("kustomizations", "rewritten", 0.002);
        metrics
            .clone()
            .observe("kustomizations", "rewritten", 0.001);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(
                r#"openflux_admission_requests_total{consumer="kustomizations",outcome="rewritten"} 2"#
            ),
            "{out}"
        );
        assert!(
            out.contains(
                r#"openflux_admission_duration_seconds_count{consumer="kustomizations"} 2"#
            ),
            "{out}"
        );
    }
}
