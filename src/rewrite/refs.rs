//! Source references inside a consumer's object: finding them, reading
//! them, and the annotation that keeps the original ones. Plain JSON work.

use std::fmt;
use std::sync::OnceLock;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::decision::Decision;
use crate::api::{split_api_version, SOURCE_REF_ANNOTATION};
use crate::vocabulary::consumers::{RefField, RefShape};

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
        let r = Self {
            api_version: text("apiVersion")?,
            kind: text("kind")?.ok_or("kind is not set")?,
            name: text("name")?.ok_or("name is not set")?,
            namespace: text("namespace")?,
        };
        r.within_limits()?;
        Ok(r)
    }

    /// Whether each field is within the length Kubernetes allows it, so
    /// that whatever openflux does with a reference afterwards costs what
    /// a reference of a valid object costs. Checked before anything else.
    fn within_limits(&self) -> Result<(), String> {
        let (group, version) = self
            .api_version
            .as_deref()
            .map(split_api_version)
            .unwrap_or_default();
        let fields = [
            ("kind", self.kind.as_str(), MAX_KIND, "a kind"),
            ("name", self.name.as_str(), MAX_NAME, "a name"),
            (
                "namespace",
                self.namespace.as_deref().unwrap_or_default(),
                MAX_NAMESPACE,
                "a namespace",
            ),
            ("apiVersion", group, MAX_GROUP, "an API group"),
            ("apiVersion", version, MAX_VERSION, "an API version"),
        ];
        for (field, value, max, what) in fields {
            if value.len() > max {
                return Err(format!(
                    "{field} is {} bytes long; {what} has at most {max} characters in Kubernetes",
                    value.len()
                ));
            }
        }
        Ok(())
    }

    /// Whether each field is spelled as Kubernetes spells it for a custom
    /// source: the kind a CRD's `names.kind` (a DNS-1035 label once
    /// lowercased), the group a DNS subdomain, the version a DNS-1035
    /// label, the name a DNS subdomain and the namespace a DNS label.
    /// Lengths are checked by [`Self::from_value`].
    pub fn well_formed(&self) -> Result<(), String> {
        let (group, version) = self
            .api_version
            .as_deref()
            .map(split_api_version)
            .unwrap_or_default();
        let kind_ok = self.kind.starts_with(|c: char| c.is_ascii_alphabetic())
            && self
                .kind
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !self.kind.ends_with('-');
        let checks = [
            (kind_ok, "kind", self.kind.as_str(), "an identifier of letters, digits and '-' that starts with a letter, as a CRD's kind"),
            (
                group.is_empty() || is_dns_subdomain(group),
                "apiVersion",
                self.api_version.as_deref().unwrap_or_default(),
                "GROUP/VERSION with a lowercase DNS name as the group",
            ),
            (
                self.api_version.is_none() || is_dns1035_label(version),
                "apiVersion",
                self.api_version.as_deref().unwrap_or_default(),
                "GROUP/VERSION with a version such as v1 or v1beta2",
            ),
            (
                is_dns_subdomain(&self.name),
                "name",
                self.name.as_str(),
                "a lowercase DNS name (letters, digits, '-' and '.')",
            ),
            (
                self.namespace.as_deref().is_none_or(is_dns_label),
                "namespace",
                self.namespace.as_deref().unwrap_or_default(),
                "a lowercase DNS label (letters, digits and '-')",
            ),
        ];
        for (ok, field, value, should) in checks {
            if !ok {
                return Err(format!("{field} {value:?} is not {should}"));
            }
        }
        Ok(())
    }

    pub fn group(&self) -> Option<&str> {
        self.api_version.as_deref().map(|v| split_api_version(v).0)
    }
}

/// Longest kind: a CRD's `names.kind` is a DNS-1035 label once lowercased.
pub const MAX_KIND: usize = 63;
/// Longest API group: a DNS subdomain.
pub const MAX_GROUP: usize = 253;
/// Longest API version: a DNS-1035 label.
pub const MAX_VERSION: usize = 63;
/// Longest object name: a DNS subdomain.
pub const MAX_NAME: usize = 253;
/// Longest namespace: a DNS label.
pub const MAX_NAMESPACE: usize = 63;

/// Lowercase letters, digits and '-', starting and ending with a letter
/// or digit (of any length).
fn is_label_shaped(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 label: label-shaped, at most 63 characters.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_label_shaped(s)
}

/// A DNS-1035 label: a DNS-1123 label that starts with a letter.
fn is_dns1035_label(s: &str) -> bool {
    is_dns_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// A DNS-1123 subdomain as Kubernetes checks one: label-shaped parts
/// joined by '.', at most 253 characters in all (no part is held to 63:
/// Kubernetes' own check does not, so a name of 64 or more characters
/// without a dot is a valid object name).
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_shaped)
}

/// Where a reference is, as people read it in messages, e.g.
/// `spec.sourceRef` or `spec.sources[alias=web]`; written only when a
/// message is.
#[derive(Clone, Copy, Debug)]
pub struct Label<'a> {
    path: &'static [&'static str],
    /// The list key's field and value, for list references.
    key: Option<(&'static str, &'a str)>,
}

impl fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.path.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(part)?;
        }
        match self.key {
            Some((field, key)) => write!(f, "[{field}={key}]"),
            None => Ok(()),
        }
    }
}

/// `Kind ns/name` of an object, for messages; written only when a message
/// is.
#[derive(Clone, Copy)]
pub struct Subject<'a> {
    kind: &'static str,
    namespace: &'a str,
    name: &'a str,
}

impl<'a> Subject<'a> {
    pub fn new(kind: &'static str, namespace: &'a str, name: &'a str) -> Self {
        Subject {
            kind,
            namespace,
            name,
        }
    }
}

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// One reference found in an object.
pub struct Located<'a> {
    /// JSON pointer of the reference object.
    pub pointer: PointerBuf,
    /// Where to say it is, e.g. `spec.sources[alias=web]`.
    pub label: Label<'a>,
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

/// The JSON pointer of the annotation, encoded once.
fn annotation_pointer() -> PointerBuf {
    static POINTER: OnceLock<PointerBuf> = OnceLock::new();
    POINTER
        .get_or_init(|| PointerBuf::from_tokens(["metadata", "annotations", SOURCE_REF_ANNOTATION]))
        .clone()
}

/// The patch operation that sets the annotation, if it is not set to `value`.
pub(super) fn annotation_op(object: &Value, value: String) -> Option<PatchOperation> {
    if annotation_of(object) == Some(value.as_str()) {
        return None;
    }
    let metadata = object.get("metadata").filter(|m| m.is_object());
    let annotations = metadata
        .and_then(|m| m.get("annotations"))
        .filter(|a| a.is_object());
    let entry = |value: String| {
        let mut entry = Map::new();
        entry.insert(SOURCE_REF_ANNOTATION.into(), Value::String(value));
        entry
    };
    let (path, value) = match (metadata, annotations) {
        (Some(_), Some(_)) => (annotation_pointer(), Value::String(value)),
        (Some(_), None) => (
            PointerBuf::from_tokens(["metadata", "annotations"]),
            Value::Object(entry(value)),
        ),
        (None, _) => {
            let mut metadata = Map::new();
            metadata.insert("annotations".into(), Value::Object(entry(value)));
            (
                PointerBuf::from_tokens(["metadata"]),
                Value::Object(metadata),
            )
        }
    };
    Some(PatchOperation::Add(AddOperation { path, value }))
}

/// The references of `field` in `object`; none when the field is absent.
/// `display` names the object in messages.
pub fn locate<'v>(
    object: &'v Value,
    field: &RefField,
    display: &(impl fmt::Display + ?Sized),
) -> Result<Vec<Located<'v>>, Decision> {
    let mut value = object;
    for part in field.path {
        match value.get(part) {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(v) => value = v,
        }
    }
    let dotted = Label {
        path: field.path,
        key: None,
    };
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
                    label: Label {
                        path: field.path,
                        key: Some((key_field, key)),
                    },
                    key: Some(key.to_string()),
                    value: item,
                });
            }
            Ok(found)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::consumers::CONSUMERS;
    use serde_json::json;

    #[test]
    fn labels_say_where_a_reference_is() {
        let one = CONSUMERS
            .iter()
            .find(|c| c.refs.shape == RefShape::One)
            .expect("a consumer with one reference");
        let object = json!({"spec": {"sourceRef": {}, "chartRef": {}, "sources": [{"alias": "w/b~c", "kind": "K"}]}});
        let found = locate(&object, &one.refs, "X a/b").unwrap();
        assert_eq!(found[0].label.to_string(), one.refs.dotted());
        let list = CONSUMERS
            .iter()
            .find(|c| matches!(c.refs.shape, RefShape::ListByKey(_)))
            .expect("a consumer with a list of references");
        let found = locate(&object, &list.refs, "X a/b").unwrap();
        assert_eq!(
            found[0].label.to_string(),
            format!("{}[alias=w/b~c]", list.refs.dotted())
        );
        assert_eq!(found[0].pointer.as_str(), "/spec/sources/0");
        let broken = json!({"spec": {"sources": [{"kind": "K"}]}});
        let Err(Decision::Error { message, .. }) = locate(&broken, &list.refs, "X a/b") else {
            panic!("no key");
        };
        assert_eq!(
            message,
            format!("X a/b: {}[0] has no alias", list.refs.dotted())
        );
    }

    #[test]
    fn the_annotation_is_added_where_the_object_has_room_for_it() {
        let value = || "{\"kind\":\"K\"}".to_string();
        let path = |op: Option<PatchOperation>| match op {
            Some(PatchOperation::Add(add)) => (add.path.to_string(), add.value),
            other => panic!("{other:?}"),
        };
        let (at, set) = path(annotation_op(
            &json!({"metadata": {"annotations": {}}}),
            value(),
        ));
        assert_eq!(at, "/metadata/annotations/openflux.dev~1source-ref");
        assert_eq!(set, json!(value()));
        let (at, set) = path(annotation_op(&json!({"metadata": {}}), value()));
        assert_eq!(at, "/metadata/annotations");
        assert_eq!(set, json!({SOURCE_REF_ANNOTATION: value()}));
        let (at, set) = path(annotation_op(&json!({}), value()));
        assert_eq!(at, "/metadata");
        assert_eq!(
            set,
            json!({"annotations": {SOURCE_REF_ANNOTATION: value()}})
        );
        let set = json!({"metadata": {"annotations": {SOURCE_REF_ANNOTATION: value()}}});
        assert!(annotation_op(&set, value()).is_none());
    }
}
