//! Recording who wrote an Artifact: the webhook keeps [`WRITER_ANNOTATION`]
//! (on openflux.dev Artifacts and Open Flux's) as the identity the API
//! server authenticated for the request that last changed what an export
//! of the Artifact is made of ([`EXPORT_INPUTS`]: its spec, its owner
//! references, and what marks an adopted Open Flux Artifact), whatever the
//! object says. An update that changes none of those (a label, a note)
//! keeps the recorded writer, so labelling someone's Artifact never makes
//! its content the labeller's. The export controller trusts an Artifact for
//! its source only when that identity may update the source's status
//! ([`crate::export::trust`]). Pure.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde_json::{Map, Value};

use crate::adopt::plan::OPEN_FLUX_GROUPS;
use crate::api::GROUP;
use crate::export::trust::{Writer, EXPORT_INPUTS};
use crate::rewrite::Decision;
use crate::vocabulary::marks::WRITER_ANNOTATION;
use crate::webhook::review::{AdmissionRequest, Operation};

/// Whether the API group and resource are an Artifact API openflux reads.
pub fn is_artifact_resource(group: &str, resource: &str) -> bool {
    resource == "artifacts" && (group == GROUP || OPEN_FLUX_GROUPS.contains(&group))
}

/// Whether `new` differs from `old` in anything an export is made of.
pub fn export_inputs_changed(old: &Value, new: &Value) -> bool {
    EXPORT_INPUTS
        .iter()
        .any(|path| at(old, path) != at(new, path))
}

fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .filter(|v| !v.is_null())
}

fn recorded(object: &Value) -> Option<&str> {
    at(object, &["metadata", "annotations", WRITER_ANNOTATION]).and_then(Value::as_str)
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
    // The writer the Artifact must carry: the requester, unless this is an
    // update that leaves what is exported as it was, which keeps the writer
    // recorded before (none stays none).
    let keep = match (request.operation, &request.old_object) {
        (Operation::Update, Some(old)) if !export_inputs_changed(old, object) => {
            Some(recorded(old).map(str::to_string))
        }
        _ => None,
    };
    let value = match keep {
        Some(kept) => kept,
        None => Some(writer.to_annotation()),
    };
    if recorded(object) == value.as_deref() {
        return Some(Decision::Unchanged);
    }
    let metadata = object.get("metadata").filter(|m| m.is_object());
    let annotations = metadata
        .and_then(|m| m.get("annotations"))
        .filter(|a| a.is_object());
    let operation = match (metadata, annotations, value) {
        (None, _, _) => return Some(Decision::bad_request("the Artifact has no metadata")),
        (Some(_), Some(_), Some(value)) => PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations", WRITER_ANNOTATION]),
            value: Value::String(value),
        }),
        (Some(_), None, Some(value)) => {
            let mut entry = Map::new();
            entry.insert(WRITER_ANNOTATION.into(), Value::String(value));
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "annotations"]),
                value: Value::Object(entry),
            })
        }
        // A claim on an Artifact whose writer was never recorded: removed.
        (Some(_), _, None) => PatchOperation::Remove(RemoveOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations", WRITER_ANNOTATION]),
        }),
    };
    Some(Decision::Rewrite {
        patch: Patch(vec![operation]),
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::marks::{ADOPTED_FROM_LABEL, ADOPTED_WRITER_ANNOTATION};
    use crate::webhook::review::prune::{object_keep, Pruned};
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

    /// An update as `user` from `old` to `new`, both read as the webhook
    /// reads them (pruned to what the decision reads).
    fn update(old: Value, new: Value, user: &str) -> AdmissionRequest {
        use serde::de::DeserializeSeed;
        let prune = |v: Value| Pruned(object_keep()).deserialize(v).unwrap();
        AdmissionRequest {
            operation: Operation::Update,
            old_object: Some(prune(old)),
            ..request(GROUP, prune(new), Some(json!({"username": user})))
        }
    }

    fn writer_of(object: &Value) -> Option<String> {
        let text = object["metadata"]["annotations"][WRITER_ANNOTATION].as_str()?;
        Writer::from_annotation(text).map(|w| w.username)
    }

    /// The object after the decision (unchanged, or patched).
    fn admitted(decision: Decision, object: &Value) -> Value {
        match decision {
            Decision::Unchanged => object.clone(),
            other => stamped(other, object),
        }
    }

    fn tenant_artifact() -> Value {
        let tenant = Writer {
            username: "system:serviceaccount:apps:tenant".into(),
            ..Writer::default()
        };
        json!({
            "metadata": {"name": "a", "namespace": "apps",
                         "annotations": {WRITER_ANNOTATION: tenant.to_annotation()},
                         "ownerReferences": [{"apiVersion": "sources.example.com/v1", "kind": "Web",
                                              "name": "web", "uid": "u1", "controller": true}]},
            "spec": {"url": "http://tenant/a.tar.gz", "revision": "v1", "digest": "sha256:00"},
        })
    }

    #[test]
    fn an_update_that_leaves_what_is_exported_keeps_the_recorded_writer() {
        let old = tenant_artifact();
        // An administrator labels the Artifact (and the object they send
        // claims them as writer, or names nobody): the tenant stays its
        // writer, since the tenant's spec is what would be exported.
        let mut labelled = old.clone();
        labelled["metadata"]["labels"] = json!({"team": "a"});
        labelled["metadata"]["annotations"]["note"] = json!("checked");
        let admin = "kubernetes-admin";
        let out = admitted(
            stamp(&update(old.clone(), labelled.clone(), admin)).unwrap(),
            &labelled,
        );
        assert_eq!(
            writer_of(&out).as_deref(),
            Some("system:serviceaccount:apps:tenant")
        );
        let mut claimed = labelled.clone();
        claimed["metadata"]["annotations"][WRITER_ANNOTATION] = json!(Writer {
            username: admin.into(),
            ..Writer::default()
        }
        .to_annotation());
        let out = admitted(
            stamp(&update(old.clone(), claimed.clone(), admin)).unwrap(),
            &claimed,
        );
        assert_eq!(
            writer_of(&out).as_deref(),
            Some("system:serviceaccount:apps:tenant")
        );
        let mut unnamed = labelled.clone();
        unnamed["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(WRITER_ANNOTATION);
        let out = admitted(
            stamp(&update(old.clone(), unnamed.clone(), admin)).unwrap(),
            &unnamed,
        );
        assert_eq!(
            writer_of(&out).as_deref(),
            Some("system:serviceaccount:apps:tenant")
        );
        // An Artifact written while no writer was recorded stays so: a
        // label does not make its content anyone's.
        let mut unstamped = old.clone();
        unstamped["metadata"]["annotations"] = json!({});
        let mut labelled = unstamped.clone();
        labelled["metadata"]["labels"] = json!({"team": "a"});
        let out = admitted(
            stamp(&update(unstamped, labelled.clone(), admin)).unwrap(),
            &labelled,
        );
        assert_eq!(writer_of(&out), None);
    }

    #[test]
    fn changing_what_is_exported_records_who_changed_it() {
        let old = tenant_artifact();
        let admin = "kubernetes-admin";
        type Change = (&'static str, fn(&mut Value));
        let changes: [Change; 5] = [
            ("spec", |o| {
                o["spec"]["url"] = json!("http://admin/a.tar.gz")
            }),
            ("spec.metadata", |o| {
                o["spec"]["metadata"] = json!({"k": "v"})
            }),
            ("owner", |o| {
                o["metadata"]["ownerReferences"][0]["name"] = json!("other")
            }),
            ("adopted writer", |o| {
                o["metadata"]["annotations"][ADOPTED_WRITER_ANNOTATION] = json!("{}")
            }),
            ("adopted label", |o| {
                o["metadata"]["labels"] = json!({ADOPTED_FROM_LABEL: "openfluxcd.ocm.software"})
            }),
        ];
        for (what, change) in changes {
            let mut new = old.clone();
            change(&mut new);
            let out = admitted(
                stamp(&update(old.clone(), new.clone(), admin)).unwrap(),
                &new,
            );
            assert_eq!(writer_of(&out).as_deref(), Some(admin), "{what}");
        }
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
