//! Deterministic object names.
//!
//! The mirror names an Artifact after its source's kind and name
//! (`<kind>-<name>`, [`mirror_artifact_name`]). Exported objects are named
//! by [`identity`] (`<name>-<kind>--<hash>`, [`export_name`]), which the
//! webhook computes too, so it can rewrite a reference before the exported
//! object exists. An export's name holds no dot, as ArtifactGenerator's
//! `spec.sources[].name` requires, and always ends in `--` and
//! [`EXPORT_HASH_LEN`] hex characters: the mark by which the validating
//! webhook's `matchConditions` and the policies tell an export's name.
//!
//! The names earlier releases gave exports (`<kind>-<name>`,
//! `artifact-<name>`, then `<name>.<kind>.<group>`) are kept here only to
//! recognise consumers rewritten to them. Names longer than Kubernetes
//! allows are cut and given a hash suffix, so distinct inputs stay
//! distinct.

pub mod identity;

use sha2::{Digest, Sha256};

use crate::api::StockSource;

/// Longest object name Kubernetes accepts for most resources (DNS subdomain).
pub const MAX_NAME: usize = 253;
/// Longest label value Kubernetes accepts.
pub const MAX_LABEL_VALUE: usize = 63;
/// Hex characters of the hash suffix added to names that had to be cut.
const HASH_LEN: usize = 10;
/// Hex characters of each of the two hashes that end an export's name.
const EXPORT_HALF_HASH: usize = 6;
/// Hex characters that end an export's name, after `--`: a hash of its
/// source's group and kind, then one of its whole identity.
pub const EXPORT_HASH_LEN: usize = 2 * EXPORT_HALF_HASH;
/// The end of every export's name, as a regular expression (RE2, which CEL's
/// `matches` speaks): what [`export_kind_hash`] reads.
pub const EXPORT_NAME_END: &str = "--[0-9a-f]{12}$";

/// Name of the Artifact mirrored from the stock source `name` of kind `stock`.
pub fn mirror_artifact_name(stock: &StockSource, name: &str) -> String {
    joined(&stock.kind.to_ascii_lowercase(), name, MAX_NAME)
}

/// The stock source whose mirrored Artifact would be named `artifact`
/// (the inverse of [`mirror_artifact_name`] for names that were not cut).
pub fn mirrored_source_of(artifact: &str) -> Option<(&'static StockSource, &str)> {
    crate::api::STOCK_SOURCES.iter().find_map(|stock| {
        let prefix = stock.kind.to_ascii_lowercase();
        let name = artifact.strip_prefix(&prefix)?.strip_prefix('-')?;
        (!name.is_empty() && mirror_artifact_name(stock, name) == artifact).then_some((stock, name))
    })
}

/// The name earlier releases gave the export of source `kind`/`name`.
pub fn legacy_export_name(kind: &str, name: &str) -> String {
    joined(&kind.to_ascii_lowercase(), name, MAX_NAME)
}

/// The name earlier releases gave the export of one Artifact referenced
/// directly.
pub fn legacy_artifact_export_name(artifact_name: &str) -> String {
    joined("artifact", artifact_name, MAX_NAME)
}

/// A label value for `value`, cut with a hash suffix when it is too long.
pub fn label_value(value: &str) -> String {
    bounded(value, MAX_LABEL_VALUE)
}

fn joined(prefix: &str, name: &str, max: usize) -> String {
    bounded(&format!("{prefix}-{name}"), max)
}

/// An export's name: `head` with its dots turned to dashes (cut when the
/// whole would not fit in [`MAX_NAME`]), then `--`, a hash of `kind_key`
/// and a hash of `identity`. `head` is for people (`<name>-<kind>`); the
/// hashes make the name tell apart what the head cannot (`a.b` from `a-b`,
/// one group from another) and let the policies read the kind back without
/// a lookup ([`export_kind_hash`]). Holds no dot, so every consumer's
/// schema takes it (ArtifactGenerator's `sources[].name` is a DNS label).
pub fn export_name(head: &str, kind_key: &str, identity: &str) -> String {
    // The webhook writes one for every reference it rewrites: built in one
    // buffer, the head's characters mapped one by one.
    let mut mapped = String::with_capacity(head.len().min(MAX_NAME));
    mapped.extend(head.chars().map(|c| match c {
        'a'..='z' | '0'..='9' => c,
        'A'..='Z' => c.to_ascii_lowercase(),
        _ => '-',
    }));
    mapped.truncate(MAX_NAME - 2 - EXPORT_HASH_LEN);
    let head = mapped.trim_matches('-');
    let mut name = String::with_capacity(head.len() + 2 + EXPORT_HASH_LEN);
    name.push_str(head);
    name.push_str("--");
    push_short_hash(&mut name, kind_key);
    push_short_hash(&mut name, identity);
    name
}

/// The hash of the group and kind that ends `name` when it is shaped as an
/// export's name ([`export_name`]), else `None`.
pub fn export_kind_hash(name: &str) -> Option<&str> {
    let at = name.len().checked_sub(EXPORT_HASH_LEN)?;
    let (before, hash) = (name.get(..at)?, name.get(at..)?);
    let hex = hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (before.ends_with("--") && hex).then(|| &hash[..EXPORT_HALF_HASH])
}

/// The hash [`export_name`] writes for `kind_key`.
pub fn kind_hash(kind_key: &str) -> String {
    short_hash(kind_key)
}

fn short_hash(value: &str) -> String {
    let mut hash = String::with_capacity(EXPORT_HALF_HASH);
    push_short_hash(&mut hash, value);
    hash
}

/// Appends the first [`EXPORT_HALF_HASH`] hex digits of `value`'s SHA-256.
fn push_short_hash(out: &mut String, value: &str) {
    let digest = Sha256::digest(value.as_bytes());
    out.push_str(&hex::encode(&digest[..EXPORT_HALF_HASH.div_ceil(2)])[..EXPORT_HALF_HASH]);
}

/// The name the release before gave an export (`<name>.<kind>.<group>`):
/// `value` itself when it fits, otherwise cut to exactly [`MAX_NAME`]
/// characters, its first part and a hash of the whole (a `.` where the hash
/// joins on became `-`). Kept to recognise consumers rewritten to one.
pub fn legacy_dotted_export_name(value: &str) -> String {
    if value.len() <= MAX_NAME {
        return value.to_string();
    }
    let (head, hash) = cut(value, MAX_NAME);
    let head = match head.strip_suffix('.') {
        Some(before) => format!("{before}-"),
        None => head.to_string(),
    };
    format!("{head}-{hash}")
}

/// The name earlier releases gave an export whose name had to be cut
/// ([`bounded`]'s rule, which may end shorter than [`MAX_NAME`]): kept to
/// recognise consumers rewritten to one.
pub fn legacy_bounded_export_name(value: &str) -> String {
    bounded(value, MAX_NAME)
}

/// `value` itself when it fits in `max` characters, otherwise its first part
/// and a hash of the whole, ending in an alphanumeric character.
fn bounded(value: &str, max: usize) -> String {
    if value.len() <= max {
        return value.to_string();
    }
    let (head, hash) = cut(value, max);
    let head = head.trim_end_matches(['-', '.']);
    format!("{head}-{hash}")
}

/// The part of `value` a name cut to `max` keeps, and the hash of the
/// whole that follows it after a `-`.
fn cut(value: &str, max: usize) -> (&str, String) {
    let hash = hex::encode(Sha256::digest(value.as_bytes()));
    // Names are ASCII (DNS subdomains), but stay safe on any input.
    let mut cut = max - HASH_LEN - 1;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    (&value[..cut], hash[..HASH_LEN].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_kind_dash_name() {
        assert_eq!(
            mirror_artifact_name(&StockSource::GIT_REPOSITORY, "podinfo"),
            "gitrepository-podinfo"
        );
        assert_eq!(legacy_export_name("HttpSource", "web"), "httpsource-web");
        assert_eq!(legacy_artifact_export_name("a1"), "artifact-a1");
    }

    #[test]
    fn long_names_stay_valid_and_distinct() {
        let a = "a".repeat(250);
        let b = format!("{}b", "a".repeat(249));
        let na = legacy_export_name("HttpSource", &a);
        let nb = legacy_export_name("HttpSource", &b);
        assert!(na.len() <= MAX_NAME, "{}", na.len());
        assert!(nb.len() <= MAX_NAME);
        assert_ne!(na, nb);
        assert_eq!(na, legacy_export_name("HttpSource", &a), "deterministic");
        assert!(na.chars().last().unwrap().is_ascii_alphanumeric());
    }

    #[test]
    fn a_mirror_name_names_its_source() {
        let (stock, name) = mirrored_source_of("gitrepository-podinfo").unwrap();
        assert_eq!((stock.kind, name), ("GitRepository", "podinfo"));
        let (stock, name) = mirrored_source_of("ocirepository-a-b").unwrap();
        assert_eq!((stock.kind, name), ("OCIRepository", "a-b"));
        assert!(mirrored_source_of("gitrepository-").is_none());
        assert!(mirrored_source_of("web").is_none());
        assert!(mirrored_source_of("httpsource-web").is_none());
    }

    /// The name as it was first written (a hex string per hash, the head
    /// collected, everything joined by `format!`): the faster build gives
    /// the same names, so nothing exported moves.
    fn export_name_as_first_written(head: &str, kind_key: &str, identity: &str) -> String {
        let hash =
            |v: &str| hex::encode(Sha256::digest(v.as_bytes()))[..EXPORT_HALF_HASH].to_string();
        let suffix = format!("--{}{}", hash(kind_key), hash(identity));
        let mut head: String = head
            .chars()
            .map(|c| match c {
                'a'..='z' | '0'..='9' => c,
                'A'..='Z' => c.to_ascii_lowercase(),
                _ => '-',
            })
            .collect();
        head.truncate(MAX_NAME - suffix.len());
        format!("{}{suffix}", head.trim_matches('-'))
    }

    #[test]
    fn export_names_are_what_they_were() {
        let long = "x".repeat(300);
        let cases = [
            (
                "web-gitrepository",
                "source.toolkit.fluxcd.io/GitRepository",
                "ns/web",
            ),
            (
                "My.App_v2-TestSource",
                "bench.openflux.dev/TestSource",
                "ns/My.App_v2",
            ),
            ("-édge-ü-", "g/K", "n/-édge-ü-"),
            (long.as_str(), "g/K", "n/x"),
            ("", "", ""),
        ];
        for (head, kind_key, identity) in cases {
            assert_eq!(
                export_name(head, kind_key, identity),
                export_name_as_first_written(head, kind_key, identity),
                "{head:.40}"
            );
        }
        assert_eq!(kind_hash("g/K"), export_name("a", "g/K", "i")[3..9]);
    }

    #[test]
    fn an_export_name_has_no_dot_and_ends_in_its_mark() {
        for name_len in [1, 40, 200, 230, 241, 253] {
            for (head, key) in [
                ("a.kind", "kind.example.com"),
                ("x-k", "k.g.io"),
                ("-.x", "x"),
            ] {
                let head = format!("{}{head}", "n".repeat(name_len));
                let identity = format!("{head}.{key}");
                let name = export_name(&head, key, &identity);
                assert!(name.len() <= MAX_NAME, "{name}");
                assert!(!name.contains('.'), "{name}");
                assert!(name.starts_with(|c: char| c.is_ascii_alphanumeric()));
                assert_eq!(export_kind_hash(&name), Some(kind_hash(key).as_str()));
                // The identity tells apart what the head cannot.
                let twin = export_name(&head, key, &format!("{identity}x"));
                assert_ne!(name, twin);
            }
        }
        assert_eq!(
            export_name(
                "web-httpsource",
                "httpsource.sources.openflux.dev",
                "web.httpsource.sources.openflux.dev"
            ),
            export_name(
                "web.httpsource",
                "httpsource.sources.openflux.dev",
                "web.httpsource.sources.openflux.dev"
            ),
            "the head is only read by people"
        );
        for not_export in [
            "web",
            "web--12345",
            "web-0123456789ab",
            "web--0123456789aB",
            "web.--0123456789ab.x",
        ] {
            assert_eq!(export_kind_hash(not_export), None, "{not_export}");
        }
        assert_eq!(export_kind_hash("web--0123456789ab"), Some("012345"));
        // The regular expression says what export_kind_hash reads.
        assert_eq!(EXPORT_NAME_END, format!("--[0-9a-f]{{{EXPORT_HASH_LEN}}}$"));
    }

    #[test]
    fn the_dotted_names_of_the_release_before_are_kept() {
        let value = format!("{}.gizmo.e2e.example", "g".repeat(241));
        assert_eq!(legacy_dotted_export_name(&value).len(), MAX_NAME);
        assert_eq!(legacy_bounded_export_name(&value).len(), 252);
        assert_eq!(legacy_dotted_export_name("web.k.g.io"), "web.k.g.io");
    }

    #[test]
    fn label_values_fit() {
        let v = label_value(&"x-".repeat(40));
        assert!(v.len() <= MAX_LABEL_VALUE);
        assert!(!v.ends_with('-'));
        assert_eq!(label_value("short"), "short");
    }
}
