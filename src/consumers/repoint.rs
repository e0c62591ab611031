//! Re-pointing: where a consumer openflux rewrote earlier should point now.
//!
//! When the export target changes (a feature gate was turned on or off,
//! Flux was upgraded) or an export's name changes (an earlier release's
//! naming, a source's default Artifact went away), consumers rewritten
//! before point at an object that is no longer the one openflux keeps. The
//! answer is the webhook's own: the references as the person wrote them
//! (from the [`SOURCE_REF_ANNOTATION`](crate::api::SOURCE_REF_ANNOTATION)
//! annotation) are put back and decided again, exactly as if the object had
//! been applied now. A reference a person has since changed to something
//! else is never touched. Pure.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::vocabulary::consumers::{Consumer, RefShape};
use crate::vocabulary::marks::MOVED_FROM_ANNOTATION;
use crate::webhook::decision::{Decision, Options};
use crate::webhook::review::{AdmissionRequest, GroupVersionResource, Operation};
use crate::webhook::rewrite::refs::{annotation_of, locate, SourceRef};
use crate::webhook::rewrite::{decide, is_export_of, View};

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
    let request = AdmissionRequest {
        uid: "openflux-repoint".into(),
        resource: GroupVersionResource {
            group: consumer.group.into(),
            version: consumer.version.into(),
            resource: consumer.resource.into(),
        },
        sub_resource: None,
        name: object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_string),
        namespace: object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string),
        operation: Operation::Update,
        object: Some(restored.clone()),
        old_object: Some(object.clone()),
        dry_run: None,
        user_info: None,
    };
    let mut decided = restored;
    match decide(&request, view, options) {
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
    Ok(Some(Move { patch, from, to }))
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
