//! What the owner index keeps of one Artifact, read from the object: its
//! key, its controller owner, and what the default rule weighs.

use std::fmt;

use kube::ResourceExt;

use crate::api::{reason, split_api_version, Artifact};
use crate::identity::DEFAULT_ARTIFACT_LABEL;

/// Identity of a source object: API group, kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
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

/// Identity of an Artifact: namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArtifactKey {
    pub namespace: String,
    pub name: String,
}

impl ArtifactKey {
    /// The key of `artifact`; `None` when it has no namespace or name (never
    /// the case for stored objects).
    pub fn of(artifact: &Artifact) -> Option<Self> {
        Some(Self {
            namespace: artifact.metadata.namespace.clone()?,
            name: artifact.metadata.name.clone()?,
        })
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
    pub api_version: String,
    pub uid: String,
}

/// What the index keeps of one Artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedArtifact {
    pub key: ArtifactKey,
    pub uid: String,
    pub owner: Option<Owner>,
    /// Creation time as the API server wrote it (RFC 3339, seconds, UTC:
    /// its text order is its time order).
    pub created: Option<String>,
    /// Whether the producer labelled it its source's default Artifact.
    pub labelled_default: bool,
    /// Whether the trust check refused it: its writer may not speak for its
    /// source ([`crate::export::verify`]). Read from its `Ready` condition
    /// (reason `Untrusted`), and recorded by the export controller as soon
    /// as it checks ([`super::OwnerIndex::record_verdict`]). A refused
    /// Artifact never is its source's default, so it can neither take over
    /// nor block the source's export.
    pub untrusted: bool,
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
                    group: group.to_string(),
                    kind: o.kind.clone(),
                    namespace: namespace.clone(),
                    name: o.name.clone(),
                },
                api_version: o.api_version.clone(),
                uid: o.uid.clone(),
            }
        });
        Some(Self {
            key,
            uid: artifact.uid().unwrap_or_default(),
            owner,
            created: artifact
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string()),
            labelled_default: artifact
                .labels()
                .get(DEFAULT_ARTIFACT_LABEL)
                .is_some_and(|v| v == "true"),
            untrusted: artifact
                .ready_condition()
                .is_some_and(|c| c.status == "False" && c.reason == reason::UNTRUSTED),
        })
    }
}
