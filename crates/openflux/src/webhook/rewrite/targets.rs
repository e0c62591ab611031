//! Where a custom reference points: the object openflux exports for the
//! source (or for one Artifact), or the stock source an Artifact was
//! mirrored from. Decided from the owner index alone.

use super::refs::{Located, SourceRef};
use crate::api::{self, StockSource};
use crate::index::{LookupError, OwnerIndex};
use crate::naming;
use crate::webhook::consumers::{Consumer, RefField};
use crate::webhook::decision::Decision;

/// The kind openflux exports custom sources as.
pub const EXPORT_KIND: &str = StockSource::EXTERNAL_ARTIFACT.kind;
/// The `apiVersion` openflux exports custom sources as.
pub const EXPORT_API_VERSION: &str = "source.toolkit.fluxcd.io/v1";

/// Where a resolved reference points.
pub(super) struct Target {
    pub(super) api_version: String,
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) warning: Option<String>,
}

fn export_target(name: String) -> Target {
    Target {
        api_version: EXPORT_API_VERSION.to_string(),
        kind: EXPORT_KIND.to_string(),
        name,
        warning: None,
    }
}

/// What resolving a reference reads: the owner index, and the object being
/// decided on, for messages.
pub(super) struct Resolver<'a> {
    pub(super) index: &'a OwnerIndex,
    pub(super) consumer: &'static Consumer,
    /// `Kind ns/name` of the object.
    pub(super) display: &'a str,
}

impl Resolver<'_> {
    /// Where a reference to a (custom) source points.
    pub(super) fn source_target(
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
    pub(super) fn artifact_target(
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
}
