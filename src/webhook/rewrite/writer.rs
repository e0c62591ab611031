//! Recording who wrote an Artifact: on every create or update of an
//! Artifact (openflux.dev, and Open Flux's groups), the webhook sets
//! [`WRITER_ANNOTATION`] to the identity the API server authenticated,
//! whatever the object says. The export controller trusts an Artifact for
//! its source only when that identity may update the source's status
//! ([`crate::export::trust`]). Pure.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use serde_json::{Map, Value};

use crate::adopt::plan::OPEN_FLUX_GROUPS;
use crate::api::GROUP;
use crate::export::trust::{Writer, WRITER_ANNOTATION};
use crate::webhook::decision::Decision;
use crate::webhook::review::{AdmissionRequest, Operation};

/// Whether the API group and resource are an Artifact API openflux reads.
pub fn is_artifact_resource(group: &str, resource: &str) -> bool {
    resource == "artifacts" && (group == GROUP || OPEN_FLUX_GROUPS.contains(&group))
}

/// The decision for a request about an Artifact, `None` for anything else.
pub fn stamp(request: &AdmissionRequest) -> Option<Decision> {
    if !is_artifact_resource(&request.resource.group, &request.resource.resource) {
        return None;
    }
    let subresource = request.sub_resource.as_deref().unwrap_or_default();
    if !matches!(request.operation, Operation::Create | Operation::Update)
        || !subresource.is_empty()
    {
        return Some(Decision::Unchanged);
    }
    let Some(writer) = request.user_info.as_ref().and_then(Writer::from_user_info) else {
        return Some(Decision::bad_request(
            "the admission request names no user (request.userInfo.username)",
        ));
    };
    let Some(object) = request.object.as_ref().filter(|o| o.is_object()) else {
        return Some(Decision::bad_request(
            "the admission request carries no object",
        ));
    };
    let value = writer.to_annotation();
    let metadata = object.get("metadata").filter(|m| m.is_object());
    let annotations = metadata
        .and_then(|m| m.get("annotations"))
        .filter(|a| a.is_object());
    if annotations
        .and_then(|a| a.get(WRITER_ANNOTATION))
        .and_then(Value::as_str)
        == Some(&value)
    {
        return Some(Decision::Unchanged);
    }
    let (path, value) = match (metadata, annotations) {
        (Some(_), Some(_)) => (
            PointerBuf::from_tokens(["metadata", "annotations", WRITER_ANNOTATION]),
            Value::String(value),
        ),
        (Some(_), None) => {
            let mut entry = Map::new();
            entry.insert(WRITER_ANNOTATION.into(), Value::String(value));
            (
                PointerBuf::from_tokens(["metadata", "annotations"]),
                Value::Object(entry),
            )
        }
        (None, _) => return Some(Decision::bad_request("the Artifact has no metadata")),
    };
    Some(Decision::Rewrite {
        patch: Patch(vec![PatchOperation::Add(AddOperation { path, value })]),
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::review::GroupVersionResource;
    use serde_json::json;

    fn request(group: &str, object: Value, user: Option<Value>) -> AdmissionRequest {
        AdmissionRequest {
            uid: "u".into(),
            resource: GroupVersionResource {
                group: group.into(),
                version: "v1alpha1".into(),
                resource: "artifacts".into(),
            },
            sub_resource: None,
            name: Some("a".into()),
            namespace: Some("apps".into()),
            operation: Operation::Create,
            object: Some(object),
            old_object: None,
            dry_run: None,
            user_info: user,
        }
    }

    fn stamped(decision: Decision, object: &Value) -> Value {
        let Decision::Rewrite { patch, .. } = decision else {
            panic!("{decision:?}")
        };
        let mut o = object.clone();
        json_patch::patch(&mut o, &patch).unwrap();
        o
    }

    #[test]
    fn the_writer_is_what_the_api_server_says_never_what_the_object_says() {
        let user = json!({"username": "system:serviceaccount:src:ctl", "groups": ["g"]});
        let forged = json!({"metadata": {"name": "a", "annotations": {WRITER_ANNOTATION: "{\"username\":\"admin\"}"}}});
        let out = stamped(
            stamp(&request(GROUP, forged.clone(), Some(user.clone()))).unwrap(),
            &forged,
        );
        let written = out["metadata"]["annotations"][WRITER_ANNOTATION]
            .as_str()
            .unwrap();
        assert_eq!(
            Writer::from_annotation(written).unwrap().username,
            "system:serviceaccount:src:ctl"
        );
        // Already right: unchanged.
        let again = stamp(&request(GROUP, out.clone(), Some(user.clone()))).unwrap();
        assert_eq!(again, Decision::Unchanged);
        // No annotations yet; an Open Flux Artifact.
        let bare = json!({"metadata": {"name": "a"}});
        let out = stamped(
            stamp(&request(
                "openfluxcd.ocm.software",
                bare.clone(),
                Some(user),
            ))
            .unwrap(),
            &bare,
        );
        assert!(out["metadata"]["annotations"][WRITER_ANNOTATION].is_string());
    }

    #[test]
    fn other_requests_are_not_artifacts_and_bad_ones_are_refused() {
        assert!(stamp(&request("kustomize.toolkit.fluxcd.io", json!({}), None)).is_none());
        let no_user = stamp(&request(GROUP, json!({"metadata": {}}), None)).unwrap();
        assert!(matches!(no_user, Decision::Error { code: 400, .. }));
        let no_object =
            stamp(&request(GROUP, json!(null), Some(json!({"username": "u"})))).unwrap();
        assert!(matches!(no_object, Decision::Error { code: 400, .. }));
    }
}
