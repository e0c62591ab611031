//! The webhook's decision: what to do with one admission request.
//!
//! [`decide`] is a pure function of the request, the owner index and the
//! options. A reference to a stock Flux source is never changed. A reference
//! to any other kind is resolved through the owner index and replaced by a
//! reference to the object openflux exports for it; the reference as the
//! person wrote it is kept in the [`SOURCE_REF_ANNOTATION`] annotation:
//!
//! - for a consumer with one reference (Kustomization `spec.sourceRef`,
//!   HelmRelease `spec.chartRef`), the annotation holds that reference as
//!   compact JSON with the fields in a fixed order: `apiVersion` (when set),
//!   `kind`, `name`, `namespace` (when set);
//! - for a consumer with a list of references (ArtifactGenerator
//!   `spec.sources`), the annotation holds a JSON object from each rewritten
//!   entry's key (its `alias`) to its reference, keys sorted.
//!
//! The rewrite is idempotent: the rewritten object points at a stock kind and
//! is left alone, and the original manifest applied again (by `kubectl apply`,
//! server-side apply or Flux itself) is rewritten to exactly what is stored, so
//! the API server sees no change.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::consumers::{self, is_stock_ref, Consumer, RefField, RefShape};
use super::decision::{Decision, Options};
use super::review::{AdmissionRequest, Operation};
use crate::api::{self, split_api_version, StockSource, FLUX_SOURCE_GROUP, SOURCE_REF_ANNOTATION};
use crate::index::{LookupError, OwnerIndex};
use crate::naming;

/// The kind openflux exports custom sources as.
pub const EXPORT_KIND: &str = StockSource::EXTERNAL_ARTIFACT.kind;
/// The `apiVersion` openflux exports custom sources as.
pub const EXPORT_API_VERSION: &str = "source.toolkit.fluxcd.io/v1";

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
    fn from_value(value: &Value) -> Result<Self, String> {
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

    fn group(&self) -> Option<&str> {
        self.api_version.as_deref().map(|v| split_api_version(v).0)
    }
}

/// Decides one admission request. Never panics and makes no I/O.
pub fn decide(request: &AdmissionRequest, index: &OwnerIndex, options: &Options) -> Decision {
    match Decider::new(request, index, options) {
        Ok(Some(decider)) => decider.run().unwrap_or_else(|stop| stop),
        Ok(None) => Decision::Unchanged,
        Err(stop) => stop,
    }
}

/// One reference found in an object.
struct Located<'a> {
    /// JSON pointer of the reference object.
    pointer: PointerBuf,
    /// Where to say it is, e.g. `spec.sources[alias=web]`.
    label: String,
    /// The list key's value, for list references.
    key: Option<String>,
    value: &'a Value,
}

/// A reference that gets rewritten.
struct Rewritten {
    pointer: PointerBuf,
    key: Option<String>,
    value: Value,
    original: SourceRef,
    warning: Option<String>,
}

/// Where a resolved reference points.
struct Target {
    api_version: String,
    kind: String,
    name: String,
    warning: Option<String>,
}

struct Decider<'a> {
    request: &'a AdmissionRequest,
    index: &'a OwnerIndex,
    options: &'a Options,
    consumer: &'static Consumer,
    object: &'a Value,
    namespace: String,
    /// `Kind ns/name` of the object, for messages.
    display: String,
}

impl<'a> Decider<'a> {
    /// `Ok(None)`: nothing to decide (not a create or update, a subresource,
    /// an object being deleted).
    fn new(
        request: &'a AdmissionRequest,
        index: &'a OwnerIndex,
        options: &'a Options,
    ) -> Result<Option<Self>, Decision> {
        if !matches!(request.operation, Operation::Create | Operation::Update) {
            return Ok(None);
        }
        if request
            .sub_resource
            .as_deref()
            .is_some_and(|s| !s.is_empty())
        {
            return Ok(None);
        }
        let gvr = &request.resource;
        let consumer = consumers::find(&gvr.group, &gvr.resource).ok_or_else(|| {
            Decision::bad_request(format!(
                "openflux does not handle resource {}.{}; check the rules of its webhook configuration",
                gvr.resource, gvr.group
            ))
        })?;
        let object = request
            .object
            .as_ref()
            .filter(|o| o.is_object())
            .ok_or_else(|| Decision::bad_request("the admission request carries no object"))?;
        let metadata = object.get("metadata");
        if metadata
            .and_then(|m| m.get("deletionTimestamp"))
            .is_some_and(|t| !t.is_null())
        {
            return Ok(None);
        }
        let meta_text = |field: &str| {
            metadata
                .and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let namespace = request
            .namespace
            .as_deref()
            .filter(|s| !s.is_empty())
            .or_else(|| meta_text("namespace"))
            .ok_or_else(|| {
                Decision::bad_request(format!("the {} has no namespace", consumer.kind))
            })?
            .to_string();
        let name = meta_text("name")
            .or(request.name.as_deref().filter(|s| !s.is_empty()))
            .or_else(|| meta_text("generateName"))
            .unwrap_or("");
        let display = format!("{} {namespace}/{name}", consumer.kind);
        if !object.get("spec").is_some_and(Value::is_object) {
            return Err(Decision::bad_request(format!("{display} has no spec")));
        }
        Ok(Some(Self {
            request,
            index,
            options,
            consumer,
            object,
            namespace,
            display,
        }))
    }

    fn run(&self) -> Result<Decision, Decision> {
        if let Some(forbidden) = &self.consumer.forbidden {
            for found in locate(self.object, &forbidden.field, &self.display)? {
                let r = self.parse_ref(&found)?;
                if !is_stock_ref(r.api_version.as_deref(), &r.kind) {
                    return Err(Decision::Deny {
                        message: format!(
                            "openflux: {} cannot take {} {} in {}: {}.",
                            self.display, r.kind, r.name, found.label, forbidden.hint
                        ),
                    });
                }
            }
        }
        let field = &self.consumer.refs;
        let mut rewritten = Vec::new();
        for found in locate(self.object, field, &self.display)? {
            if let Some(r) = self.resolve(field, &found)? {
                rewritten.push(r);
            }
        }
        if rewritten.is_empty() {
            return Ok(Decision::Unchanged);
        }
        let mut ops = Vec::new();
        for r in &rewritten {
            if self.object.pointer(r.pointer.as_str()) != Some(&r.value) {
                ops.push(PatchOperation::Replace(ReplaceOperation {
                    path: r.pointer.clone(),
                    value: r.value.clone(),
                }));
            }
        }
        let annotation = self.annotation(field, &rewritten)?;
        if let Some(op) = annotation_op(self.object, &annotation) {
            ops.push(op);
        }
        let warnings: Vec<String> = rewritten.into_iter().filter_map(|r| r.warning).collect();
        if ops.is_empty() {
            return Ok(Decision::Unchanged);
        }
        Ok(Decision::Rewrite {
            patch: Patch(ops),
            warnings,
        })
    }

    fn parse_ref(&self, found: &Located<'_>) -> Result<SourceRef, Decision> {
        SourceRef::from_value(found.value)
            .map_err(|e| Decision::bad_request(format!("{}: {}.{e}", self.display, found.label)))
    }

    /// The rewrite of one reference, or `None` when it stays as it is.
    fn resolve(
        &self,
        field: &RefField,
        found: &Located<'_>,
    ) -> Result<Option<Rewritten>, Decision> {
        let mut r = self.parse_ref(found)?;
        if is_stock_ref(r.api_version.as_deref(), &r.kind) {
            return Ok(None);
        }
        if r.group() == Some(FLUX_SOURCE_GROUP) {
            if self.is_merge_leftover(field, found, &r) {
                r.api_version = None;
            } else {
                return Err(Decision::Deny {
                    message: format!(
                        "openflux: {} refers to kind {} of {FLUX_SOURCE_GROUP} in {}, which Flux does not have; \
                         set apiVersion to the API of the custom source, or leave apiVersion out",
                        self.display, r.kind, found.label
                    ),
                });
            }
        }
        let source_ns = r.namespace.as_deref().unwrap_or(&self.namespace);
        if self.options.no_cross_namespace_refs && source_ns != self.namespace {
            return Err(Decision::Deny {
                message: format!(
                    "openflux: {} refers to {} {source_ns}/{} in {}, in another namespace, and cross-namespace \
                     references are disabled (--no-cross-namespace-refs); use a source in namespace {} or remove \
                     {}.namespace",
                    self.display, r.kind, r.name, found.label, self.namespace, found.label
                ),
            });
        }
        if !self.index.is_synced() {
            return Err(Decision::Error {
                code: 503,
                message: format!(
                    "openflux has not finished loading its Artifacts and cannot resolve {} {source_ns}/{} yet; \
                     retry in a few seconds",
                    r.kind, r.name
                ),
            });
        }
        let direct = r.kind == api::KIND && matches!(r.group(), None | Some(api::GROUP));
        let target = if direct {
            self.artifact_target(field, found, source_ns, &r.name)?
        } else {
            self.source_target(field, found, &r, source_ns)?
        };
        let mut value = found.value.clone();
        if let Some(fields) = value.as_object_mut() {
            if field.has_api_version {
                fields.insert("apiVersion".into(), Value::String(target.api_version));
            } else {
                fields.remove("apiVersion");
            }
            fields.insert("kind".into(), Value::String(target.kind));
            fields.insert("name".into(), Value::String(target.name));
        }
        Ok(Some(Rewritten {
            pointer: found.pointer.clone(),
            key: found.key.clone(),
            value,
            original: r,
            warning: target.warning,
        }))
    }

    /// Whether `r` (a Flux source apiVersion with a custom kind) is what a
    /// JSON merge patch of the original reference over the stored, rewritten
    /// one leaves behind: `kubectl apply` of a manifest whose reference has no
    /// apiVersion keeps the apiVersion openflux wrote. Only on an update of an
    /// object openflux rewrote before, whose stored reference has that same
    /// apiVersion.
    fn is_merge_leftover(&self, field: &RefField, found: &Located<'_>, r: &SourceRef) -> bool {
        if self.request.operation != Operation::Update {
            return false;
        }
        let Some(old) = self.request.old_object.as_ref() else {
            return false;
        };
        if annotation_of(old).is_none() {
            return false;
        }
        let Ok(old_refs) = locate(old, field, &self.display) else {
            return false;
        };
        old_refs
            .iter()
            .filter(|o| o.key == found.key)
            .filter_map(|o| SourceRef::from_value(o.value).ok())
            .any(|o| o.api_version == r.api_version)
    }

    /// Where a reference to a (custom) source points.
    fn source_target(
        &self,
        field: &RefField,
        found: &Located<'_>,
        r: &SourceRef,
        namespace: &str,
    ) -> Result<Target, Decision> {
        match self.index.lookup_source(r.group(), &r.kind, namespace, &r.name) {
            Err(LookupError::Ambiguous { candidates, .. }) => Err(Decision::Deny {
                message: format!(
                    "openflux: {} refers to {} {namespace}/{} in {} without apiVersion, and several APIs \
                     have such a source: {}; set apiVersion in {} to pick one",
                    self.display,
                    r.kind,
                    r.name,
                    found.label,
                    candidates.join(", "),
                    found.label
                ),
            }),
            Ok(None) => {
                let name = naming::export_name(&r.kind, &r.name);
                Ok(Target {
                    warning: Some(format!(
                        "{} {namespace}/{} has no Artifact yet; Flux will wait until openflux exports \
                         {EXPORT_KIND} {namespace}/{name}",
                        r.kind, r.name
                    )),
                    ..export_target(name)
                })
            }
            Ok(Some(found_source)) => match found_source.artifacts.as_slice() {
                [one] => {
                    let name = self
                        .index
                        .artifact(namespace, one)
                        .map(|a| self.index.export_name(a))
                        .unwrap_or_else(|| naming::export_name(&r.kind, &r.name));
                    Ok(export_target(name))
                }
                many => {
                    let how = if field.has_api_version {
                        format!("apiVersion: {}, kind: {}", api::API_VERSION, api::KIND)
                    } else {
                        format!("kind: {}", api::KIND)
                    };
                    Err(Decision::Deny {
                        message: format!(
                            "openflux: {} {namespace}/{} has {} Artifacts ({}), so {} of {} is ambiguous; \
                             reference one of them with {how} and its name",
                            r.kind,
                            r.name,
                            many.len(),
                            many.join(", "),
                            found.label,
                            self.display
                        ),
                    })
                }
            },
        }
    }

    /// Where a reference to one Artifact points: its export, or the stock
    /// source it was mirrored from.
    fn artifact_target(
        &self,
        field: &RefField,
        found: &Located<'_>,
        namespace: &str,
        name: &str,
    ) -> Result<Target, Decision> {
        let Some(artifact) = self.index.artifact(namespace, name) else {
            let export = naming::export_name_for_artifact(name);
            return Ok(Target {
                warning: Some(format!(
                    "{} {namespace}/{name} does not exist yet; Flux will wait until openflux exports \
                     {EXPORT_KIND} {namespace}/{export}",
                    api::KIND
                )),
                ..export_target(export)
            });
        };
        match &artifact.owner {
            Some(owner) if api::is_stock_source(&owner.source.group, &owner.source.kind) => {
                let kind = &owner.source.kind;
                if !field.accepts(kind) {
                    return Err(Decision::Deny {
                        message: format!(
                            "openflux: {} {namespace}/{name} comes from {kind} {namespace}/{}, which a {} cannot \
                             take in {} (it takes {})",
                            api::KIND,
                            owner.source.name,
                            self.consumer.kind,
                            found.label,
                            field.stock_kind_list()
                        ),
                    });
                }
                Ok(Target {
                    api_version: owner.api_version.clone(),
                    kind: kind.clone(),
                    name: owner.source.name.clone(),
                    warning: None,
                })
            }
            _ => Ok(export_target(self.index.export_name(artifact))),
        }
    }

    /// The annotation value recording the original references of
    /// `rewritten` (never empty).
    fn annotation(&self, field: &RefField, rewritten: &[Rewritten]) -> Result<String, Decision> {
        match field.shape {
            RefShape::One => match rewritten {
                [one] => compact(&one.original),
                _ => Err(Decision::internal(format!(
                    "{}: {} rewritten references in {}, which holds one",
                    self.display,
                    rewritten.len(),
                    field.dotted()
                ))),
            },
            RefShape::ListByKey(_) => {
                let mut map: BTreeMap<String, SourceRef> = BTreeMap::new();
                // Entries already rewritten earlier keep their original.
                if let Some(previous) = annotation_of(self.object)
                    .and_then(|a| serde_json::from_str::<BTreeMap<String, SourceRef>>(a).ok())
                {
                    for found in locate(self.object, field, &self.display)? {
                        let Some(key) = &found.key else { continue };
                        let exported = SourceRef::from_value(found.value).is_ok_and(|r| {
                            r.kind == EXPORT_KIND && is_stock_ref(r.api_version.as_deref(), &r.kind)
                        });
                        if let (true, Some(original)) = (exported, previous.get(key)) {
                            map.insert(key.clone(), original.clone());
                        }
                    }
                }
                for r in rewritten {
                    if let Some(key) = &r.key {
                        map.insert(key.clone(), r.original.clone());
                    }
                }
                compact(&map)
            }
        }
    }
}

fn export_target(name: String) -> Target {
    Target {
        api_version: EXPORT_API_VERSION.to_string(),
        kind: EXPORT_KIND.to_string(),
        name,
        warning: None,
    }
}

/// `value` as compact JSON. References are plain strings, so this cannot
/// fail; if it did, the request is refused rather than annotated with nothing.
fn compact(value: &impl Serialize) -> Result<String, Decision> {
    serde_json::to_string(value).map_err(|e| {
        Decision::internal(format!(
            "openflux cannot encode the original source reference: {e}"
        ))
    })
}

/// The openflux annotation of an object, if set.
fn annotation_of(object: &Value) -> Option<&str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(SOURCE_REF_ANNOTATION)?
        .as_str()
}

/// The patch operation that sets the annotation, if it is not set to `value`.
fn annotation_op(object: &Value, value: &str) -> Option<PatchOperation> {
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
fn locate<'v>(
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

#[cfg(test)]
#[path = "rewrite_tests.rs"]
mod tests;
