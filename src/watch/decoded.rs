//! Objects that cannot be decoded are set aside, one at a time.
//!
//! Whatever the API server stores under a CRD's schema can be listed, but
//! not everything it stores fits the Rust types openflux reads it into (a
//! field the schema leaves open, a format the API server checks more
//! loosely than the decoder). kube decodes a list in one piece, so one such
//! object would fail every list of its kind, and with it every start of a
//! new replica. [`Decoded`] decodes each object of a list or a watch event
//! on its own: one that does not fit becomes an [`Undecodable`] naming it,
//! which the watch skips and hands to [`Rejects`]: a Warning Event on the
//! object, a log line and the `openflux_undecodable_objects_total` metric,
//! once for each version of the object.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::core::{Status, WatchEvent};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::depth::{DECODER_DEPTH, MANAGED_FIELDS_DEPTH};
use crate::api::runtime::events::{EventRecorder, FluxEvent};

/// Longest part of a decoding error kept (the error may quote the input).
const ERROR_CHARS: usize = 300;
/// Undecodable objects waiting to be reported; past it, more are dropped
/// (the next list reports them again).
const QUEUE: usize = 256;
/// Versions remembered as reported; past it, the memory starts again.
const REMEMBERED: usize = 4096;
/// The reason of the Warning Event on an object that cannot be decoded.
pub const REASON: &str = "Undecodable";

/// One object as read: decoded, or set aside.
#[derive(Clone, Debug)]
pub enum Decoded<K> {
    Object(K),
    Undecodable(Undecodable),
}

/// An object that did not decode: what could be read of it, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Undecodable {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// The decoder's error, cut to [`ERROR_CHARS`].
    pub error: String,
}

/// The few fields read of an object that did not decode whole; each one
/// that is missing or not a string is left empty.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Head {
    #[serde(default, deserialize_with = "text")]
    api_version: Option<String>,
    #[serde(default, deserialize_with = "text")]
    kind: Option<String>,
    #[serde(default)]
    metadata: HeadMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HeadMeta {
    #[serde(default, deserialize_with = "text")]
    name: Option<String>,
    #[serde(default, deserialize_with = "text")]
    namespace: Option<String>,
    #[serde(default, deserialize_with = "text")]
    uid: Option<String>,
    #[serde(default, deserialize_with = "text")]
    resource_version: Option<String>,
}

fn text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    })
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Decoded<K> {
    /// Never fails on an object of valid JSON read straight from its text
    /// (a list's item). Not for a value serde has to buffer first, such as
    /// the `object` of a watch event written before its `type`: those lines
    /// are read by [`event`].
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <Box<RawValue>>::deserialize(deserializer)?;
        Ok(decode(raw.get()))
    }
}

/// `json` as a `K`, or as what could be read of it.
pub fn decode<K: DeserializeOwned>(json: &str) -> Decoded<K> {
    match serde_json::from_str(json) {
        Ok(object) => Decoded::Object(object),
        Err(error) => {
            let head: Head = serde_json::from_str(json).unwrap_or_default();
            let meta = head.metadata;
            Decoded::Undecodable(Undecodable {
                api_version: head.api_version.unwrap_or_default(),
                kind: head.kind.unwrap_or_default(),
                namespace: meta.namespace,
                name: meta.name.unwrap_or_default(),
                uid: meta.uid,
                resource_version: meta.resource_version,
                error: cut(&explain(&error), ERROR_CHARS),
            })
        }
    }
}

/// The decoder's error, said so that a person knows what to change: the
/// recursion limit (which the API server does not have) names the depth.
fn explain(error: &serde_json::Error) -> String {
    let text = error.to_string();
    if !text.starts_with("recursion limit exceeded") {
        return text;
    }
    format!(
        "it is nested deeper than {DECODER_DEPTH} levels, counting the copy of its fields \
         {MANAGED_FIELDS_DEPTH} levels deeper in metadata.managedFields (flatten the deepest field, \
         such as an Artifact's spec.exportedInputs) ({text})"
    )
}

/// One line of a watch: its type and its object, in either order.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// One line of a watch's answer as an event, its object decoded on its own
/// ([`decode`]); `None` for an empty line. A line that is no event at all
/// is the API server's Status, or an error.
pub fn event<K: DeserializeOwned>(line: &str) -> Option<kube::Result<WatchEvent<Decoded<K>>>> {
    if line.trim().is_empty() {
        return None;
    }
    let Line { kind, object } = match serde_json::from_str::<Line<'_>>(line) {
        Ok(parsed) => parsed,
        Err(error) => {
            return Some(Err(match serde_json::from_str::<Status>(line) {
                Ok(status) if !status.message.is_empty() || status.code != 0 => {
                    kube::Error::Api(status.boxed())
                }
                _ => kube::Error::SerdeError(error),
            }))
        }
    };
    let object = object.get();
    Some(match kind {
        "ADDED" => Ok(WatchEvent::Added(decode(object))),
        "MODIFIED" => Ok(WatchEvent::Modified(decode(object))),
        "DELETED" => Ok(WatchEvent::Deleted(decode(object))),
        "BOOKMARK" => serde_json::from_str(object)
            .map(WatchEvent::Bookmark)
            .map_err(kube::Error::SerdeError),
        "ERROR" => serde_json::from_str::<Status>(object)
            .map(|status| WatchEvent::Error(status.boxed()))
            .map_err(kube::Error::SerdeError),
        other => Err(kube::Error::SerdeError(serde::de::Error::unknown_variant(
            other,
            &["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"],
        ))),
    })
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

impl Undecodable {
    /// `namespace/name`, or `name`.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The message of its Event: what is wrong and what to do.
    pub fn message(&self) -> String {
        format!(
            "openflux cannot read this {}: {}; openflux ignores it until it is corrected \
             (the rest of its kind is unaffected)",
            if self.kind.is_empty() {
                "object"
            } else {
                &self.kind
            },
            self.error
        )
    }
}

/// Labels of `openflux_undecodable_objects_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// Where watches hand the objects they set aside. Cheap to clone; the
/// default reports nothing but a log line.
#[derive(Clone, Debug, Default)]
pub struct Rejects {
    queue: Option<mpsc::Sender<Undecodable>>,
}

/// The receiving end of [`Rejects`]: reports each object once per version.
pub struct Reporter {
    queue: mpsc::Receiver<Undecodable>,
    count: Family<KindLabel, Counter>,
    reported: HashSet<(String, String)>,
}

impl Rejects {
    /// A handle and the [`Reporter`] that reports what is handed to it;
    /// registers the metric.
    pub fn channel(registry: &mut Registry) -> (Self, Reporter) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let count = Family::<KindLabel, Counter>::default();
        registry.register(
            "openflux_undecodable_objects",
            "Objects openflux could not decode and ignores (each version counted once), by kind",
            count.clone(),
        );
        let reporter = Reporter {
            queue: rx,
            count,
            reported: HashSet::new(),
        };
        (Rejects { queue: Some(tx) }, reporter)
    }

    /// A handle whose objects arrive on the returned receiver, for tests.
    #[cfg(test)]
    pub fn queue() -> (Self, mpsc::Receiver<Undecodable>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Rejects { queue: Some(tx) }, rx)
    }

    /// Sets `object` aside: reported, or logged when nothing reports.
    pub fn reject(&self, object: Undecodable) {
        match &self.queue {
            Some(queue) => {
                let _ = queue.try_send(object);
            }
            None => tracing::warn!(
                kind = %object.kind, object = %object.key(), error = %object.error,
                "cannot decode an object; ignoring it"
            ),
        }
    }
}

impl Reporter {
    /// Whether `object` is new (a version not reported yet); counts it.
    fn first_sight(&mut self, object: &Undecodable) -> bool {
        let version = (
            object.uid.clone().unwrap_or_else(|| object.key()),
            object.resource_version.clone().unwrap_or_default(),
        );
        if self.reported.len() >= REMEMBERED {
            self.reported.clear();
        }
        if !self.reported.insert(version) {
            return false;
        }
        let kind = object.kind.clone();
        self.count.get_or_create(&KindLabel { kind }).inc();
        true
    }

    /// Reports until `shutdown`: a warning line and a Warning Event on
    /// each object, once per version.
    pub async fn run(mut self, events: EventRecorder, shutdown: CancellationToken) {
        loop {
            let object = tokio::select! {
                object = self.queue.recv() => match object {
                    Some(object) => object,
                    None => return,
                },
                _ = shutdown.cancelled() => return,
            };
            if !self.first_sight(&object) {
                continue;
            }
            tracing::warn!(
                kind = %object.kind, object = %object.key(), error = %object.error,
                "cannot decode an object; ignoring it until it changes"
            );
            let reference = ObjectReference {
                api_version: Some(object.api_version.clone()),
                kind: Some(object.kind.clone()),
                name: Some(object.name.clone()),
                namespace: object.namespace.clone(),
                uid: object.uid.clone(),
                resource_version: object.resource_version.clone(),
                ..ObjectReference::default()
            };
            let event = FluxEvent::warning(REASON, object.message());
            events
                .publish_on(reference, &Default::default(), &event, None)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Artifact;
    use kube::core::ObjectList;
    use serde_json::json;

    fn artifact(name: &str, last_update: &str, size: &str) -> String {
        format!(
            r#"{{"apiVersion":"openflux.dev/v1alpha1","kind":"Artifact",
               "metadata":{{"name":"{name}","namespace":"t","uid":"u-{name}","resourceVersion":"7"}},
               "spec":{{"url":"http://x/a.tgz","revision":"r","lastUpdateTime":"{last_update}","size":{size}}}}}"#
        )
    }

    #[test]
    fn one_object_that_does_not_fit_leaves_the_rest_of_the_list() {
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"9"}},"items":[{},{},{}]}}"#,
            artifact("good", "2024-01-01T00:00:00Z", "1"),
            artifact("huge", "2024-01-01T00:00:00Z", "1e400"),
            artifact("odd-time", "2024-01-01T00:00:00.1234567890123Z", "-5"),
        );
        let list: ObjectList<Decoded<Artifact>> = serde_json::from_str(&list).unwrap();
        let names: Vec<String> = list
            .items
            .iter()
            .map(|item| match item {
                Decoded::Object(a) => format!("ok {}", a.metadata.name.clone().unwrap()),
                Decoded::Undecodable(u) => format!("bad {}", u.key()),
            })
            .collect();
        assert_eq!(names, ["ok good", "bad t/huge", "ok odd-time"]);
        let Decoded::Undecodable(bad) = &list.items[1] else {
            unreachable!()
        };
        assert_eq!(
            (bad.kind.as_str(), bad.uid.as_deref()),
            ("Artifact", Some("u-huge"))
        );
        assert_eq!(bad.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn a_watch_event_of_an_object_that_does_not_fit_is_still_an_event() {
        let odd = artifact("huge", "2024-01-01T00:00:00Z", "1e400");
        let good = artifact("good", "2024-01-01T00:00:00z", "1");
        for line in [
            format!(r#"{{"type":"MODIFIED","object":{odd}}}"#),
            format!(r#"{{"object":{odd},"type":"MODIFIED"}}"#),
        ] {
            let event = super::event::<Artifact>(&line).unwrap().unwrap();
            assert!(
                matches!(event, WatchEvent::Modified(Decoded::Undecodable(_))),
                "{line}"
            );
        }
        let line = format!(r#"{{"object":{good},"type":"ADDED"}}"#);
        let event = super::event::<Artifact>(&line).unwrap().unwrap();
        assert!(matches!(event, WatchEvent::Added(Decoded::Object(_))));
        let bookmark = r#"{"object":{"apiVersion":"openflux.dev/v1alpha1","kind":"Artifact","metadata":{"resourceVersion":"9"}},"type":"BOOKMARK"}"#;
        let Some(Ok(WatchEvent::Bookmark(mark))) = super::event::<Artifact>(bookmark) else {
            panic!("no bookmark")
        };
        assert_eq!(mark.metadata.resource_version, "9");
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}"#;
        assert!(matches!(
            super::event::<Artifact>(gone),
            Some(Ok(WatchEvent::Error(status))) if status.code == 410
        ));
        let refused = r#"{"kind":"Status","code":403,"message":"forbidden"}"#;
        assert!(matches!(
            super::event::<Artifact>(refused),
            Some(Err(kube::Error::Api(_)))
        ));
        assert!(matches!(
            super::event::<Artifact>("{"),
            Some(Err(kube::Error::SerdeError(_)))
        ));
        assert!(super::event::<Artifact>("").is_none());
    }

    #[test]
    fn the_error_is_cut_and_the_message_says_what_to_do() {
        let long = "x".repeat(5000);
        let json = format!(r#"{{"kind":"Artifact","metadata":{{"name":{long:?}}},"spec":7}}"#);
        let Decoded::<Artifact>::Undecodable(bad) = decode(&json) else {
            panic!("decoded")
        };
        assert!(
            bad.error.chars().count() <= ERROR_CHARS + 3,
            "{}",
            bad.error
        );
        assert!(bad.message().contains("ignores it until it is corrected"));
        // Whatever the head holds, reading it never fails.
        let Decoded::<Artifact>::Undecodable(bad) =
            decode(r#"{"kind":7,"metadata":{"name":["a"],"namespace":null}}"#)
        else {
            panic!("decoded")
        };
        assert_eq!((bad.kind.as_str(), bad.name.as_str()), ("", ""));
    }

    /// An Artifact whose `spec.exportedInputs` nests `levels` objects
    /// deep, with the managed fields the API server keeps for it: a copy of
    /// each of its maps in `fieldsV1`, each field one object there.
    fn deep_artifact(levels: usize) -> String {
        let inputs = (0..levels).fold(json!("leaf"), |inner, _| json!({ "l": inner }));
        let fields = (0..levels).fold(json!({}), |inner, _| json!({".": {}, "f:l": inner}));
        let artifact = json!({
            "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
            "metadata": {"name": "deep", "namespace": "t", "uid": "u-deep", "resourceVersion": "8",
                         "managedFields": [{"manager": "producer", "operation": "Apply",
                                            "apiVersion": "openflux.dev/v1alpha1", "fieldsType": "FieldsV1",
                                            "fieldsV1": {"f:spec": {"f:url": {}, "f:revision": {},
                                                                    "f:exportedInputs": fields}}}]},
            "spec": {"url": "http://x/a.tgz", "revision": "r", "exportedInputs": inputs},
        });
        serde_json::to_string(&artifact).unwrap()
    }

    /// The deepest Artifact the webhook admits is one the controllers
    /// decode, managed fields and all; one level more is set aside, and
    /// what is reported says it is too deep, on the object by its key.
    #[test]
    fn the_deepest_artifact_admitted_is_decoded_and_a_deeper_one_is_reported() {
        use crate::watch::depth::MAX_DEPTH;
        // serde_json's limit, counted from the outermost object.
        let nested = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert!(serde_json::from_str::<serde_json::Value>(&nested(DECODER_DEPTH)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&nested(DECODER_DEPTH + 1)).is_err());
        // spec.exportedInputs is level 3 of the Artifact.
        let fits = MAX_DEPTH - 2;
        assert!(
            matches!(decode::<Artifact>(&deep_artifact(fits)), Decoded::Object(_)),
            "{fits} levels"
        );
        for levels in [fits + 1, 130] {
            let Decoded::<Artifact>::Undecodable(bad) = decode(&deep_artifact(levels)) else {
                panic!("{levels} levels decoded")
            };
            assert_eq!(bad.key(), "t/deep");
            assert_eq!(bad.uid.as_deref(), Some("u-deep"));
            let message = bad.message();
            assert!(bad.error.chars().count() <= ERROR_CHARS, "{}", bad.error);
            assert!(
                message.contains("nested deeper than 127 levels")
                    && message.contains("spec.exportedInputs"),
                "{message}"
            );
        }
    }

    #[test]
    fn each_version_is_reported_once() {
        let mut registry = Registry::default();
        let (_, mut reporter) = Rejects::channel(&mut registry);
        let mut bad = Undecodable {
            kind: "Artifact".into(),
            uid: Some("u".into()),
            resource_version: Some("1".into()),
            ..Undecodable::default()
        };
        assert!(reporter.first_sight(&bad));
        assert!(!reporter.first_sight(&bad));
        bad.resource_version = Some("2".into());
        assert!(reporter.first_sight(&bad));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"openflux_undecodable_objects_total{kind="Artifact"} 2"#),
            "{text}"
        );
    }
}
