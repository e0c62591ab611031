//! The rewrite decision: where a consumer's references to custom sources
//! should point.
//!
//! [`decide`] is a pure function of one consumer object, the owner index
//! and the options; it knows nothing of admission requests. The mutating
//! webhook's decision ([`mutate`]) and the consumer re-pointer
//! ([`crate::consumers::repoint`]) are thin adapters over it; the
//! validating webhook's ([`validate`]) judges what it wrote and what
//! consumers name directly. A reference
//! to a stock Flux source is never changed. A reference to any other kind
//! is resolved through the owner index and replaced by a reference to the
//! object openflux exports for it; the reference as the person wrote it is
//! kept in the [`SOURCE_REF_ANNOTATION`](crate::api::SOURCE_REF_ANNOTATION)
//! annotation:
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
use json_patch::{Patch, PatchOperation, ReplaceOperation};
use serde_json::Value;

use crate::api::{self, FLUX_SOURCE_GROUP};
use crate::cluster::facts::Facts;
use crate::index::OwnerIndex;
use crate::names::identity;
use crate::policy::Policies;
use crate::vocabulary::consumers::{is_stock_ref, Consumer, RefField, RefShape};

pub mod admission;
pub mod decision;
mod destination;
pub mod mutate;
pub mod refs;
pub mod validate;
pub mod writer;

pub use decision::{Decision, Options};
use destination::Resolver;
pub use refs::SourceRef;
use refs::{annotation_of, annotation_op, compact, locate, Located, Subject};

/// What a decision reads besides the object: the owner index and the
/// export targets, both kept up to date by the watches.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub index: &'a OwnerIndex,
    pub facts: &'a Facts,
    /// The SourcePolicies and namespace labels ([`crate::policy::NONE`]
    /// where there are none).
    pub policies: &'a Policies,
}

/// The consumer object a decision is about.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub consumer: &'static Consumer,
    /// The object as it would be stored.
    pub object: &'a Value,
    /// The object as stored before, when this replaces it (an update).
    pub stored: Option<&'a Value>,
    /// The consumer's namespace (a reference without one is to a source
    /// there); empty is refused.
    pub namespace: &'a str,
    /// The consumer's name, for messages (may be empty on a create with
    /// `generateName`).
    pub name: &'a str,
}

/// Decides where `input`'s references point. Never panics and makes no
/// I/O. An object being deleted is left as it is.
pub fn decide(input: Input<'_>, view: View<'_>, options: &Options) -> Decision {
    if input
        .object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return Decision::Unchanged;
    }
    if input.namespace.is_empty() {
        return Decision::bad_request(format!("the {} has no namespace", input.consumer.kind));
    }
    let display = Subject::new(input.consumer.kind, input.namespace, input.name);
    if !input.object.get("spec").is_some_and(Value::is_object) {
        return Decision::bad_request(format!("{display} has no spec"));
    }
    let decider = Decider {
        input,
        view,
        options,
        display,
    };
    decider.run().unwrap_or_else(|stop| stop)
}

/// A reference that gets rewritten.
struct Rewritten<'a> {
    pointer: PointerBuf,
    key: Option<String>,
    /// The reference as the object has it.
    current: &'a Value,
    value: Value,
    original: SourceRef,
    warning: Option<String>,
}

struct Decider<'a> {
    input: Input<'a>,
    view: View<'a>,
    options: &'a Options,
    /// `Kind ns/name` of the object, for messages.
    display: Subject<'a>,
}

impl<'a> Decider<'a> {
    fn run(&self) -> Result<Decision, Decision> {
        if let Some(forbidden) = &self.input.consumer.forbidden {
            for found in locate(self.input.object, &forbidden.field, &self.display)? {
                let r = self.parse_ref(&found)?;
                if !forbidden.field.is_stock(r.api_version.as_deref(), &r.kind) {
                    return Err(Decision::Deny {
                        message: format!(
                            "openflux: {} cannot take {} {} in {}: {}.",
                            self.display, r.kind, r.name, found.label, forbidden.hint
                        ),
                    });
                }
            }
        }
        let field = &self.input.consumer.refs;
        let mut rewritten = Vec::new();
        for found in locate(self.input.object, field, &self.display)? {
            if let Some(r) = self.resolve(field, &found)? {
                rewritten.push(r);
            }
        }
        if rewritten.is_empty() {
            return Ok(Decision::Unchanged);
        }
        let annotation = self.annotation(field, &rewritten)?;
        let mut ops = Vec::with_capacity(rewritten.len() + 1);
        let mut warnings = Vec::new();
        for r in rewritten {
            if r.current != &r.value {
                ops.push(PatchOperation::Replace(ReplaceOperation {
                    path: r.pointer,
                    value: r.value,
                }));
            }
            warnings.extend(r.warning);
        }
        if let Some(op) = annotation_op(self.input.object, annotation) {
            ops.push(op);
        }
        if ops.is_empty() {
            return Ok(Decision::Unchanged);
        }
        Ok(Decision::Rewrite {
            patch: Patch(ops),
            warnings,
        })
    }

    fn resolver(&self) -> Resolver<'_> {
        Resolver {
            index: self.view.index,
            facts: self.view.facts,
            consumer: self.input.consumer,
            display: &self.display,
        }
    }

    fn parse_ref(&self, found: &Located<'_>) -> Result<SourceRef, Decision> {
        SourceRef::from_value(found.value)
            .map_err(|e| Decision::bad_request(format!("{}: {}.{e}", self.display, found.label)))
    }

    /// The rewrite of one reference, or `None` when it stays as it is.
    fn resolve(
        &self,
        field: &RefField,
        found: &Located<'a>,
    ) -> Result<Option<Rewritten<'a>>, Decision> {
        let mut r = self.parse_ref(found)?;
        if !field.has_api_version {
            // The API server drops it; the kind alone counts.
            r.api_version = None;
        }
        if field.is_stock(r.api_version.as_deref(), &r.kind) {
            return Ok(None);
        }
        r.well_formed()
            .map_err(|e| Decision::bad_request(format!("{}: {}.{e}", self.display, found.label)))?;
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
        let source_ns = r.namespace.as_deref().unwrap_or(self.input.namespace);
        if self.options.no_cross_namespace_refs && source_ns != self.input.namespace {
            return Err(Decision::Deny {
                message: format!(
                    "openflux: {} refers to {} {source_ns}/{} in {}, in another namespace, and cross-namespace \
                     references are disabled (--no-cross-namespace-refs); use a source in namespace {} or remove \
                     {}.namespace",
                    self.display, r.kind, r.name, found.label, self.input.namespace, found.label
                ),
            });
        }
        if !self.view.index.is_synced() || !self.view.facts.synced {
            return Err(Decision::Error {
                code: 503,
                message: format!(
                    "openflux has not finished loading its Artifacts and export targets and cannot resolve {} {source_ns}/{} yet; \
                     retry in a few seconds",
                    r.kind, r.name
                ),
            });
        }
        let direct = r.kind == api::KIND && matches!(r.group(), None | Some(api::GROUP));
        let target = if direct {
            self.resolver()
                .artifact_target(field, found, source_ns, &r.name)?
        } else {
            self.resolver().source_target(found, &r, source_ns)?
        };
        let mut value = found.value.clone();
        if let Some(fields) = value.as_object_mut() {
            // A field the reference has is overwritten in place (no new key).
            let mut set = |key: &str, text: String| match fields.get_mut(key) {
                Some(slot) => *slot = Value::String(text),
                None => {
                    fields.insert(key.to_string(), Value::String(text));
                }
            };
            if field.has_api_version {
                set("apiVersion", target.api_version);
            }
            set("kind", target.kind);
            set("name", target.name);
            if !field.has_api_version {
                fields.remove("apiVersion");
            }
        }
        Ok(Some(Rewritten {
            pointer: found.pointer.clone(),
            key: found.key.clone(),
            current: found.value,
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
        let Some(old) = self.input.stored else {
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
                if let Some(previous) = annotation_of(self.input.object)
                    .and_then(|a| serde_json::from_str::<BTreeMap<String, SourceRef>>(a).ok())
                {
                    for found in locate(self.input.object, field, &self.display)? {
                        let Some(key) = &found.key else { continue };
                        let (Ok(now), Some(original)) =
                            (SourceRef::from_value(found.value), previous.get(key))
                        else {
                            continue;
                        };
                        if is_export_of(original, &now) {
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

/// Whether `now` is the export openflux points a reference to `original` at
/// (of either target kind, under the current or an earlier naming).
pub fn is_export_of(original: &SourceRef, now: &SourceRef) -> bool {
    let export_kind = matches!(now.kind.as_str(), "ExternalArtifact" | "OCIRepository");
    export_kind
        && is_stock_ref(now.api_version.as_deref(), &now.kind)
        && identity::is_export_name(original.group(), &original.kind, &original.name, &now.name)
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
