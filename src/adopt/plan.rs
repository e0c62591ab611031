//! What adopting an Open Flux Artifact means: the openflux.dev Artifact that
//! stands for it. Pure.
//!
//! Open Flux producers (openfluxcd) write their own Artifact kind, group
//! `openfluxcd.ocm.software` (`openfluxcd.mandelsoft.org` before v0.1.1 of
//! their artifact API), with the artifact in `spec` (url, revision, digest,
//! size, lastUpdateTime, metadata; no path) and owned by their source kind.
//! openflux writes one openflux.dev Artifact per such Artifact, with the
//! same spec and the same controlling owner (the producer's source), so it
//! is indexed and exported exactly like an Artifact a producer wrote itself,
//! and an unchanged Kustomization can reference the Open Flux source.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::core::DynamicObject;
use kube::ResourceExt;

use crate::api::{Artifact, ArtifactSpec, MANAGED_BY, MANAGED_BY_LABEL};
use crate::names::identity::dotted_source_export_name;
use crate::vocabulary::marks::{ADOPTED_FROM_LABEL, ADOPTED_WRITER_ANNOTATION, WRITER_ANNOTATION};
use crate::{names, shard};

/// The API groups of Open Flux's Artifact, newest first.
pub const OPEN_FLUX_GROUPS: [&str; 2] = ["openfluxcd.ocm.software", "openfluxcd.mandelsoft.org"];
/// The version of Open Flux's Artifact API.
pub const OPEN_FLUX_VERSION: &str = "v1alpha1";

/// Name of the openflux.dev Artifact standing for Open Flux Artifact `name`
/// of `group`: `<name>.artifact.<group>`, which earlier releases gave it
/// too (an Artifact's name may hold dots; only exports are named without).
pub fn adopted_name(group: &str, name: &str) -> String {
    dotted_source_export_name(group, "Artifact", name)
}

/// The openflux.dev Artifact standing for `theirs` (an Artifact of `group`);
/// `Err` says why it cannot stand for it.
pub fn adopt(group: &str, theirs: &DynamicObject) -> Result<Artifact, String> {
    let name = theirs.name_any();
    let namespace = theirs.namespace().unwrap_or_default();
    let spec_value = theirs.data.get("spec").cloned().ok_or("it has no spec")?;
    let mut spec: ArtifactSpec =
        serde_json::from_value(spec_value).map_err(|e| format!("its spec is malformed: {e}"))?;
    spec.path = None;
    let owners = theirs.owner_references();
    // Newer producers set a controller owner; older ones only an owner.
    let owner = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or(match owners {
            [only] => Some(only),
            _ => None,
        })
        .ok_or("it has no controlling owner (the Open Flux source that produced it)")?;
    let owner = OwnerReference {
        controller: Some(true),
        block_owner_deletion: None,
        ..owner.clone()
    };
    Ok(Artifact {
        metadata: ObjectMeta {
            name: Some(adopted_name(group, &name)),
            namespace: Some(namespace),
            labels: Some(
                BTreeMap::from([
                    (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                    (ADOPTED_FROM_LABEL.to_string(), names::label_value(group)),
                ])
                .into_iter()
                .chain(shard::shard_label_of(theirs.labels()))
                .collect(),
            ),
            owner_references: Some(vec![owner]),
            annotations: theirs
                .annotations()
                .get(WRITER_ANNOTATION)
                .map(|w| BTreeMap::from([(ADOPTED_WRITER_ANNOTATION.to_string(), w.clone())])),
            ..Default::default()
        },
        spec,
        status: None,
    })
}

/// Whether the stored Artifact `current` already says what `desired` says.
pub fn up_to_date(current: &Artifact, desired: &Artifact) -> bool {
    current.spec == desired.spec
        && current.owner_references() == desired.owner_references()
        && desired
            .labels()
            .iter()
            .all(|(k, v)| current.labels().get(k) == Some(v))
        && shard::same_shard(current.labels(), desired.labels())
        && current.annotations().get(ADOPTED_WRITER_ANNOTATION)
            == desired.annotations().get(ADOPTED_WRITER_ANNOTATION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn theirs(owners: serde_json::Value, spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "openfluxcd.ocm.software/v1alpha1", "kind": "Artifact",
            "metadata": {"name": "http-apps-web", "namespace": "apps", "ownerReferences": owners},
            "spec": spec,
        }))
        .unwrap()
    }

    fn spec() -> serde_json::Value {
        json!({"url": "http://storage/a.tar.gz", "revision": "v1", "digest": "sha256:abc",
               "lastUpdateTime": "2026-01-01T00:00:00Z", "size": 3, "metadata": {"k": "v"}})
    }

    fn owner(controller: Option<bool>) -> serde_json::Value {
        json!({"apiVersion": "openfluxcd.openfluxcd/v1alpha1", "kind": "Http", "name": "web",
               "uid": "u1", "controller": controller})
    }

    #[test]
    fn an_open_flux_artifact_becomes_one_owned_by_its_source() {
        let ours = adopt(
            "openfluxcd.ocm.software",
            &theirs(json!([owner(Some(true))]), spec()),
        )
        .unwrap();
        assert_eq!(
            ours.name_any(),
            "http-apps-web.artifact.openfluxcd.ocm.software"
        );
        assert_eq!(ours.spec.url, "http://storage/a.tar.gz");
        assert_eq!(ours.spec.digest.as_deref(), Some("sha256:abc"));
        assert_eq!(ours.spec.size, Some(3));
        let controller = ours.controller_owner().unwrap();
        assert_eq!(
            (controller.kind.as_str(), controller.name.as_str()),
            ("Http", "web")
        );
        assert_eq!(ours.labels()[ADOPTED_FROM_LABEL], "openfluxcd.ocm.software");
        assert!(up_to_date(&ours, &ours.clone()));
    }

    #[test]
    fn the_adopted_artifact_is_in_the_shard_of_theirs() {
        let key = crate::shard::SHARD_LABEL;
        let group = "openfluxcd.ocm.software";
        let mut sharded = theirs(json!([owner(Some(true))]), spec());
        sharded.labels_mut().insert(key.into(), "shard1".into());
        let ours = adopt(group, &sharded).unwrap();
        assert_eq!(ours.labels()[key], "shard1");
        let main = adopt(group, &theirs(json!([owner(Some(true))]), spec())).unwrap();
        assert!(!main.labels().contains_key(key));
        assert!(!up_to_date(&main, &ours));
        assert!(!up_to_date(&ours, &main));
    }

    #[test]
    fn older_producers_own_without_the_controller_flag() {
        let ours = adopt(
            "openfluxcd.mandelsoft.org",
            &theirs(json!([owner(None)]), spec()),
        )
        .unwrap();
        assert_eq!(ours.controller_owner().unwrap().name, "web");
        let two = json!([owner(None), {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u2"}]);
        let err = adopt("openfluxcd.mandelsoft.org", &theirs(two, spec())).unwrap_err();
        assert!(err.contains("no controlling owner"), "{err}");
        let err = adopt(
            "openfluxcd.ocm.software",
            &theirs(json!([owner(Some(true))]), json!({"url": 3})),
        )
        .unwrap_err();
        assert!(err.contains("malformed"), "{err}");
    }
}
