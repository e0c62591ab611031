//! Source references inside a consumer's object: finding them, reading
//! them, and the annotation that keeps the original ones. Plain JSON work.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::api::{split_api_version, SOURCE_REF_ANNOTATION};
use crate::consumers::table::{RefField, RefShape};
use crate::webhook::decision::Decision;

/// A source reference as a consumer spells it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl SourceRef {
    /// Reads a reference from JSON; empty strings count as unset, the way
    /// Flux's `omitempty` fields do.
    pub fn from_value(value: &Value) -> Result<Self, String> {
        let text = |field: &str| -> Result<Option<String>, String> {
            match value.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("{field} is not a string")),
            }
        };
        Ok(Self {
            api_version: text("apiVersion")?,
            kind: text("kind")?.ok_or("kind is not set")?,
            name: text("name")?.ok_or("name is not set")?,
            namespace: text("namespace")?,
        })
    }

    pub fn group(&self) -> Option<&str> {
        self.api_version.as_deref().map(|v| split_api_version(v).0)
    }
}

/// One reference found in an object.
pub struct Located<'a> {
    /// JSON pointer of the reference object.
    pub pointer: PointerBuf,
    /// Where to say it is, e.g. `spec.sources[alias=web]`.
    pub label: String,
    /// The list key's value, for list references.
    pub key: Option<String>,
    pub value: &'a Value,
}

/// `value` as compact JSON. References are plain strings, so this cannot
/// fail; if it did, the request is refused rather than annotated with nothing.
pub(super) fn compact(value: &impl Serialize) -> Result<String, Decision> {
    serde_json::to_string(value).map_err(|e| {
        Decision::internal(format!(
            "openflux cannot encode the original source reference: {e}"
        ))
    })
}

/// The openflux annotation of an object, if set.
pub fn annotation_of(object: &Value) -> Option<&str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(SOURCE_REF_ANNOTATION)?
        .as_str()
}

/// The patch operation that sets the annotation, if it is not set to `value`.
pub(super) fn annotation_op(object: &Value, value: &str) -> Option<PatchOperation> {
    if annotation_of(object) == Some(value) {
        return None;
    }
    let metadata = object.get("metadata").filter(|m| m.is_object());
    let annotations = metadata
        .and_then(|m| m.get("annotations"))
        .filter(|a| a.is_object());
    let mut entry = Map::new();
    entry.insert(SOURCE_REF_ANNOTATION.into(), Value::String(value.into()));
    let (path, value) = match (metadata, annotations) {
        (Some(_), Some(_)) => (
            PointerBuf::from_tokens(["metadata", "annotations", SOURCE_REF_ANNOTATION]),
            Value::String(value.into()),
        ),
        (Some(_), None) => (
            PointerBuf::from_tokens(["metadata", "annotations"]),
            Value::Object(entry),
        ),
        (None, _) => {
            let mut metadata = Map::new();
            metadata.insert("annotations".into(), Value::Object(entry));
            (
                PointerBuf::from_tokens(["metadata"]),
                Value::Object(metadata),
            )
        }
    };
    Some(PatchOperation::Add(AddOperation { path, value }))
}

/// The references of `field` in `object`; none when the field is absent.
pub fn locate<'v>(
    object: &'v Value,
    field: &RefField,
    display: &str,
) -> Result<Vec<Located<'v>>, Decision> {
    let mut value = object;
    for part in field.path {
        match value.get(part) {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(v) => value = v,
        }
    }
    let dotted = field.dotted();
    let pointer = PointerBuf::from_tokens(field.path.iter().copied());
    match field.shape {
        RefShape::One => {
            if !value.is_object() {
                return Err(Decision::bad_request(format!(
                    "{display}: {dotted} is not an object"
                )));
            }
            Ok(vec![Located {
                pointer,
                label: dotted,
                key: None,
                value,
            }])
        }
        RefShape::ListByKey(key_field) => {
            let Some(items) = value.as_array() else {
                return Err(Decision::bad_request(format!(
                    "{display}: {dotted} is not a list"
                )));
            };
            let mut found = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let key = item
                    .get(key_field)
                    .and_then(Value::as_str)
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| {
                        Decision::bad_request(format!(
                            "{display}: {dotted}[{i}] has no {key_field}"
                        ))
                    })?;
                let mut item_pointer = pointer.clone();
                item_pointer.push_back(i);
                found.push(Located {
                    pointer: item_pointer,
                    label: format!("{dotted}[{key_field}={key}]"),
                    key: Some(key.to_string()),
                    value: item,
                });
            }
            Ok(found)
        }
    }
}
