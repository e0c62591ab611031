//! Deterministic object names.
//!
//! The mirror names an Artifact after its source's kind and name
//! (`<kind>-<name>`, [`mirror_artifact_name`]). Exported objects are named
//! by [`identity`] (`<name>.<kind>.<group>`), which the webhook computes too,
//! so it can rewrite a reference before the exported object exists; the
//! names earlier releases gave exports (`<kind>-<name>`, `artifact-<name>`)
//! are kept here only to recognise consumers rewritten to them. Names longer
//! than Kubernetes allows are cut and given a hash suffix, so distinct inputs
//! stay distinct; an export's name cut to fit is always exactly [`MAX_NAME`]
//! long, the one mark of an export a cut name keeps.

pub mod identity;

use sha2::{Digest, Sha256};

use crate::api::StockSource;

/// Longest object name Kubernetes accepts for most resources (DNS subdomain).
pub const MAX_NAME: usize = 253;
/// Longest label value Kubernetes accepts.
pub const MAX_LABEL_VALUE: usize = 63;
/// Hex characters of the hash suffix added to names that had to be cut.
const HASH_LEN: usize = 10;

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

/// `value` as an export's name: itself when it fits, otherwise cut to
/// exactly [`MAX_NAME`] characters, so that a name cut to fit is told by
/// its length alone (the validating webhook's `matchConditions` select
/// references to exports by their shape; a cut name has no dots to show).
/// Its first part and a hash of the whole; a `.` where the hash joins on
/// becomes `-`, keeping the name a DNS subdomain.
pub fn bounded_export_name(value: &str) -> String {
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

    #[test]
    fn a_cut_export_name_is_told_by_its_length() {
        for name_len in 200..=253 {
            for tail in ["a.kind.example.com", "x.k.g.io", "-.x"] {
                let value = format!("{}{tail}", "n".repeat(name_len));
                let name = bounded_export_name(&value);
                if value.len() <= MAX_NAME {
                    assert_eq!(name, value);
                    continue;
                }
                assert_eq!(name.len(), MAX_NAME, "{value}");
                assert!(!name.contains(".-") && !name.contains("-."), "{name}");
                assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()));
                assert_ne!(name, bounded_export_name(&format!("{value}x")));
            }
        }
        // The earlier rule could end shorter, with no dot left to show.
        let value = format!("{}.gizmo.e2e.example", "g".repeat(241));
        assert_eq!(legacy_bounded_export_name(&value).len(), 252);
        assert_eq!(bounded_export_name(&value).len(), MAX_NAME);
    }

    #[test]
    fn label_values_fit() {
        let v = label_value(&"x-".repeat(40));
        assert!(v.len() <= MAX_LABEL_VALUE);
        assert!(!v.ends_with('-'));
        assert_eq!(label_value("short"), "short");
    }
}
