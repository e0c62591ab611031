//! Export identity: the name of what a consumer is pointed at, and which
//! Artifact of a source fills it.
//!
//! Rules (docs/export-targets.md says the same for users):
//!
//! - A reference to a source exports to one name derived from the source's
//!   API group, kind and name, [`source_export_name`]: `<name>-<kind>--`
//!   and a hash of the group and kind, then of all three
//!   (`web-httpsource--a1b2c3d4e5f6`; see [`crate::names::export_name`]). It
//!   never depends on how many Artifacts the source has, so a consumer
//!   rewritten once keeps pointing at the right object while Artifacts come
//!   and go.
//! - The Artifact that fills it is the source's *default* Artifact
//!   ([`default_order`]): the one its producer labels
//!   `openflux.dev/default-artifact: "true"`; without a label, the oldest
//!   (creation time, then name). Adding an Artifact never moves the default;
//!   removing the default moves it to the next oldest.
//! - A reference to one Artifact (`kind: Artifact`) exports to
//!   [`artifact_export_name`]: the name of a source of kind Artifact in
//!   openflux.dev (`<artifact>-artifact--<hash>`), unless that Artifact is its
//!   source's default, which is the source export.
//!
//! Names longer than Kubernetes allows are cut and end in a hash of the whole
//! (see [`crate::names`]), so distinct identities stay distinct. Two
//! identities that still spell the same name are a collision: the export
//! controller reports it on both Artifacts and the webhook denies with a
//! message naming what to rename; nothing is shared silently.

use crate::api::{GROUP, KIND};
use crate::names::{
    export_kind_hash, export_name, kind_hash, legacy_bounded_export_name,
    legacy_dotted_export_name, EXPORT_HASH_LEN,
};
use std::cmp::Ordering;

/// Name of the object exported for a source of `group`/`kind` named `name`.
pub fn source_export_name(group: &str, kind: &str, name: &str) -> String {
    let head = format!("{name}-{}", kind.to_ascii_lowercase());
    export_name(
        &head,
        &kind_key(group, kind),
        &source_export_value(group, kind, name),
    )
}

/// What the kind hash of an export's name is taken of: the lower-case kind
/// and the group (`httpsource.sources.openflux.dev`).
fn kind_key(group: &str, kind: &str) -> String {
    let kind = kind.to_ascii_lowercase();
    if group.is_empty() {
        kind
    } else {
        format!("{kind}.{group}")
    }
}

/// Whether `name`, shaped as an export's, may be the export of a source of
/// `group`/`kind`: its kind hash is theirs.
pub fn names_kind(name: &str, group: &str, kind: &str) -> bool {
    export_kind_hash(name) == Some(kind_hash(&kind_key(group, kind)).as_str())
}

/// `<name>.<kind>.<group>`: the identity an export's name hashes, and the
/// name the release before gave the export.
fn source_export_value(group: &str, kind: &str, name: &str) -> String {
    format!("{name}.{}", kind_key(group, kind))
}

/// Name of the object exported for one Artifact referenced directly (not its
/// source's default), or for an Artifact without an owner.
pub fn artifact_export_name(artifact: &str) -> String {
    source_export_name(GROUP, KIND, artifact)
}

/// The names the release before gave the export of a source and of an
/// Artifact (`<name>.<kind>.<group>`, `<artifact>.artifact.openflux.dev`).
pub fn dotted_source_export_name(group: &str, kind: &str, name: &str) -> String {
    legacy_dotted_export_name(&source_export_value(group, kind, name))
}

/// [`dotted_source_export_name`] of an Artifact referenced directly.
pub fn dotted_artifact_export_name(artifact: &str) -> String {
    dotted_source_export_name(GROUP, KIND, artifact)
}

/// Whether `candidate` is a name openflux gives, or gave in earlier
/// releases, to the export of a reference to `kind`/`name` (of `group` when
/// known): what a consumer it rewrote points at. Earlier releases named
/// exports `<kind>-<name>` and `artifact-<artifact>`, then
/// `<name>.<kind>.<group>`, and cut long names to a length that could end
/// below the longest. Without the group, a name is taken for the export
/// when it is shaped as one and its head is that of the name and kind.
pub fn is_export_name(group: Option<&str>, kind: &str, name: &str, candidate: &str) -> bool {
    let direct = kind == KIND && group.is_none_or(|g| g == GROUP);
    let (group, kind) = if direct {
        (Some(GROUP), KIND)
    } else {
        (group, kind)
    };
    let lower = kind.to_ascii_lowercase();
    let legacy = if direct {
        crate::names::legacy_artifact_export_name(name)
    } else {
        crate::names::legacy_export_name(kind, name)
    };
    if candidate == legacy {
        return true;
    }
    match group {
        Some(g) => {
            let value = source_export_value(g, kind, name);
            candidate == source_export_name(g, kind, name)
                || candidate == legacy_dotted_export_name(&value)
                || candidate == legacy_bounded_export_name(&value)
        }
        None => {
            let head = source_export_name("", kind, name);
            let head = &head[..head.len() - EXPORT_HASH_LEN];
            let dotted = candidate
                .strip_prefix(&format!("{name}.{lower}."))
                .is_some_and(|g| !g.is_empty());
            dotted
                || (candidate.len() == head.len() + EXPORT_HASH_LEN
                    && candidate.starts_with(head)
                    && export_kind_hash(candidate).is_some())
        }
    }
}

/// One Artifact of a source, as the default rule sees it: its name `N`
/// (owned or borrowed) and its creation time `T`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate<T: Ord, N: Ord = String> {
    pub name: N,
    /// Creation time (any ordered representation); `None` sorts last.
    pub created: Option<T>,
    /// Whether the producer labelled it the default.
    pub labelled_default: bool,
}

/// The default rule as an order: the default Artifact of a source is the
/// first of its Artifacts. Labelled first, then the oldest (no creation
/// time last), then by name; a total order on distinct names.
pub fn default_order<T: Ord, N: Ord>(a: &Candidate<T, N>, b: &Candidate<T, N>) -> Ordering {
    b.labelled_default
        .cmp(&a.labelled_default)
        .then_with(|| match (&a.created, &b.created) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        })
        .then_with(|| a.name.cmp(&b.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::MAX_NAME;

    /// The default among `candidates`, as the index finds it: the first
    /// in [`default_order`], whatever order they come in.
    fn default_artifact(candidates: &[Candidate<u32>]) -> Option<&Candidate<u32>> {
        candidates.iter().min_by(|a, b| default_order(a, b))
    }

    fn c(name: &str, created: Option<u32>, labelled: bool) -> Candidate<u32> {
        Candidate {
            name: name.into(),
            created,
            labelled_default: labelled,
        }
    }

    #[test]
    fn export_names_of_now_and_before_are_recognised() {
        let g = Some("sources.openflux.dev");
        let web = source_export_name("sources.openflux.dev", "HttpSource", "web");
        assert!(web.starts_with("web-httpsource--"), "{web}");
        for group in [g, None] {
            for candidate in [
                web.as_str(),
                "web.httpsource.sources.openflux.dev",
                "httpsource-web",
            ] {
                assert!(
                    is_export_name(group, "HttpSource", "web", candidate),
                    "{candidate}"
                );
            }
        }
        let other = source_export_name("other.io", "HttpSource", "web");
        assert!(!is_export_name(g, "HttpSource", "web", &other));
        assert!(
            is_export_name(None, "HttpSource", "web", &other),
            "no group to tell"
        );
        assert!(!is_export_name(
            g,
            "HttpSource",
            "web",
            "web.httpsource.other.io"
        ));
        assert!(!is_export_name(
            None,
            "HttpSource",
            "web",
            "web.httpsource."
        ));
        assert!(!is_export_name(g, "HttpSource", "web", "my-own-repo"));
        assert!(!is_export_name(
            None,
            "HttpSource",
            "web",
            "web-httpsource--notahash000"
        ));
        assert!(!is_export_name(None, "HttpSource", "we", &web));
        let a1 = artifact_export_name("a1");
        assert!(a1.starts_with("a1-artifact--"), "{a1}");
        for candidate in [a1.as_str(), "a1.artifact.openflux.dev", "artifact-a1"] {
            assert!(
                is_export_name(None, "Artifact", "a1", candidate),
                "{candidate}"
            );
            assert!(is_export_name(
                Some("openflux.dev"),
                "Artifact",
                "a1",
                candidate
            ));
        }
        assert!(!is_export_name(None, "Artifact", "a1", "a1.artifact.other"));
        // A long name is cut at the same place with or without its group.
        let long = "l".repeat(250);
        let cut = source_export_name("sources.openflux.dev", "HttpSource", &long);
        assert_eq!(cut.len(), MAX_NAME);
        assert!(is_export_name(None, "HttpSource", &long, &cut));
        assert!(is_export_name(g, "HttpSource", &long, &cut));
        // Names cut by the earlier rules count too (re-pointing finds them).
        let gizmo = "g".repeat(241);
        let value = format!("{gizmo}.gizmo.e2e.example");
        let e2e = Some("e2e.example");
        for earlier in [
            legacy_bounded_export_name(&value),
            legacy_dotted_export_name(&value),
        ] {
            assert!(is_export_name(e2e, "Gizmo", &gizmo, &earlier), "{earlier}");
            assert!(
                !is_export_name(e2e, "Gizmo", "other", &earlier),
                "{earlier}"
            );
        }
    }

    #[test]
    fn names_carry_the_group_and_kind_in_their_hash() {
        let web = source_export_name("sources.openflux.dev", "HttpSource", "web");
        assert_ne!(web, source_export_name("other.io", "HttpSource", "web"));
        assert!(names_kind(&web, "sources.openflux.dev", "HttpSource"));
        assert!(!names_kind(&web, "other.io", "HttpSource"));
        assert!(!names_kind(&web, "sources.openflux.dev", "Gizmo"));
        assert!(!names_kind(
            "web.httpsource.sources.openflux.dev",
            "sources.openflux.dev",
            "HttpSource"
        ));
        // Dots and dashes in the name, told apart by the hash.
        assert_ne!(
            source_export_name("g.io", "K", "a.b"),
            source_export_name("g.io", "K", "a-b")
        );
        assert_eq!(
            dotted_artifact_export_name("web-v2"),
            "web-v2.artifact.openflux.dev"
        );
        assert_eq!(
            dotted_source_export_name("sources.openflux.dev", "HttpSource", "web"),
            "web.httpsource.sources.openflux.dev"
        );
    }

    #[test]
    fn mirrored_and_custom_names_do_not_clash() {
        // A custom source named like a mirrored Artifact.
        let custom = source_export_name("sources.openflux.dev", "HttpSource", "gitrepository-x");
        let mirror =
            crate::names::mirror_artifact_name(&crate::api::StockSource::GIT_REPOSITORY, "x");
        assert_ne!(custom, mirror);
        assert_ne!(artifact_export_name("x"), mirror);
    }

    #[test]
    fn long_names_stay_valid_and_distinct() {
        let long = "a".repeat(250);
        let one = source_export_name("sources.openflux.dev", "HttpSource", &long);
        let two = source_export_name("other.io", "HttpSource", &long);
        assert!(one.len() <= MAX_NAME && two.len() <= MAX_NAME);
        assert_ne!(one, two);
        assert!(one.ends_with(|ch: char| ch.is_ascii_alphanumeric()));
    }

    #[test]
    fn the_default_is_the_labelled_one_then_the_oldest() {
        let rows: Vec<(Vec<Candidate<u32>>, Option<&str>)> = vec![
            (vec![], None),
            (vec![c("only", Some(5), false)], Some("only")),
            (
                vec![c("new", Some(9), false), c("old", Some(1), false)],
                Some("old"),
            ),
            (
                vec![c("old", Some(1), false), c("marked", Some(9), true)],
                Some("marked"),
            ),
            (
                vec![c("b", Some(1), false), c("a", Some(1), false)],
                Some("a"),
            ),
            (
                vec![c("unknown", None, false), c("dated", Some(7), false)],
                Some("dated"),
            ),
            (
                vec![c("m2", Some(3), true), c("m1", Some(4), true)],
                Some("m2"),
            ),
        ];
        for (candidates, want) in rows {
            let got = default_artifact(&candidates).map(|c| c.name.as_str());
            assert_eq!(got, want, "{candidates:?}");
            let mut reversed = candidates.clone();
            reversed.reverse();
            assert_eq!(default_artifact(&reversed).map(|c| c.name.as_str()), want);
        }
    }

    #[test]
    fn adding_an_artifact_never_moves_the_default() {
        let mut artifacts = vec![c("first", Some(10), false)];
        for (i, name) in ["second", "third", "fourth"].iter().enumerate() {
            artifacts.push(c(name, Some(11 + i as u32), false));
            assert_eq!(default_artifact(&artifacts).unwrap().name, "first");
        }
        artifacts.remove(0);
        assert_eq!(default_artifact(&artifacts).unwrap().name, "second");
    }
}
