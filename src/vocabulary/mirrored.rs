//! What marks an Artifact as the mirror of a stock Flux source, and the
//! number that says what the mirror wrote on it: the mirror writes both
//! (see [`crate::mirror::plan::plan`]), the owner index keeps that number
//! in place of the object, and neither decides it for the other. Pure.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

use crate::api::{
    is_stock_source, split_api_version, Artifact, MANAGED_BY_LABEL, SOURCE_KIND_LABEL,
    SOURCE_NAME_LABEL,
};
use crate::shard;

/// Whether `artifact` is the mirror of a stock Flux source: its controller
/// is a kind of source-controller's. Flux reads such a source itself; of
/// these Artifacts only the mirror reads more than the owner index keeps,
/// and it reads their [`fingerprint`].
pub fn is_mirrored(artifact: &Artifact) -> bool {
    controller_of(artifact).is_some_and(|o| {
        let (group, _) = split_api_version(&o.api_version);
        is_stock_source(group, &o.kind)
    })
}

fn controller_of(artifact: &Artifact) -> Option<&OwnerReference> {
    artifact
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// What the mirror writes on an Artifact, as one number: its spec, the
/// labels the mirror sets (the shard's included) and its controller's uid.
/// A stored Artifact says what its source says exactly when its fingerprint
/// is that of the Artifact [`crate::mirror::plan::plan`] made; labels others added do not count.
/// The owner index keeps this number of a mirrored Artifact, in place of
/// the object.
pub fn fingerprint(artifact: &Artifact) -> u64 {
    let mut hasher = DefaultHasher::new();
    // The spec's JSON, written straight into the hasher (writing to it
    // cannot fail).
    let _ = serde_json::to_writer(HashWriter(&mut hasher), &artifact.spec);
    let labels = artifact.labels();
    for key in [
        MANAGED_BY_LABEL,
        SOURCE_KIND_LABEL,
        SOURCE_NAME_LABEL,
        shard::SHARD_LABEL,
    ] {
        labels.get(key).hash(&mut hasher);
    }
    controller_of(artifact)
        .map(|o| o.uid.as_str())
        .hash(&mut hasher);
    hasher.finish()
}

/// Bytes written into a hasher.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        Hasher::write(self.0, bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
