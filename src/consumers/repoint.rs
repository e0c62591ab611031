//! Re-pointing: where a consumer openflux rewrote earlier should point now.
//!
//! When the export target changes (a feature gate was turned on or off,
//! Flux was upgraded) or an export's name changes (an earlier release's
//! naming, a source's default Artifact went away), consumers rewritten
//! before point at an object that is no longer the one openflux keeps. The
//! answer is the webhook's own: the references as the person wrote them
//! (from the [`SOURCE_REF_ANNOTATION`](crate::api::SOURCE_REF_ANNOTATION)
//! annotation) are put back and decided again, exactly as if the object had
//! been applied now, by the same decision ([`crate::rewrite::decide`]). A
//! reference a person has since changed to something else is never
//! touched. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::rewrite::refs::{annotation_of, locate, SourceRef};
use crate::rewrite::{decide, is_export_of, Decision, Input, Options, View};
use crate::vocabulary::consumers::{Consumer, RefShape};
use crate::vocabulary::marks::MOVED_FROM_ANNOTATION;

/// An object a reference points at.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// A move openflux should make.
#[derive(Clone, Debug, PartialEq)]
pub struct Move {
    /// JSON merge patch (RFC 7386) of the consumer: the new references and
    /// the [`MOVED_FROM_ANNOTATION`].
    pub patch: Value,
    /// What it pointed at.
    pub from: Vec<ObjectKey>,
    /// What it points at after the move.
    pub to: Vec<ObjectKey>,
    /// The exports the decision points it at: the move is made only once
    /// each is there with its Artifact, as a Flux consumer moved to a
    /// missing source fails and is not tried again before its interval.
    pub exports: Vec<ObjectKey>,
}

/// The objects of stock kinds a consumer's references point at (namespace
/// defaulted to the consumer's).
pub fn references(consumer: &Consumer, object: &Value) -> Vec<ObjectKey> {
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Ok(found) = locate(object, &consumer.refs, "") else {
        return Vec::new();
    };
    found
        .iter()
        .filter_map(|f| SourceRef::from_value(f.value).ok())
        .map(|r| ObjectKey {
            namespace: r.namespace.clone().unwrap_or_else(|| namespace.to_string()),
            kind: r.kind,
            name: r.name,
        })
        .collect()
}

/// The move a consumer needs, if any. `Err` says why the consumer's
/// original references cannot be decided now (kept as they are).
pub fn repoint(
    consumer: &'static Consumer,
    object: &Value,
    view: View<'_>,
    options: &Options,
) -> Result<Option<Move>, String> {
    let Some(annotation) = annotation_of(object) else {
        return Ok(None);
    };
    let Some(restored) = restore(consumer, object, annotation) else {
        return Ok(None);
    };
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    let input = Input {
        consumer,
        object: &restored,
        stored: Some(object),
        namespace: text("/metadata/namespace").unwrap_or_default(),
        name: text("/metadata/name").unwrap_or_default(),
    };
    let decision = decide(input, view, options);
    let mut decided = restored.clone();
    match decision {
        Decision::Rewrite { patch, .. } => {
            json_patch::patch(&mut decided, &patch).map_err(|e| e.to_string())?
        }
        Decision::Unchanged => {}
        Decision::Deny { message }
        | Decision::NotServed { message }
        | Decision::Error { message, .. } => return Err(message),
    }
    let field = |o: &Value| o.pointer(&pointer(consumer)).cloned();
    let (now, next) = (field(object), field(&decided));
    if now == next {
        return Ok(None);
    }
    let from = references(consumer, object);
    let to = references(consumer, &decided);
    let written = references(consumer, &restored);
    let exports = to
        .iter()
        .filter(|k| !written.contains(k))
        .cloned()
        .collect();
    let mut patch = json!({ "metadata": { "annotations": {
        MOVED_FROM_ANNOTATION: serde_json::to_string(&from).map_err(|e| e.to_string())?,
    }}});
    let mut at = &mut patch;
    for (i, part) in consumer.refs.path.iter().enumerate() {
        let last = i + 1 == consumer.refs.path.len();
        let value = if last {
            next.clone().unwrap_or(Value::Null)
        } else {
            json!({})
        };
        let map = at.as_object_mut().ok_or("a merge patch is an object")?;
        at = map.entry(part.to_string()).or_insert(value);
    }
    Ok(Some(Move {
        patch,
        from,
        to,
        exports,
    }))
}

/// `object` with each reference openflux rewrote put back as written, or
/// `None` when no reference still points where openflux put it.
fn restore(consumer: &Consumer, object: &Value, annotation: &str) -> Option<Value> {
    let found = locate(object, &consumer.refs, "").ok()?;
    let originals: BTreeMap<Option<String>, SourceRef> = match consumer.refs.shape {
        RefShape::One => [(None, serde_json::from_str(annotation).ok()?)].into(),
        RefShape::ListByKey(_) => serde_json::from_str::<BTreeMap<String, SourceRef>>(annotation)
            .ok()?
            .into_iter()
            .map(|(k, v)| (Some(k), v))
            .collect(),
    };
    let mut restored = object.clone();
    let mut any = false;
    for f in &found {
        let (Some(original), Ok(now)) = (originals.get(&f.key), SourceRef::from_value(f.value))
        else {
            continue;
        };
        if !is_export_of(original, &now) {
            continue;
        }
        let slot = restored.pointer_mut(f.pointer.as_str())?;
        let fields = slot.as_object_mut()?;
        fields.remove("apiVersion");
        fields.remove("namespace");
        if let Ok(Value::Object(written)) = serde_json::to_value(original) {
            fields.extend(written);
        }
        any = true;
    }
    any.then_some(restored)
}

/// JSON pointer of the consumer's reference field.
fn pointer(consumer: &Consumer) -> String {
    consumer
        .refs
        .path
        .iter()
        .fold(String::new(), |p, part| format!("{p}/{part}"))
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::cluster::target::{NoTarget, OciVersion, Target};
    use crate::names::identity::{dotted_source_export_name, source_export_name};
    use crate::rewrite::testing::{artifact, facts_with, index_of};
    use crate::vocabulary::consumers::CONSUMERS;

    const HTTP: &str = "sources.openflux.dev/v1alpha1";
    const SHADOW: Target = Target::Shadow(OciVersion::V1);

    /// A consumer in `apps` whose reference field holds `reference` (as
    /// the entry of alias `a` for a list).
    fn consumer_with(consumer: &Consumer, reference: Value) -> Value {
        let mut object = json!({"metadata": {"name": "app", "namespace": "apps"}});
        let mut at = &mut object;
        for part in consumer.refs.path {
            at = at
                .as_object_mut()
                .unwrap()
                .entry(part.to_string())
                .or_insert(json!({}));
        }
        *at = match consumer.refs.shape {
            RefShape::One => reference,
            RefShape::ListByKey(key) => {
                let mut entry = reference;
                entry[key] = json!("a");
                json!([entry])
            }
        };
        object
    }

    /// The reference a person writes to HttpSource apps/web.
    fn written(consumer: &Consumer) -> Value {
        if consumer.refs.has_api_version {
            json!({"apiVersion": HTTP, "kind": "HttpSource", "name": "web"})
        } else {
            json!({"kind": "HttpSource", "name": "web"})
        }
    }

    /// What the re-pointer does with `object` in a cluster whose consumers
    /// take `target`, or for this consumer's kind none (`exportable`).
    fn repoint_in(
        consumer: &'static Consumer,
        object: &Value,
        target: Target,
        exportable: bool,
    ) -> Result<Option<Move>, String> {
        let index = index_of(&[artifact(
            "apps",
            "web-latest",
            Some((HTTP, "HttpSource", "web")),
        )]);
        let mut facts = facts_with(target);
        if !exportable {
            let why = NoTarget("the consumer's API takes neither export kind".into());
            facts.choices.insert(consumer.kind, Err(why));
        }
        let view = View {
            index: &index,
            facts: &facts,
            policies: &crate::policy::NONE,
        };
        repoint(consumer, object, view, &Options::default())
    }

    /// `object` as the webhook stores it in a cluster taking `target`.
    fn as_stored(consumer: &'static Consumer, object: &Value, target: Target) -> Value {
        let index = index_of(&[artifact(
            "apps",
            "web-latest",
            Some((HTTP, "HttpSource", "web")),
        )]);
        let facts = facts_with(target);
        let view = View {
            index: &index,
            facts: &facts,
            policies: &crate::policy::NONE,
        };
        let input = Input {
            consumer,
            object,
            stored: None,
            namespace: "apps",
            name: "app",
        };
        let Decision::Rewrite { patch, .. } = decide(input, view, &Options::default()) else {
            panic!("{}: the written reference is rewritten", consumer.kind);
        };
        let mut stored = object.clone();
        json_patch::patch(&mut stored, &patch).unwrap();
        stored
    }

    /// `stored` with its (first) reference's kind and name replaced.
    fn pointed_at(consumer: &Consumer, stored: &Value, kind: &str, name: &str) -> Value {
        let mut object = stored.clone();
        let mut slot = object.pointer_mut(&pointer(consumer)).unwrap();
        if let RefShape::ListByKey(_) = consumer.refs.shape {
            slot = &mut slot[0];
        }
        slot["kind"] = json!(kind);
        slot["name"] = json!(name);
        object
    }

    fn key(kind: &str, name: &str) -> ObjectKey {
        ObjectKey {
            kind: kind.into(),
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    enum Expect {
        Stays,
        Moves { from: ObjectKey, to: ObjectKey },
        Kept(&'static str),
    }

    #[test]
    fn re_pointing_follows_the_decision_for_every_consumer() {
        let export = source_export_name("sources.openflux.dev", "HttpSource", "web");
        let dotted = dotted_source_export_name("sources.openflux.dev", "HttpSource", "web");
        for consumer in CONSUMERS.iter() {
            let original = consumer_with(consumer, written(consumer));
            let stored = as_stored(consumer, &original, Target::ExternalArtifact);
            let unannotated = {
                let mut o = stored.clone();
                o["metadata"]["annotations"] = json!({});
                o
            };
            #[rustfmt::skip]
            let table: Vec<(&str, Value, Target, bool, Expect)> = vec![
                ("where the decision points it", stored.clone(), Target::ExternalArtifact, true, Expect::Stays),
                ("the target turned to a shadow", stored.clone(), SHADOW, true,
                    Expect::Moves { from: key("ExternalArtifact", &export), to: key("OCIRepository", &export) }),
                ("at the dotted name of the release before",
                    pointed_at(consumer, &stored, "ExternalArtifact", &dotted), Target::ExternalArtifact, true,
                    Expect::Moves { from: key("ExternalArtifact", &dotted), to: key("ExternalArtifact", &export) }),
                ("a person pointed it at a GitRepository since",
                    pointed_at(consumer, &stored, "GitRepository", "mine"), SHADOW, true, Expect::Stays),
                ("no record of what was written", unannotated, SHADOW, true, Expect::Stays),
                ("no export target for the consumer now", stored.clone(), SHADOW, false,
                    Expect::Kept("takes neither export kind")),
            ];
            for (case, object, target, exportable, expect) in table {
                let what = format!("{} {case}", consumer.kind);
                let got = repoint_in(consumer, &object, target, exportable);
                match (expect, got) {
                    (Expect::Stays, Ok(None)) => {}
                    (Expect::Moves { from, to }, Ok(Some(moved))) => {
                        assert_eq!(
                            (moved.from, &moved.to),
                            (vec![from.clone()], &vec![to.clone()]),
                            "{what}"
                        );
                        assert_eq!(moved.exports, moved.to, "{what}: it waits for its export");
                        let mut after = object.clone();
                        json_patch::merge(&mut after, &moved.patch);
                        let now = references(consumer, &after);
                        assert_eq!(now, vec![to], "{what}: the patch points it there");
                        let recorded = after["metadata"]["annotations"][MOVED_FROM_ANNOTATION]
                            .as_str()
                            .map(|a| serde_json::from_str::<Vec<ObjectKey>>(a).unwrap());
                        assert_eq!(
                            recorded,
                            Some(vec![from]),
                            "{what}: the patch records the move"
                        );
                        assert_eq!(
                            annotation_of(&after),
                            annotation_of(&object),
                            "{what}: the written reference stays recorded"
                        );
                    }
                    (Expect::Kept(why), Err(message)) => {
                        assert!(message.contains(why), "{what}: {message}");
                    }
                    (_, got) => panic!("{what}: unexpected {got:?}"),
                }
            }
        }
    }
}
