//! The shadow OCIRepository: what a custom source is exported as where a
//! consumer cannot read an `ExternalArtifact` (see [`crate::cluster::target`]).
//!
//! A shadow is a stock `OCIRepository` that source-controller never fetches:
//! `spec.suspend` is true and `spec.url` points at a name that never
//! resolves. openflux writes its status: `status.artifact` copied from the
//! Artifact, `observedGeneration` equal to the object's generation (which
//! helm-controller requires of a chartRef), and a `Ready` condition. It
//! carries none of source-controller's own condition types, so
//! source-controller, which still adds its finalizer to a suspended object,
//! leaves `Ready` alone. If anyone resumes a shadow, source-controller wipes
//! its artifact; the admission policy forbids that and openflux re-asserts the
//! status it owns.
//!
//! Everything here is pure: plain functions from the Artifact to JSON.

use serde_json::{json, Value};

/// `spec.url` host of every shadow: the `.invalid` top-level domain never
/// resolves, so a resumed shadow cannot fetch anything.
pub const SHADOW_URL_HOST: &str = "openflux.invalid";
/// `spec.interval` of every shadow (required by the CRD, never used while
/// suspended).
pub const SHADOW_INTERVAL: &str = "60m";
/// The artifact metadata key `flux trace` prints as an OCIRepository's origin.
pub const ORIGIN_SOURCE: &str = "org.opencontainers.image.source";
/// The artifact metadata key Flux reads as the origin revision.
pub const ORIGIN_REVISION: &str = "org.opencontainers.image.revision";

/// The `spec` of a shadow named `name` in `namespace`.
pub fn spec(namespace: &str, name: &str) -> Value {
    json!({
        "url": format!("oci://{SHADOW_URL_HOST}/{namespace}/{name}"),
        "interval": SHADOW_INTERVAL,
        "suspend": true,
    })
}

/// The revision an export carries: one that changes whenever its content
/// does, since consumers (kustomize-controller, helm-controller,
/// source-watcher) act on a new revision, not on a new digest. The
/// producer's revision when it names the artifact's digest (it is the
/// digest, or ends with `@<digest>`); otherwise the producer's name for it
/// (what comes before an `@`, or all of it) at the digest, as Flux writes
/// an OCI artifact's revision: `main@sha1:abc` with digest `sha256:def`
/// becomes `main@sha256:def`. The producer's own revision stays in the
/// [`ORIGIN_REVISION`] metadata.
pub fn content_revision(original: &str, digest: &str) -> String {
    let names_digest = original == digest
        || original
            .strip_suffix(digest)
            .is_some_and(|name| name.ends_with('@'));
    if names_digest {
        return original.to_string();
    }
    let name = original.split_once('@').map_or(original, |(name, _)| name);
    if name.is_empty() || is_algo_hex(name) {
        return digest.to_string();
    }
    format!("{name}@{digest}")
}

/// The revision a shadow carries: [`content_revision`] where helm-controller
/// can read it (it reads an OCIRepository's revision as `<algo>:<hex>` or
/// `<chart version>@<algo>:<hex>`, at least 12 hex characters, and refuses
/// anything else), otherwise the artifact's digest.
pub fn revision(original: &str, digest: &str) -> String {
    let carried = content_revision(original, digest);
    match carried.rsplit_once('@') {
        Some((version, _)) if is_semver(version) => carried,
        _ => digest.to_string(),
    }
}

/// A unique, non-empty `status.artifact.path` for the shadow: source-controller
/// never serves it (the artifact lives at the producer's URL).
pub fn path(namespace: &str, name: &str, digest: &str) -> String {
    let hex = digest.split_once(':').map_or(digest, |(_, h)| h);
    format!("openflux/{namespace}/{name}/{hex}.tar.gz")
}

/// Adds the origin keys `flux trace` prints to an artifact's metadata, unless
/// the producer set them: the custom source as `Kind.group/namespace/name`
/// and the producer's own revision.
pub fn add_origin(metadata: &mut serde_json::Map<String, Value>, origin: &str, revision: &str) {
    metadata
        .entry(ORIGIN_SOURCE)
        .or_insert_with(|| Value::String(origin.to_string()));
    metadata
        .entry(ORIGIN_REVISION)
        .or_insert_with(|| Value::String(revision.to_string()));
}

/// `algo:hex` with at least 12 lowercase hex characters.
fn is_algo_hex(value: &str) -> bool {
    let Some((algo, hex)) = value.split_once(':') else {
        return false;
    };
    !algo.is_empty()
        && algo
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && hex.len() >= 12
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A semantic version `MAJOR.MINOR.PATCH[-pre][+build]` (a chart version).
fn is_semver(value: &str) -> bool {
    let core = value.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn revisions_helm_controller_reads_are_kept_when_they_name_the_digest() {
        let kept = [
            DIGEST.to_string(),
            format!("1.2.3@{DIGEST}"),
            format!("0.1.0-rc.1+build.5@{DIGEST}"),
        ];
        for rev in kept {
            assert_eq!(revision(&rev, DIGEST), rev);
        }
        // A chart version at another checksum: the version at this digest.
        assert_eq!(
            revision("1.2.3@sha256:0000000000000000", DIGEST),
            format!("1.2.3@{DIGEST}")
        );
    }

    #[test]
    fn other_revisions_become_the_digest() {
        for rev in [
            "latest@sha256:4f2a".to_string(),
            format!("latest@{DIGEST}"),
            "main@sha1:abc".to_string(),
            "v1".to_string(),
            "sha256:ABCDEF0123456789".to_string(),
            "sha1:0123456789abcdef0123".to_string(),
            "a:b:c".to_string(),
            "".to_string(),
            format!("1.2@{DIGEST}"),
        ] {
            assert_eq!(revision(&rev, DIGEST), DIGEST, "{rev}");
        }
    }

    #[test]
    fn an_exported_revision_changes_with_the_content_and_keeps_the_producers_name() {
        let other = "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
        for (producer, exported) in [
            // It names the digest: kept.
            (DIGEST.to_string(), DIGEST.to_string()),
            (format!("main@{DIGEST}"), format!("main@{DIGEST}")),
            // It does not: the producer's name at the digest.
            (format!("main@{other}"), format!("main@{DIGEST}")),
            ("main@sha1:abc".to_string(), format!("main@{DIGEST}")),
            ("v1".to_string(), format!("v1@{DIGEST}")),
            // Nothing to keep of it: the digest.
            (other.to_string(), DIGEST.to_string()),
            ("@sha1:abc".to_string(), DIGEST.to_string()),
            ("".to_string(), DIGEST.to_string()),
        ] {
            assert_eq!(content_revision(&producer, DIGEST), exported, "{producer}");
        }
        // The same producer revision over new content is a new revision.
        assert_ne!(
            content_revision("v1", DIGEST),
            content_revision("v1", other)
        );
        assert_ne!(
            revision("1.0.0@sha256:0000000000000000", DIGEST),
            revision("1.0.0@sha256:0000000000000000", other)
        );
    }

    #[test]
    fn the_spec_is_suspended_and_cannot_fetch() {
        let spec = spec("apps", "web.httpsource.sources.openflux.dev");
        assert_eq!(spec["suspend"], true);
        assert_eq!(
            spec["url"],
            "oci://openflux.invalid/apps/web.httpsource.sources.openflux.dev"
        );
        assert!(spec["interval"].as_str().is_some());
    }

    #[test]
    fn paths_are_unique_per_object_and_digest() {
        let a = path("apps", "web", DIGEST);
        assert_eq!(
            a,
            "openflux/apps/web/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.tar.gz"
        );
        assert_ne!(a, path("apps", "web2", DIGEST));
        assert_ne!(a, path("other", "web", DIGEST));
    }

    #[test]
    fn origin_keys_do_not_override_the_producer() {
        let mut metadata = serde_json::Map::new();
        add_origin(
            &mut metadata,
            "HttpSource.sources.openflux.dev/apps/web",
            "latest@x",
        );
        assert_eq!(
            metadata[ORIGIN_SOURCE],
            "HttpSource.sources.openflux.dev/apps/web"
        );
        assert_eq!(metadata[ORIGIN_REVISION], "latest@x");
        let mut own = serde_json::Map::new();
        own.insert(ORIGIN_SOURCE.into(), json!("https://example.org/repo"));
        add_origin(&mut own, "HttpSource.sources.openflux.dev/apps/web", "r");
        assert_eq!(own[ORIGIN_SOURCE], "https://example.org/repo");
    }
}
