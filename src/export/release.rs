//! Small jobs of the leader around exported objects: the resource of each
//! export target, and releasing a deleted shadow from source-controller's
//! finalizer.

use kube::api::{Api, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};

use crate::api::FLUX_SOURCE_GROUP;
use crate::cluster::target::Target;

/// Takes source-controller's finalizer off the shadow `name` being deleted:
/// source-controller stores nothing for a shadow, and may not be running,
/// so garbage collection completes either way.
pub async fn release(api: Api<DynamicObject>, name: String) {
    let patch = serde_json::json!({ "metadata": { "finalizers": null } });
    let namespace = api.namespace().unwrap_or_default().to_string();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => tracing::info!(%namespace, %name, "released a deleted shadow from its finalizer"),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(error) => {
            tracing::warn!(%namespace, %name, %error, "cannot release a deleted shadow from its finalizer")
        }
    }
}

/// The resource of an export target.
pub fn target_resource(target: Target) -> ApiResource {
    let version = target
        .api_version()
        .rsplit_once('/')
        .map_or("v1", |(_, v)| v);
    let gvk = GroupVersionKind::gvk(FLUX_SOURCE_GROUP, version, target.kind());
    ApiResource::from_gvk_with_plural(&gvk, target.plural())
}
