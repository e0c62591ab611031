//! Reconcile requests set on an export (`kubectl annotate`, or Flux's
//! tools where they point a person) handed on to the custom source that
//! produced the Artifact.

use kube::api::Patch;
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::plan::REQUESTED_AT;
use crate::api::Artifact;
use crate::control::{hash_of, Context};

/// Hands a reconcile request set on an export (`kubectl annotate` or
/// Flux's tools, where they point a person) to the custom source that
/// produced the Artifact, once per value. A failure is logged: the
/// request is a hint, the export stays correct without it.
pub(super) async fn forward(ctx: &Context, artifact: &Artifact, requested: &str) {
    let Some(owner) = artifact.controller_owner() else {
        return;
    };
    let namespace = artifact.namespace().unwrap_or_default();
    let key = format!("request/{namespace}/{}/{}", owner.kind, owner.name);
    let hash = hash_of(&requested).unwrap_or_default();
    if ctx.memo.already_written(&key, Some(requested), hash) {
        return;
    }
    let (group, version) = crate::api::split_api_version(&owner.api_version);
    let gvk = kube::core::GroupVersionKind::gvk(group, version, &owner.kind);
    let patch = json!({ "metadata": { "annotations": { REQUESTED_AT: requested } } });
    let result = async {
        let (resource, _) = kube::discovery::pinned_kind(&ctx.client, &gvk).await?;
        let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &namespace, &resource);
        api.patch(
            &owner.name,
            &kube::api::PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    }
    .await;
    match result {
        Ok(_) => {
            tracing::info!(kind = %owner.kind, name = %owner.name, %namespace, %requested, "handed a reconcile request on an export to its custom source");
            ctx.memo.record(key, Some(requested.to_string()), hash);
        }
        Err(error) => {
            tracing::warn!(kind = %owner.kind, name = %owner.name, %namespace, %error, "cannot hand a reconcile request to the custom source; does openflux's role allow patching it?")
        }
    }
}
