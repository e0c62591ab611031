//! Recording who wrote an Artifact: the webhook keeps [`WRITER_ANNOTATION`]
//! (on openflux.dev Artifacts and Open Flux's) as the identity the API
//! server authenticated for the request that last changed what an export
//! of the Artifact is made of ([`EXPORT_INPUTS`]: its spec, its owner
//! references, and what marks an adopted Open Flux Artifact), whatever the
//! object says. An update that changes none of those (a label, a note)
//! keeps the recorded writer, so labelling someone's Artifact never makes
//! its content the labeller's. The export controller trusts an Artifact for
//! its source only when that identity may update the source's status
//! ([`crate::export::trust`]).
//!
//! An Artifact openflux's controllers could not decode is refused
//! ([`judge`]): nested deeper than they read ([`MAX_DEPTH`]; the API server
//! has no such limit where a schema leaves a field open, as
//! `spec.exportedInputs`), or a spec that does not read as openflux's
//! Artifact type. Admitted, it would be skipped by every watch, and the
//! export would stay at the version before without saying why. Pure.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::admission::{AdmissionRequest, Operation};
use crate::adopt::plan::OPEN_FLUX_GROUPS;
use crate::api::{ArtifactSpec, GROUP};
use crate::export::trust::{Writer, EXPORT_INPUTS};
use crate::rewrite::Decision;
use crate::vocabulary::marks::WRITER_ANNOTATION;
use crate::watch::depth::{DECODER_DEPTH, MANAGED_FIELDS_DEPTH, MAX_DEPTH};

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

/// Where the first object or list of `value` (at `level` of its object)
/// deeper than [`MAX_DEPTH`] is, as the keys on the way to it; `None` when
/// there is none.
fn too_deep(value: &Value, level: usize) -> Option<Vec<String>> {
    if !(value.is_object() || value.is_array()) {
        return None;
    }
    if level > MAX_DEPTH {
        return Some(Vec::new());
    }
    let (key, mut path) = match value {
        Value::Object(fields) => fields
            .iter()
            .find_map(|(k, v)| too_deep(v, level + 1).map(|path| (k.clone(), path))),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| too_deep(v, level + 1).map(|path| (format!("[{i}]"), path))),
        _ => None,
    }?;
    path.insert(0, key);
    Some(path)
}

/// Why openflux's controllers could not decode the Artifact `object` (as
/// the webhook reads it: what an export is made of, [`EXPORT_INPUTS`]) of
/// API group `group`, for the person who wrote it; `None` when they could.
pub fn undecodable(group: &str, object: &Value) -> Option<String> {
    if let Some(path) = too_deep(object, 1) {
        // The field a person wrote (`spec.exportedInputs`), and how deep
        // it may nest counted from itself.
        let field = &path[..path.len().min(2)];
        let within = MAX_DEPTH - field.len();
        let name = match field.join(".") {
            name if name.is_empty() => "the Artifact".to_string(),
            name => name,
        };
        return Some(format!(
            "{name} is nested deeper than {within} levels; the controllers cannot decode it \
             (openflux reads objects up to {DECODER_DEPTH} levels deep, and the API server keeps a copy \
             of an object's fields {MANAGED_FIELDS_DEPTH} levels deeper in metadata.managedFields): \
             flatten it, for example by writing its deepest parts as JSON strings"
        ));
    }
    // Every field of the spec is kept, so the spec reads as the
    // controllers read it. Open Flux's Artifacts have their own type.
    let spec = object.get("spec").filter(|s| !s.is_null())?;
    if group != GROUP {
        return None;
    }
    ArtifactSpec::deserialize(spec).err().map(|error| {
        format!(
            "spec does not read as openflux's Artifact spec ({error}); the controllers cannot decode it: \
             correct that field"
        )
    })
}

/// The refusal of an Artifact write whose object the controllers could not
/// decode; `None` when they could, or when nothing the export reads
/// changed on an update (an Artifact written before the webhook saw it is
/// not held back from a label or from its garbage collection).
fn refusal(request: &AdmissionRequest, object: &Value) -> Option<Decision> {
    let deleting = at(object, &["metadata", "deletionTimestamp"]).is_some();
    let unchanged = match (request.operation, &request.old_object) {
        (Operation::Update, Some(old)) => !export_inputs_changed(old, object),
        _ => false,
    };
    if deleting || unchanged {
        return None;
    }
    let why = undecodable(&request.resource.group, object)?;
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let name = text(at(object, &["metadata", "name"]))
        .or_else(|| request.name.clone())
        .unwrap_or_default();
    let namespace = text(at(object, &["metadata", "namespace"]))
        .or_else(|| request.namespace.clone())
        .unwrap_or_default();
    Some(Decision::Deny {
        message: format!("openflux: Artifact {namespace}/{name}: {why}"),
    })
}

/// `None` when the request is not about an Artifact; else whether it
/// writes one: a create or an update of the object itself, not of a
/// subresource.
fn writes_artifact(request: &AdmissionRequest) -> Option<bool> {
    if !is_artifact_resource(&request.resource.group, &request.resource.resource) {
        return None;
    }
    let subresource = request.sub_resource.as_deref().unwrap_or_default();
    Some(
        matches!(request.operation, Operation::Create | Operation::Update)
            && subresource.is_empty(),
    )
}

/// The validating webhook's decision for a request about an Artifact
/// (refused when the controllers could not decode it, else admitted),
/// `None` for anything else.
pub fn judge(request: &AdmissionRequest) -> Option<Decision> {
    if !writes_artifact(request)? {
        return Some(Decision::Unchanged);
    }
    let Some(object) = request.object.as_ref().filter(|o| o.is_object()) else {
        return Some(Decision::bad_request(
            "the admission request carries no object",
        ));
    };
    Some(refusal(request, object).unwrap_or(Decision::Unchanged))
}

/// The mutating webhook's decision for a request about an Artifact (the
/// writer stamp, or the refusal of [`judge`]), `None` for anything else.
pub fn stamp(request: &AdmissionRequest) -> Option<Decision> {
    if !writes_artifact(request)? {
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
    if let Some(refused) = refusal(request, object) {
        return Some(refused);
    }
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
    use crate::rewrite::admission::prune::{object_keep, Pruned};
    use crate::rewrite::admission::GroupVersionResource;
    use crate::vocabulary::marks::{ADOPTED_FROM_LABEL, ADOPTED_WRITER_ANNOTATION};
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
            "spec": {"url": "http://tenant/a.tar.gz", "revision": "v1", "digest": "sha256:00",
                     "exportedInputs": {"env": {"tier": ["silver"]}}},
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
        let changes: [Change; 7] = [
            ("spec", |o| {
                o["spec"]["url"] = json!("http://admin/a.tar.gz")
            }),
            ("spec.metadata", |o| {
                o["spec"]["metadata"] = json!({"k": "v"})
            }),
            ("spec.exportedInputs", |o| {
                o["spec"]["exportedInputs"] = json!({"env": "prod"})
            }),
            ("spec.exportedInputs, deep inside", |o| {
                o["spec"]["exportedInputs"] = json!({"env": {"tier": ["gold"]}})
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

    /// `levels` objects, each the only value of the one before.
    fn nested(levels: usize) -> Value {
        (0..levels).fold(json!(1), |inner, _| json!({ "l": inner }))
    }

    fn refused(decision: Option<Decision>) -> String {
        match decision {
            Some(Decision::Deny { message }) => message,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn an_artifact_nested_deeper_than_the_controllers_read_is_refused() {
        let user = Some(json!({"username": "producer"}));
        let fits = MAX_DEPTH - 2;
        for (group, levels, fit) in [
            (GROUP, fits, true),
            (GROUP, fits + 1, false),
            ("openfluxcd.ocm.software", fits + 1, false),
        ] {
            let mut object = tenant_artifact();
            object["spec"]["exportedInputs"] = nested(levels);
            let prune = |v: Value| {
                use serde::de::DeserializeSeed;
                Pruned(object_keep()).deserialize(v).unwrap()
            };
            let create = request(group, prune(object.clone()), user.clone());
            let answer = stamp(&create);
            assert_eq!(judge(&create) == Some(Decision::Unchanged), fit, "{levels}");
            if fit {
                assert!(
                    matches!(answer, Some(Decision::Rewrite { .. })),
                    "{answer:?}"
                );
                continue;
            }
            let message = refused(answer);
            assert_eq!(
                message,
                format!(
                    "openflux: Artifact apps/a: spec.exportedInputs is nested deeper than {fits} levels; \
                     the controllers cannot decode it (openflux reads objects up to 127 levels deep, and \
                     the API server keeps a copy of an object's fields 5 levels deeper in \
                     metadata.managedFields): flatten it, for example by writing its deepest parts as JSON strings"
                )
            );
            assert_eq!(refused(judge(&create)), message);
            // An update that makes it so is refused too; one that leaves
            // it so (a label, the garbage collector's owner change) is
            // not held back, and keeps its recorded writer.
            let mut update = update(tenant_artifact(), object.clone(), "producer");
            update.resource.group = group.into();
            assert_eq!(refused(stamp(&update)), message);
            let mut labelled = object.clone();
            labelled["metadata"]["labels"] = json!({"team": "a"});
            let mut update = self::update(object.clone(), labelled.clone(), "admin");
            update.resource.group = group.into();
            let out = admitted(stamp(&update).unwrap(), &labelled);
            assert_eq!(
                writer_of(&out).as_deref(),
                Some("system:serviceaccount:apps:tenant")
            );
            assert_eq!(judge(&update), Some(Decision::Unchanged));
            // Being deleted: never held back.
            let mut deleting = object.clone();
            deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            let create = request(group, prune(deleting), user.clone());
            assert_eq!(judge(&create), Some(Decision::Unchanged));
        }
    }

    #[test]
    fn a_spec_that_does_not_read_as_an_artifacts_is_refused() {
        let user = Some(json!({"username": "producer"}));
        let mut object = tenant_artifact();
        object["spec"]["size"] = json!("ten");
        let message = refused(stamp(&request(GROUP, object.clone(), user.clone())));
        assert!(
            message.starts_with(
                "openflux: Artifact apps/a: spec does not read as openflux's Artifact spec ("
            ) && message.contains("cannot decode"),
            "{message}"
        );
        // Open Flux's Artifacts are read as their own type.
        let theirs = request("openfluxcd.ocm.software", object, user);
        assert!(matches!(stamp(&theirs), Some(Decision::Rewrite { .. })));
        assert_eq!(judge(&theirs), Some(Decision::Unchanged));
        // Not an Artifact: not judged here.
        assert_eq!(
            judge(&request("kustomize.toolkit.fluxcd.io", json!({}), None)),
            None
        );
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
