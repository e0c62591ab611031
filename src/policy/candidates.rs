//! Which custom source kinds a reference to an export may stand for, told
//! from the reference alone and what openflux keeps in memory: never from
//! anything the consumer's author writes besides the reference itself (an
//! annotation on the consumer is theirs to forge).
//!
//! An export of a source is named `<name>-<kind>--` and two hashes, the
//! first of its group and kind ([`crate::names::identity`]). So a name that
//! ends so may be an export, and it stands for each kind the cluster serves
//! (the survey's [`Facts`]) whose hash it carries; when none is served, for
//! the sources with Artifacts in the namespace whose export has that name
//! (none known: no candidate, and a restricted namespace refuses it until
//! its kind is served). An Artifact's own export stands for the Artifact's
//! source when the owner index knows it, otherwise for kind `Artifact`.
//!
//! The release before named exports `<name>.<kind>.<group>`, and consumers
//! it rewrote keep those names until openflux re-points them: a name with
//! three dots or more may be one, and each way of cutting it into name,
//! lower-case kind and group is a source it may stand for. Of those, the
//! kinds the cluster serves count; when none is served, every cut counts.
//! Such a name cut to the longest a name may be (it ends in a hash) cannot
//! be split: it stands for the sources with Artifacts in the namespace
//! whose export had that name.

use crate::api;
use crate::cluster::facts::Facts;
use crate::index::OwnerIndex;
use crate::names::{export_kind_hash, identity, MAX_NAME};
use crate::vocabulary::consumers::is_stock_ref;

use super::SourceKind;

/// What a reference to one of Flux's kinds is, for the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Not a reference to an export: Flux's own source, never restricted.
    NotAnExport,
    /// A reference that may name an export of these source kinds (empty:
    /// none can be told).
    Export(Vec<SourceKind>),
}

/// Whether `kind`/`apiVersion` is a kind openflux exports as.
pub fn is_export_kind(api_version: Option<&str>, kind: &str) -> bool {
    matches!(kind, "ExternalArtifact" | "OCIRepository") && is_stock_ref(api_version, kind)
}

/// Whether `name` has the shape of an export's name, now or in the release
/// before: what the validating webhook configuration's `matchConditions`
/// select, in Rust.
pub fn has_export_shape(name: &str) -> bool {
    export_kind_hash(name).is_some() || name.matches('.').count() >= 3 || name.len() == MAX_NAME
}

/// Reads a reference of `kind` named `name` in `namespace` (the reference's
/// namespace, or the consumer's).
pub fn read(
    api_version: Option<&str>,
    kind: &str,
    name: &str,
    namespace: &str,
    index: &OwnerIndex,
    facts: &Facts,
) -> Reading {
    if !is_export_kind(api_version, kind) || !has_export_shape(name) {
        return Reading::NotAnExport;
    }
    if export_kind_hash(name).is_some() {
        return Reading::Export(read_export_name(name, namespace, index, facts));
    }
    let mut kinds = Vec::new();
    if name.len() == MAX_NAME {
        // Perhaps cut to the limit (then it ends in a hash and cannot be
        // split): the sources openflux knows in the namespace whose export
        // has this name.
        kinds.extend(known_sources(
            index,
            namespace,
            name,
            identity::dotted_source_export_name,
        ));
    }
    let cuts = cuts(name);
    for (source, lower, group) in &cuts {
        match served_kind(facts, group, lower) {
            Some(k) if k.group == api::GROUP && k.kind == api::KIND => {
                kinds.push(artifact_source(index, namespace, source));
            }
            Some(k) => kinds.push(k),
            None => {}
        }
    }
    if kinds.is_empty() && name.len() < MAX_NAME {
        kinds = cuts
            .iter()
            .map(|(_, kind, group)| SourceKind::new(*group, *kind))
            .collect();
    }
    kinds.sort();
    kinds.dedup();
    Reading::Export(kinds)
}

/// The source kinds an export's name ([`crate::names::export_name`]) may
/// stand for: the served kinds whose hash it carries, else the sources
/// openflux knows in `namespace` exported under it.
fn read_export_name(
    name: &str,
    namespace: &str,
    index: &OwnerIndex,
    facts: &Facts,
) -> Vec<SourceKind> {
    let mut kinds = Vec::new();
    for (kind, groups) in &facts.kinds {
        for group in groups
            .iter()
            .filter(|g| identity::names_kind(name, g, kind))
        {
            if group == api::GROUP && kind == api::KIND {
                kinds.push(artifact_export_source(index, namespace, name));
            } else {
                kinds.push(SourceKind::new(group.as_str(), kind.as_str()));
            }
        }
    }
    if kinds.is_empty() {
        kinds.extend(known_sources(
            index,
            namespace,
            name,
            identity::source_export_name,
        ));
    }
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The kinds of the sources openflux knows in `namespace` whose export,
/// named by `naming` (group, kind, name), is `name`.
fn known_sources<'a>(
    index: &'a OwnerIndex,
    namespace: &'a str,
    name: &'a str,
    naming: fn(&str, &str, &str) -> String,
) -> impl Iterator<Item = SourceKind> + 'a {
    index
        .sources()
        .filter(move |s| &*s.namespace == namespace)
        .filter(move |s| naming(&s.group, &s.kind, &s.name) == name)
        .map(|s| SourceKind::new(&*s.group, &*s.kind))
}

/// The source kind the export of one Artifact named `export` stands for:
/// its owner's, when the index knows an Artifact of `namespace` exported
/// under that name (its head names it unless the name had dots or was cut),
/// else `Artifact` itself.
fn artifact_export_source(index: &OwnerIndex, namespace: &str, export: &str) -> SourceKind {
    let head = &export[..export.len() - crate::names::EXPORT_HASH_LEN - 2];
    let named = head
        .strip_suffix("-artifact")
        .and_then(|artifact| index.artifact(namespace, artifact))
        .filter(|a| identity::artifact_export_name(&a.key.name) == export);
    let found = named.or_else(|| {
        index
            .listed()
            .filter(|a| &*a.key.namespace == namespace)
            .find(|a| identity::artifact_export_name(&a.key.name) == export)
    });
    match found {
        Some(a) => artifact_source(index, namespace, &a.key.name),
        None => SourceKind::new(api::GROUP, api::KIND),
    }
}

/// Every way to read `name` as `<source>.<kind>.<group>` with a group that
/// has a dot.
fn cuts(name: &str) -> Vec<(&str, &str, &str)> {
    let dots: Vec<usize> = name.match_indices('.').map(|(i, _)| i).collect();
    let mut out = Vec::new();
    // The kind sits between dots i and i + 1; the group after dot i + 1 must
    // hold a further dot, so i + 2 < dots.len().
    for i in 0..dots.len().saturating_sub(2) {
        let (a, b) = (dots[i], dots[i + 1]);
        let (source, kind, group) = (&name[..a], &name[a + 1..b], &name[b + 1..]);
        if !source.is_empty() && !kind.is_empty() && !group.is_empty() {
            out.push((source, kind, group));
        }
    }
    out
}

/// The served kind of `group` spelled `lower` in an export's name.
fn served_kind(facts: &Facts, group: &str, lower: &str) -> Option<SourceKind> {
    facts
        .kinds
        .iter()
        .find(|(kind, groups)| kind.eq_ignore_ascii_case(lower) && groups.contains(group))
        .map(|(kind, _)| SourceKind::new(group, kind.as_str()))
}

/// The source kind an Artifact's own export stands for: its owner's, when
/// the index knows the Artifact and its owner, else `Artifact` itself.
fn artifact_source(index: &OwnerIndex, namespace: &str, artifact: &str) -> SourceKind {
    index
        .artifact(namespace, artifact)
        .and_then(|a| a.owner.as_ref())
        .map(|o| SourceKind::new(&*o.source.group, &*o.source.kind))
        .unwrap_or_else(|| SourceKind::new(api::GROUP, api::KIND))
}

#[cfg(test)]
mod tests;
