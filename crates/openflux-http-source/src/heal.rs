//! Healing the published artifact, as a plain function: every reconcile
//! checks that the artifact in the status is this source's, is in this
//! controller's storage, and is advertised at the current address
//! (`--storage-adv-addr`). A stale address is rewritten at once (without a
//! fetch, so consumers recover even while the remote is down); an artifact
//! that is not in storage is dropped from the status and fetched again.

use openflux_api::producer::storage::Storage;

use crate::api::ArtifactSummary;

/// What to do with the published artifact.
#[derive(Debug, Clone, PartialEq)]
pub enum Healing {
    /// Nothing is published.
    Nothing,
    /// It is fine as it is.
    Keep,
    /// It is stored, but advertised elsewhere: publish it at this URL.
    Rewrite(ArtifactSummary),
    /// It cannot be served from here: fetch it again.
    Lost(String),
}

/// The storage path of a source's artifact with `digest`, if the digest is
/// a sha256 one (the only kind this controller stores).
pub fn expected_path(namespace: &str, name: &str, digest: &str) -> Option<String> {
    let hex = digest.strip_prefix("sha256:")?;
    let well_formed = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    well_formed.then(|| Storage::relative_path(namespace, name, hex))
}

/// Judges the published artifact of source `namespace`/`name`; `stored`
/// says whether its file is in storage, `url` is the current URL of a
/// storage path.
pub fn judge(
    published: Option<&ArtifactSummary>,
    namespace: &str,
    name: &str,
    stored: bool,
    url: impl Fn(&str) -> String,
) -> Healing {
    let Some(artifact) = published else {
        return Healing::Nothing;
    };
    if expected_path(namespace, name, &artifact.digest).as_deref() != Some(artifact.path.as_str()) {
        return Healing::Lost(format!(
            "the artifact path '{}' is not this source's artifact of digest '{}'",
            artifact.path, artifact.digest
        ));
    }
    if !stored {
        return Healing::Lost(format!(
            "the artifact '{}' is missing from storage",
            artifact.path
        ));
    }
    let current = url(&artifact.path);
    if artifact.url != current {
        return Healing::Rewrite(ArtifactSummary {
            url: current,
            ..artifact.clone()
        });
    }
    Healing::Keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    const HEX: &str = "3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c3f1c";

    fn artifact(url: &str, path: &str) -> ArtifactSummary {
        ArtifactSummary {
            url: url.into(),
            revision: format!("sha256:{HEX}"),
            digest: format!("sha256:{HEX}"),
            path: path.into(),
            size: 1,
            last_update_time: Time(Timestamp::from_second(1).unwrap()),
        }
    }

    fn url(path: &str) -> String {
        format!("http://new:9090/{path}")
    }

    #[test]
    fn keeps_a_stored_artifact_at_the_current_address() {
        let path = format!("apps/web/{HEX}.tar.gz");
        let a = artifact(&url(&path), &path);
        assert_eq!(judge(Some(&a), "apps", "web", true, url), Healing::Keep);
        assert_eq!(judge(None, "apps", "web", true, url), Healing::Nothing);
    }

    #[test]
    fn rewrites_an_old_address() {
        let path = format!("apps/web/{HEX}.tar.gz");
        let a = artifact(&format!("http://old:9090/{path}"), &path);
        match judge(Some(&a), "apps", "web", true, url) {
            Healing::Rewrite(healed) => {
                assert_eq!(healed.url, url(&path));
                assert_eq!(healed.digest, a.digest);
                assert_eq!(healed.last_update_time, a.last_update_time);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refetches_what_is_not_stored_or_not_its_own() {
        let path = format!("apps/web/{HEX}.tar.gz");
        let a = artifact(&url(&path), &path);
        assert!(matches!(
            judge(Some(&a), "apps", "web", false, url),
            Healing::Lost(m) if m.contains("missing")
        ));
        // Another source's file, or one that does not match the digest.
        for path in [
            format!("other/web/{HEX}.tar.gz"),
            format!("apps/web/{}.tar.gz", "0".repeat(64)),
            "apps/web/../../etc/passwd".to_string(),
        ] {
            let a = artifact(&url(&path), &path);
            assert!(
                matches!(judge(Some(&a), "apps", "web", true, url), Healing::Lost(_)),
                "{path}"
            );
        }
        assert_eq!(expected_path("a", "b", "sha512:00"), None);
        assert_eq!(expected_path("a", "b", "sha256:ABC"), None);
    }
}
