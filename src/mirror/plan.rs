//! What the mirror decides, from a stock source object alone: the Artifact
//! it implies (or that it has none), whether a stored Artifact already says
//! it, and the status openflux keeps on it. Plain functions from data to data.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use super::source::{Source, SourceLabels};
use crate::api::{
    Artifact, ArtifactSpec, StockSource, FLUX_SOURCE_GROUP, MANAGED_BY, MANAGED_BY_LABEL,
    SOURCE_KIND_LABEL, SOURCE_NAME_LABEL,
};
pub use crate::vocabulary::mirrored::{fingerprint, is_mirrored};
use crate::vocabulary::uid::Uid;
use crate::{names, shard};

/// What the mirror should do for one source.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Nothing: the source is openflux's own export.
    Skip,
    /// The source has no artifact: its Artifact, if any, goes.
    Remove { name: String },
    /// The source's artifact, as an Artifact.
    Mirror(Box<Artifact>),
}

/// Why a source's artifact cannot be mirrored.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{kind} {namespace}/{name}: status.artifact is malformed: {detail}")]
pub struct InvalidSource {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub detail: String,
}

/// The Artifact a stock source implies. Pure: decides from the object alone.
pub fn plan(
    stock: &StockSource,
    api_version: &str,
    source: &Source,
) -> Result<Plan, InvalidSource> {
    let kind = stock.kind;
    let name = &*source.name;
    if is_own_export(stock, &source.labels) {
        return Ok(Plan::Skip);
    }
    let artifact_name = names::mirror_artifact_name(stock, name);
    let Some(artifact) = source.artifact.as_deref() else {
        return Ok(Plan::Remove {
            name: artifact_name,
        });
    };
    let spec: ArtifactSpec = serde_json::from_str(artifact).map_err(|e| InvalidSource {
        kind: kind.to_string(),
        namespace: source.namespace.to_string(),
        name: name.to_string(),
        detail: e.to_string(),
    })?;
    let owner = OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        uid: source.uid.as_ref().map(Uid::to_string).unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let shard = source
        .labels
        .shard
        .as_deref()
        .map(|shard| (shard::SHARD_LABEL.to_string(), shard.to_string()));
    let artifact = Artifact {
        metadata: ObjectMeta {
            name: Some(artifact_name),
            namespace: Some(source.namespace.to_string()),
            labels: Some(
                BTreeMap::from([
                    (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                    (
                        SOURCE_KIND_LABEL.to_string(),
                        names::label_value(&kind.to_ascii_lowercase()),
                    ),
                    (SOURCE_NAME_LABEL.to_string(), names::label_value(name)),
                ])
                .into_iter()
                .chain(shard)
                .collect(),
            ),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    };
    Ok(Plan::Mirror(Box::new(artifact)))
}

/// Whether a source with `labels` is an object openflux exported itself (an
/// ExternalArtifact, or a shadow of any kind): mirroring it would loop.
pub fn is_own_export(stock: &StockSource, labels: &SourceLabels) -> bool {
    labels.managed_by.as_deref() == Some(MANAGED_BY)
        && (*stock == StockSource::EXTERNAL_ARTIFACT || labels.shadow)
}

/// The controller owner of a stored Artifact, as the owner index keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredOwner<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
}

/// What the owner index knows of the Artifact the mirror would write: its
/// controller owner, and for the mirror of a stock source its fingerprint
/// and resource version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredArtifact<'a> {
    pub owner: Option<StoredOwner<'a>>,
    pub mirrored: Option<(u64, Option<&'a str>)>,
}

/// What the mirror does with the Artifact of its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// It says what the source says.
    UpToDate,
    /// Absent, or the source's own mirror saying something else: write
    /// (remembering the write against this resource version).
    Differs(Option<String>),
    /// Someone else's Artifact holds the name: never written over. The
    /// text says whose.
    Taken(String),
}

/// Decides from the stored Artifact of the name the mirror gives source
/// `name` of kind `stock` whether the mirror may write it: only when it is
/// absent or its controller is that source (a mirror written earlier, for
/// this source or one of that name deleted since, whose Artifact the garbage
/// collector would take). Pure.
pub fn stored(
    current: Option<StoredArtifact<'_>>,
    stock: &StockSource,
    name: &str,
    wanted: u64,
) -> Stored {
    let Some(current) = current else {
        return Stored::Differs(None);
    };
    let ours = current
        .owner
        .is_some_and(|o| o.group == FLUX_SOURCE_GROUP && o.kind == stock.kind && o.name == name);
    match (ours, current.mirrored) {
        (true, Some((fingerprint, _))) if fingerprint == wanted => Stored::UpToDate,
        (true, Some((_, rv))) => Stored::Differs(rv.map(str::to_string)),
        (true, None) => Stored::Differs(None),
        (false, _) => Stored::Taken(match current.owner {
            Some(o) if o.group.is_empty() => format!("{} {name}", o.kind, name = o.name),
            Some(o) => format!("{}.{} {}", o.kind, o.group, o.name),
            None => "an object without a controller owner".to_string(),
        }),
    }
}

/// The write memo's key for the mirrored Artifact `name` in `namespace`.
pub fn memo_key(namespace: &str, name: &str) -> String {
    format!("artifact/{namespace}/{name}")
}

/// A mirrored Artifact as a watch saw it change: when its fingerprint is
/// what the mirror last wrote there, the change is the echo of that write.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Echo {
    /// The Artifact's name.
    pub artifact: std::sync::Arc<str>,
    /// [`fingerprint`] of the Artifact seen.
    pub fingerprint: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::source::FluxSource;
    use kube::ResourceExt;
    use serde_json::json;

    /// A source as the mirror keeps it, from the object the API server sends.
    fn source(kind: &str, status: serde_json::Value, labels: serde_json::Value) -> Source {
        let object: FluxSource = serde_json::from_value(json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": kind,
            "metadata": {"name": "podinfo", "namespace": "apps", "uid": "u-1", "labels": labels,
                         "resourceVersion": "9", "finalizers": ["finalizers.fluxcd.io"]},
            "spec": {},
            "status": status,
        }))
        .unwrap();
        Source::from(&object)
    }

    #[test]
    fn the_mirror_writes_only_over_its_own_artifact() {
        let git = &StockSource::GIT_REPOSITORY;
        let own = StoredOwner {
            group: FLUX_SOURCE_GROUP,
            kind: "GitRepository",
            name: "app",
        };
        let producer = StoredOwner {
            group: "sources.example.com",
            kind: "Web",
            name: "app",
        };
        let other_git = StoredOwner {
            name: "other",
            ..own
        };
        let bucket = StoredOwner {
            kind: "Bucket",
            ..own
        };
        let at = |owner, mirrored| Some(StoredArtifact { owner, mirrored });
        let taken = |s: &Stored| matches!(s, Stored::Taken(_));
        type Case<'a> = (&'a str, Option<StoredArtifact<'a>>, fn(&Stored) -> bool);
        let cases: [Case<'_>; 8] = [
            ("absent", None, |s| *s == Stored::Differs(None)),
            (
                "its own, up to date",
                at(Some(own), Some((7, Some("3")))),
                |s| *s == Stored::UpToDate,
            ),
            ("its own, older", at(Some(own), Some((6, Some("3")))), |s| {
                *s == Stored::Differs(Some("3".into()))
            }),
            (
                "a producer's, controller owner",
                at(Some(producer), None),
                taken,
            ),
            ("a producer's, no controller owner", at(None, None), taken),
            (
                "another GitRepository's mirror",
                at(Some(other_git), Some((7, None))),
                taken,
            ),
            (
                "another kind's mirror",
                at(Some(bucket), Some((7, None))),
                taken,
            ),
            (
                "a producer's with a GitRepository's fingerprint",
                at(Some(producer), Some((7, None))),
                taken,
            ),
        ];
        for (what, current, expected) in cases {
            let decided = stored(current, git, "app", 7);
            assert!(expected(&decided), "{what}: {decided:?}");
        }
        let Stored::Taken(whose) = stored(at(Some(producer), None), git, "app", 7) else {
            unreachable!()
        };
        assert_eq!(whose, "Web.sources.example.com app");
    }

    /// A GitRepository with an artifact in its status.
    fn podinfo() -> Source {
        source(
            "GitRepository",
            json!({"artifact": flux_artifact()}),
            json!({}),
        )
    }

    /// The Artifact the mirror plans for the GitRepository `s`.
    fn mirrored(s: &Source) -> Artifact {
        match plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            s,
        )
        .unwrap()
        {
            Plan::Mirror(a) => *a,
            other => panic!("expected a mirror plan, got {other:?}"),
        }
    }

    fn flux_artifact() -> serde_json::Value {
        json!({
            "digest": "sha256:aa",
            "lastUpdateTime": "2025-05-06T07:08:09Z",
            "path": "gitrepository/apps/podinfo/abc.tar.gz",
            "revision": "main@sha1:abc",
            "size": 42,
            "url": "http://source-controller.flux-system.svc/gitrepository/apps/podinfo/abc.tar.gz"
        })
    }

    #[test]
    fn mirrors_status_artifact_field_for_field() {
        let s = podinfo();
        let a = mirrored(&s);
        assert_eq!(a.name_any(), "gitrepository-podinfo");
        assert_eq!(a.namespace().as_deref(), Some("apps"));
        assert_eq!(serde_json::to_value(&a.spec).unwrap(), flux_artifact());
        let owner = a.controller_owner().unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("GitRepository", "u-1")
        );
        assert_eq!(a.labels().get(SOURCE_KIND_LABEL).unwrap(), "gitrepository");
        assert_eq!(a.labels().get(SOURCE_NAME_LABEL).unwrap(), "podinfo");
    }

    #[test]
    fn no_artifact_means_remove() {
        let s = source("Bucket", json!({"conditions": []}), json!({}));
        assert_eq!(
            plan(&StockSource::BUCKET, "source.toolkit.fluxcd.io/v1", &s).unwrap(),
            Plan::Remove {
                name: "bucket-podinfo".into()
            }
        );
        let s = source("Bucket", json!({"artifact": null}), json!({}));
        assert!(matches!(
            plan(&StockSource::BUCKET, "v", &s).unwrap(),
            Plan::Remove { .. }
        ));
    }

    #[test]
    fn own_exports_are_never_mirrored_but_foreign_ones_are() {
        let ours = source(
            "ExternalArtifact",
            json!({"artifact": flux_artifact()}),
            json!({MANAGED_BY_LABEL: MANAGED_BY}),
        );
        assert_eq!(
            plan(
                &StockSource::EXTERNAL_ARTIFACT,
                "source.toolkit.fluxcd.io/v1",
                &ours
            )
            .unwrap(),
            Plan::Skip
        );
        let foreign = source(
            "ExternalArtifact",
            json!({"artifact": flux_artifact()}),
            json!({}),
        );
        assert!(matches!(
            plan(
                &StockSource::EXTERNAL_ARTIFACT,
                "source.toolkit.fluxcd.io/v1",
                &foreign
            )
            .unwrap(),
            Plan::Mirror(_)
        ));
    }

    #[test]
    fn malformed_artifact_is_an_error_not_a_panic() {
        let s = source("GitRepository", json!({"artifact": {"url": 5}}), json!({}));
        let err = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("GitRepository apps/podinfo"),
            "{err}"
        );
    }

    #[test]
    fn the_fingerprint_covers_spec_labels_and_owner() {
        let s = podinfo();
        let desired = mirrored(&s);
        assert!(is_mirrored(&desired));
        let same = |a: &Artifact| fingerprint(a) == fingerprint(&desired);
        let mut current = desired.clone();
        current.metadata.resource_version = Some("7".into());
        current.metadata.uid = Some("a-1".into());
        current
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("extra".into(), "kept".into());
        current.metadata.annotations = Some([("a".into(), "b".into())].into());
        assert!(same(&current), "what the mirror does not write");
        let mut changed = current.clone();
        changed.spec.revision = "main@sha1:def".into();
        assert!(!same(&changed));
        let mut changed = current.clone();
        changed.spec.size = None;
        assert!(!same(&changed));
        let mut changed = current.clone();
        changed.spec.metadata = Some([("k".into(), "v".into())].into());
        assert!(!same(&changed));
        for label in [MANAGED_BY_LABEL, SOURCE_KIND_LABEL, SOURCE_NAME_LABEL] {
            let mut changed = current.clone();
            changed.metadata.labels.as_mut().unwrap().remove(label);
            assert!(!same(&changed), "{label}");
        }
        let mut orphan = desired.clone();
        orphan.metadata.owner_references = None;
        assert!(!same(&orphan));
        assert!(!is_mirrored(&orphan));
        let mut adopted = desired.clone();
        adopted.metadata.owner_references.as_mut().unwrap()[0].uid = "u-2".into();
        assert!(!same(&adopted));
        let mut custom = desired.clone();
        let owner = &mut custom.metadata.owner_references.as_mut().unwrap()[0];
        (owner.api_version, owner.kind) = ("example.com/v1".into(), "HttpSource".into());
        assert!(!is_mirrored(&custom));
    }

    #[test]
    fn the_mirrored_artifact_is_in_its_sources_shard() {
        let key = crate::shard::SHARD_LABEL;
        let sharded = source(
            "GitRepository",
            json!({"artifact": flux_artifact()}),
            json!({key: "shard1"}),
        );
        let desired = mirrored(&sharded);
        assert_eq!(desired.labels()[key], "shard1");
        let unsharded = mirrored(&podinfo());
        assert!(!unsharded.labels().contains_key(key));
        // Moving the source moves its Artifact: either way it is rewritten.
        assert_ne!(fingerprint(&unsharded), fingerprint(&desired));
        assert_eq!(fingerprint(&desired), fingerprint(&desired.clone()));
    }

    #[test]
    fn a_kept_source_plans_from_the_labels_it_kept() {
        let s = source(
            "GitRepository",
            json!({"artifact": flux_artifact(), "conditions": []}),
            json!({"a": "b", shard::SHARD_LABEL: "shard1"}),
        );
        let labels = mirrored(&s).metadata.labels.unwrap();
        assert_eq!(
            labels.get(shard::SHARD_LABEL).map(String::as_str),
            Some("shard1")
        );
        assert!(!labels.contains_key("a"), "a label the source had");
        let shadow = source(
            "OCIRepository",
            json!({"artifact": flux_artifact()}),
            json!({MANAGED_BY_LABEL: MANAGED_BY, crate::vocabulary::marks::SHADOW_LABEL: "true", "a": "b"}),
        );
        assert_eq!(
            plan(
                &StockSource::OCI_REPOSITORY,
                "source.toolkit.fluxcd.io/v1",
                &shadow
            )
            .unwrap(),
            Plan::Skip
        );
        let gone = source("GitRepository", json!({}), json!({}));
        assert!(matches!(
            plan(&StockSource::GIT_REPOSITORY, "v", &gone).unwrap(),
            Plan::Remove { .. }
        ));
    }
}
