//! What the owner index keeps of one Artifact, read from the object: its
//! key, its controller owner, and what the default rule weighs.

use std::fmt;
use std::sync::Arc;

use hashbrown::Equivalent;
use kube::ResourceExt;

use crate::api::{reason, split_api_version, Artifact};
use crate::vocabulary::marks::DEFAULT_ARTIFACT_LABEL;
use crate::vocabulary::mirrored::{fingerprint, is_mirrored};
use crate::vocabulary::uid::Uid;

/// Text the index keeps: shared, so one string serves every map that
/// names it, and the namespaces, groups and kinds of all Artifacts are kept
/// once each ([`super::OwnerIndex`] interns them).
pub type Text = Arc<str>;

/// Identity of a source object: API group, kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    pub group: Text,
    pub kind: Text,
    pub namespace: Text,
    pub name: Text,
}

impl fmt::Display for SourceKey {
    /// `Kind.group ns/name`, the way `kubectl` spells a resource.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        } else {
            write!(
                f,
                "{}.{} {}/{}",
                self.kind, self.group, self.namespace, self.name
            )
        }
    }
}

/// A [`SourceKey`] borrowed from a request: looks one up without copying.
/// Hashes as the key does (the same fields, in the same order).
#[derive(Clone, Copy, Debug, Hash)]
pub(crate) struct SourceKeyRef<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Equivalent<SourceKey> for SourceKeyRef<'_> {
    fn equivalent(&self, key: &SourceKey) -> bool {
        self.name == &*key.name
            && self.namespace == &*key.namespace
            && self.kind == &*key.kind
            && self.group == &*key.group
    }
}

/// The key of the index's groups by kind, namespace and name, borrowed.
#[derive(Clone, Copy, Debug, Hash)]
pub(crate) struct KindKeyRef<'a>(pub &'a str, pub &'a str, pub &'a str);

impl Equivalent<(Text, Text, Text)> for KindKeyRef<'_> {
    fn equivalent(&self, key: &(Text, Text, Text)) -> bool {
        self.2 == &*key.2 && self.1 == &*key.1 && self.0 == &*key.0
    }
}

/// An [`ArtifactKey`] borrowed.
#[derive(Clone, Copy, Debug, Hash)]
pub(crate) struct ArtifactKeyRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Equivalent<ArtifactKey> for ArtifactKeyRef<'_> {
    fn equivalent(&self, key: &ArtifactKey) -> bool {
        self.name == &*key.name && self.namespace == &*key.namespace
    }
}

/// Identity of an Artifact: namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArtifactKey {
    pub namespace: Text,
    pub name: Text,
}

impl ArtifactKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        ArtifactKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of `artifact`; `None` when it has no namespace or name (never
    /// the case for stored objects).
    pub fn of(artifact: &Artifact) -> Option<Self> {
        Some(Self::new(
            artifact.metadata.namespace.as_deref()?,
            artifact.metadata.name.as_deref()?,
        ))
    }
}

impl fmt::Display for ArtifactKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The controller owner of an Artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub source: SourceKey,
    /// `apiVersion` as written in the ownerReference.
    pub api_version: Text,
    pub uid: Uid,
}

/// What the index keeps of one Artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedArtifact {
    pub key: ArtifactKey,
    pub uid: Uid,
    pub owner: Option<Owner>,
    /// Creation time as the API server wrote it (RFC 3339, seconds, UTC:
    /// its text order is its time order).
    pub created: Option<Text>,
    /// Whether the producer labelled it its source's default Artifact.
    pub labelled_default: bool,
    /// Whether the trust check refused it: its writer may not speak for its
    /// source ([`crate::export::verify`]). Read from its `Ready` condition
    /// (reason `Untrusted`), and recorded by the export controller as soon
    /// as it checks ([`super::OwnerIndex::record_verdict`]). A refused
    /// Artifact never is its source's default, so it can neither take over
    /// nor block the source's export.
    pub untrusted: bool,
    /// For the mirror of a stock Flux source, what the mirror compares: the
    /// watch's cache does not keep these Artifacts whole.
    pub mirrored: Option<MirroredState>,
}

/// What the mirror reads of an Artifact it keeps for a stock source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirroredState {
    pub resource_version: Option<Text>,
    /// [`crate::vocabulary::mirrored::fingerprint`] of the stored object.
    pub fingerprint: u64,
}

impl IndexedArtifact {
    /// Reads the fields the index needs from an Artifact object; `None` when
    /// the object has no namespace or name (never the case for stored objects).
    pub fn from_artifact(artifact: &Artifact) -> Option<Self> {
        let key = ArtifactKey::of(artifact)?;
        let namespace = key.namespace.clone();
        let owner = artifact.controller_owner().map(|o| {
            let (group, _) = split_api_version(&o.api_version);
            Owner {
                source: SourceKey {
                    group: group.into(),
                    kind: o.kind.as_str().into(),
                    namespace: namespace.clone(),
                    name: o.name.as_str().into(),
                },
                api_version: o.api_version.as_str().into(),
                uid: Uid::new(&o.uid),
            }
        });
        Some(Self {
            key,
            uid: Uid::new(artifact.metadata.uid.as_deref().unwrap_or_default()),
            owner,
            created: artifact
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string().into()),
            labelled_default: artifact
                .labels()
                .get(DEFAULT_ARTIFACT_LABEL)
                .is_some_and(|v| v == "true"),
            untrusted: artifact
                .ready_condition()
                .is_some_and(|c| c.status == "False" && c.reason == reason::UNTRUSTED),
            mirrored: is_mirrored(artifact).then(|| MirroredState {
                resource_version: artifact
                    .metadata
                    .resource_version
                    .as_deref()
                    .map(Text::from),
                fingerprint: fingerprint(artifact),
            }),
        })
    }
}

/// The default among `artifacts` (see [`crate::names::identity::default_order`]),
/// leaving out those the trust check refused; allocates nothing.
pub(super) fn default_among<'a>(
    artifacts: impl Iterator<Item = &'a IndexedArtifact>,
) -> Option<&'a IndexedArtifact> {
    let candidate = |a: &'a IndexedArtifact| crate::names::identity::Candidate {
        name: &*a.key.name,
        created: a.created.as_deref(),
        labelled_default: a.labelled_default,
    };
    artifacts
        .filter(|a| !a.untrusted)
        .min_by(|a, b| crate::names::identity::default_order(&candidate(a), &candidate(b)))
}
