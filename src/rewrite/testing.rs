//! Fixtures for the tests of the decision and its adapters: Artifacts, an
//! owner index of them and the export targets of a cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::api::{Artifact, ArtifactSpec};
use crate::cluster::facts::Facts;
use crate::cluster::target::{Choice, Target};
use crate::index::{IndexedArtifact, OwnerIndex};
use crate::vocabulary::consumers::CONSUMERS;

/// An Artifact in `ns`, owned by `(apiVersion, kind, name)` when given.
pub(crate) fn artifact(ns: &str, name: &str, owner: Option<(&str, &str, &str)>) -> Artifact {
    let mut a = Artifact::new(
        name,
        ArtifactSpec {
            url: "http://storage/a.tar.gz".into(),
            revision: "r1".into(),
            ..Default::default()
        },
    );
    a.metadata.namespace = Some(ns.into());
    a.metadata.owner_references = owner.map(|(api_version, kind, oname)| {
        vec![OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: oname.into(),
            uid: format!("uid-{kind}-{ns}-{oname}-{api_version}"),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    a
}

/// A synced owner index of `artifacts`.
pub(crate) fn index_of(artifacts: &[Artifact]) -> OwnerIndex {
    let mut index = OwnerIndex::new();
    index.reset(artifacts.iter().filter_map(IndexedArtifact::from_artifact));
    index
}

/// A cluster whose consumers all take `target`, serving HttpSource in two
/// API groups, Widget in one, and the Artifact APIs.
pub(crate) fn facts_with(target: Target) -> Facts {
    let mut facts = Facts {
        synced: true,
        ..Facts::default()
    };
    for consumer in CONSUMERS.iter() {
        let choice = Choice {
            target,
            reason: "test".into(),
        };
        facts.choices.insert(consumer.kind, Ok(choice));
    }
    for (kind, group) in [
        ("HttpSource", "sources.openflux.dev"),
        ("HttpSource", "other.example.com"),
        ("Widget", "widgets.example.com"),
        ("Artifact", "openflux.dev"),
        ("Artifact", "other.example.com"),
    ] {
        facts
            .kinds
            .entry(kind.to_string())
            .or_default()
            .insert(group.to_string());
    }
    facts
}
