//! Where a custom reference points: the object openflux exports for the
//! source (or for one Artifact), or the stock source an Artifact was
//! mirrored from. Decided from the owner index alone.

use super::decision::Decision;
use super::refs::{Located, SourceRef, MAX_KIND};
use crate::api;
use crate::cluster::facts::Facts;
use crate::index::{LookupError, OwnerIndex};
use crate::names::identity;
use crate::vocabulary::consumers::{Consumer, RefField};

/// Where a resolved reference points.
pub(super) struct Target {
    pub(super) api_version: String,
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) warning: Option<String>,
}

/// What resolving a reference reads: the owner index, the export targets,
/// and the object being decided on, for messages.
pub(super) struct Resolver<'a> {
    pub(super) index: &'a OwnerIndex,
    pub(super) facts: &'a Facts,
    pub(super) consumer: &'static Consumer,
    /// `Kind ns/name` of the object.
    pub(super) display: &'a dyn std::fmt::Display,
}

impl Resolver<'_> {
    /// The exported object named `name`, of the kind this consumer gets.
    fn export(&self, name: String, warning: Option<String>) -> Result<Target, Decision> {
        let choice = self
            .facts
            .target(self.consumer)
            .map_err(|no| Decision::Deny {
                message: format!(
                    "openflux: {} cannot be pointed at a custom source: {no}",
                    self.display
                ),
            })?;
        Ok(Target {
            api_version: choice.target.api_version().to_string(),
            kind: choice.target.kind().to_string(),
            name,
            warning,
        })
    }

    /// The API group of a custom kind referenced without `apiVersion`, from
    /// the kinds the cluster serves.
    fn group_of(
        &self,
        found: &Located<'_>,
        r: &SourceRef,
        namespace: &str,
    ) -> Result<String, Decision> {
        let groups: Vec<&String> = self
            .facts
            .groups_of(&r.kind)
            .into_iter()
            .flatten()
            .filter(|g| g.as_str() != api::FLUX_SOURCE_GROUP)
            .collect();
        match groups.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(Decision::NotServed {
                message: format!(
                    "openflux: {} refers to kind {} in {}, which no API of this cluster serves; install \
                     the CRD of that source kind first, or correct the kind",
                    self.display, r.kind, found.label
                ),
            }),
            many => Err(Decision::Deny {
                message: format!(
                    "openflux: {} refers to {} {namespace}/{} in {} without apiVersion, and several APIs \
                     serve that kind: {}; set apiVersion in {} to pick one",
                    self.display,
                    r.kind,
                    r.name,
                    found.label,
                    many.iter().map(|g| format!("{}.{g}", r.kind)).collect::<Vec<_>>().join(", "),
                    found.label
                ),
            }),
        }
    }

    /// Denies a reference to `kind` of `group` when the cluster serves that
    /// API group but no such kind in it (a typo would otherwise be
    /// rewritten to an export no source ever fills, and wait for it
    /// silently). A group no API serves at all is taken for a CRD not
    /// installed yet: rewritten, with the warning that the source has no
    /// Artifact. Not judged before the survey's first reading.
    fn served(&self, found: &Located<'_>, r: &SourceRef, group: &str) -> Result<(), Decision> {
        let served = self
            .facts
            .groups_of(&r.kind)
            .is_some_and(|groups| groups.contains(group));
        let group_served = self
            .facts
            .kinds
            .values()
            .any(|groups| groups.contains(group));
        if served || !group_served || !self.facts.synced {
            return Ok(());
        }
        let closest = closest_kinds(self.facts, &r.kind, group);
        let hint = if closest.is_empty() {
            String::new()
        } else {
            format!(" (the closest served: {})", closest.join(", "))
        };
        Err(Decision::NotServed {
            message: format!(
                "openflux: {} refers to kind {} of API group {group} in {}, which no API of this \
                 cluster serves{hint}; correct the kind or apiVersion, or install the CRD of that \
                 source kind first",
                self.display, r.kind, found.label
            ),
        })
    }

    /// Where a reference to a (custom) source points.
    pub(super) fn source_target(
        &self,
        found: &Located<'_>,
        r: &SourceRef,
        namespace: &str,
    ) -> Result<Target, Decision> {
        match self.index.find_source(r.group(), &r.kind, namespace, &r.name) {
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
                let group = match r.group() {
                    Some(g) => {
                        self.served(found, r, g)?;
                        g.to_string()
                    }
                    None => self.group_of(found, r, namespace)?,
                };
                let name = identity::source_export_name(&group, &r.kind, &r.name);
                let warning = format!(
                    "{} {namespace}/{} has no Artifact yet; Flux will wait until openflux exports it as {namespace}/{name}",
                    r.kind, r.name
                );
                self.export(name, Some(warning))
            }
            Ok(Some(source)) => {
                let name = identity::source_export_name(&source.group, &source.kind, &source.name);
                self.export(name, None)
            }
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
            let export = identity::artifact_export_name(name);
            let warning = format!(
                "{} {namespace}/{name} does not exist yet; Flux will wait until openflux exports it as \
                 {namespace}/{export}",
                api::KIND
            );
            return self.export(export, Some(warning));
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
                    api_version: owner.api_version.to_string(),
                    kind: kind.to_string(),
                    name: owner.source.name.to_string(),
                    warning: None,
                })
            }
            _ => self.export(self.index.export_name(artifact), None),
        }
    }
}

/// Most kinds a denial names as the closest served.
const CLOSEST: usize = 3;

/// The served kinds closest to `kind` of `group`, as `Kind.group`: the same
/// kind in other groups, then kinds spelled within two edits of it
/// (ignoring case), then the group's other kinds; at most [`CLOSEST`].
/// Nothing for a kind longer than a kind may be (the reference's bounds
/// refuse one before): the cost is O(served kinds) for a kind of at most
/// [`MAX_KIND`] characters.
fn closest_kinds(facts: &Facts, kind: &str, group: &str) -> Vec<String> {
    if kind.len() > MAX_KIND {
        return Vec::new();
    }
    let lower = kind.to_ascii_lowercase();
    let mut ranked: Vec<(usize, String)> = Vec::new();
    for (served, groups) in &facts.kinds {
        let distance = edit_distance(&lower, &served.to_ascii_lowercase());
        for g in groups {
            let rank = match (distance, g == group) {
                (0, _) => 0,
                (1..=2, true) => 1,
                (1..=2, false) => 2,
                (_, true) => 3,
                _ => continue,
            };
            ranked.push((rank * 100 + distance.min(99), format!("{served}.{g}")));
        }
    }
    ranked.sort();
    ranked.into_iter().take(CLOSEST).map(|(_, k)| k).collect()
}

/// Levenshtein distance of two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substituted = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distances() {
        for (a, b, want) in [
            ("", "", 0),
            ("htpsource", "httpsource", 1),
            ("httpsourse", "httpsource", 1),
            ("gizmo", "widget", 5),
            ("abc", "", 3),
        ] {
            assert_eq!(edit_distance(a, b), want, "{a} {b}");
        }
    }

    #[test]
    fn the_closest_kinds_are_the_likely_meant_ones() {
        let facts = Facts::everywhere(
            crate::cluster::target::Target::ExternalArtifact,
            &[
                ("HttpSource", "sources.openflux.dev"),
                ("Bucket", "sources.openflux.dev"),
                ("HttpSource", "other.example"),
                ("Widget", "widgets.example.com"),
            ],
        );
        assert_eq!(
            closest_kinds(&facts, "Htpsource", "sources.openflux.dev"),
            [
                "HttpSource.sources.openflux.dev",
                "HttpSource.other.example",
                "Bucket.sources.openflux.dev"
            ]
        );
        assert_eq!(
            closest_kinds(&facts, "HttpSource", "nowhere.example"),
            [
                "HttpSource.other.example",
                "HttpSource.sources.openflux.dev"
            ]
        );
        assert!(closest_kinds(&facts, "Zzz", "nowhere.example").is_empty());
    }
}
