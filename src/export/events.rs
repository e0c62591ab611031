//! The Events of the export controller, as Flux controllers emit them: one
//! when an Artifact's `Ready` condition changes (exported at a new revision,
//! or refused: InvalidArtifact, ExportConflict, ExportTargetMissing), none
//! while it stays the same.
//!
//! notification-controller's Alerts select only Flux's own kinds, so a
//! posted event names the object the Artifact is exported as (an
//! ExternalArtifact, which an Alert can select) once there is one; the
//! Kubernetes Event stays on the Artifact.

use k8s_openapi::api::core::v1::ObjectReference as KubeObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::runtime::events::{META_DIGEST, META_REVISION};
use crate::api::runtime::FluxEvent;
use crate::api::{reason, Artifact, ArtifactStatus, ObjectReference};

/// The event a status change means, if any: `before` is the `Ready`
/// condition the Artifact had, `after` the status written.
pub fn ready_event(
    artifact: &Artifact,
    before: Option<&Condition>,
    after: &ArtifactStatus,
) -> Option<FluxEvent> {
    let ready = after.conditions.iter().find(|c| c.type_ == "Ready")?;
    let same = |c: &&Condition| {
        c.status == ready.status && c.reason == ready.reason && c.message == ready.message
    };
    if before.filter(same).is_some() {
        return None;
    }
    let event = if ready.status == "True" {
        FluxEvent::normal(&ready.reason, &ready.message)
    } else {
        FluxEvent::warning(&ready.reason, &ready.message)
    };
    let event = event.with_metadata(META_REVISION, &artifact.spec.revision);
    Some(match (ready.reason.as_str(), &artifact.spec.digest) {
        (reason::EXPORTED, Some(digest)) => event.with_metadata(META_DIGEST, digest),
        _ => event,
    })
}

/// The object notification-controller is told an event is about: the
/// exported object, once the Artifact has one.
pub fn alert_target(artifact: &Artifact, after: &ArtifactStatus) -> Option<KubeObjectReference> {
    let exported = after.exported_ref.as_ref().or_else(|| {
        artifact
            .status
            .as_ref()
            .and_then(|s| s.exported_ref.as_ref())
    })?;
    Some(kube_reference(exported))
}

fn kube_reference(r: &ObjectReference) -> KubeObjectReference {
    KubeObjectReference {
        api_version: Some(r.api_version.clone()),
        kind: Some(r.kind.clone()),
        name: Some(r.name.clone()),
        namespace: r.namespace.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ArtifactSpec;

    fn artifact() -> Artifact {
        let mut a = Artifact::new(
            "a",
            ArtifactSpec {
                url: "http://x/a.tar.gz".into(),
                revision: "v2".into(),
                digest: Some("sha256:00".into()),
                ..Default::default()
            },
        );
        a.metadata.namespace = Some("apps".into());
        a
    }

    fn condition(status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: crate::api::conditions::now(),
            observed_generation: None,
        }
    }

    fn status(c: Condition, exported: Option<ObjectReference>) -> ArtifactStatus {
        ArtifactStatus {
            conditions: vec![c],
            exported_ref: exported,
            ..Default::default()
        }
    }

    fn external(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: "source.toolkit.fluxcd.io/v1".into(),
            kind: "ExternalArtifact".into(),
            name: name.into(),
            namespace: Some("apps".into()),
        }
    }

    #[test]
    fn an_export_at_a_new_revision_is_a_normal_event_about_the_export() {
        let a = artifact();
        let before = condition("True", reason::EXPORTED, "exported at 'v1'");
        let after = status(
            condition("True", reason::EXPORTED, "exported at 'v2'"),
            Some(external("artifact-a")),
        );
        let event = ready_event(&a, Some(&before), &after).expect("a new revision is an event");
        assert!(!event.warning);
        assert_eq!(event.reason, reason::EXPORTED);
        assert_eq!(
            event.metadata.get(META_REVISION).map(String::as_str),
            Some("v2")
        );
        assert_eq!(
            event.metadata.get(META_DIGEST).map(String::as_str),
            Some("sha256:00")
        );
        let target = alert_target(&a, &after).unwrap();
        assert_eq!(target.kind.as_deref(), Some("ExternalArtifact"));
        assert_eq!(target.name.as_deref(), Some("artifact-a"));
        // The same condition again is no event.
        let same = condition("True", reason::EXPORTED, "exported at 'v2'");
        assert!(ready_event(&a, Some(&same), &after).is_none());
    }

    #[test]
    fn a_refusal_is_a_warning_about_the_artifact_until_exported() {
        let a = artifact();
        let after = status(condition("False", reason::EXPORT_CONFLICT, "taken"), None);
        let event = ready_event(&a, None, &after).unwrap();
        assert!(event.warning);
        assert_eq!(event.reason, reason::EXPORT_CONFLICT);
        assert!(!event.metadata.contains_key(META_DIGEST));
        assert!(alert_target(&a, &after).is_none());
        // Once exported before, the refusal is told about the export.
        let mut exported = artifact();
        exported.status = Some(status(
            condition("True", reason::EXPORTED, "ok"),
            Some(external("artifact-a")),
        ));
        let target = alert_target(&exported, &after).unwrap();
        assert_eq!(target.name.as_deref(), Some("artifact-a"));
    }
}
