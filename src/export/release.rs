//! Small jobs of the leader around exported objects: the resource of each
//! export target, and releasing a deleted shadow from source-controller's
//! finalizer ([`releasing`] finds the shadow in the targets' watches).

use kube::api::{Api, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::ObjectRef;

use crate::api::runtime::RetryArgs;

use super::ServedTargets;
use crate::api::FLUX_SOURCE_GROUP;
use crate::cluster::target::Target;

/// The finalizer source-controller puts on the sources it reconciles.
pub const SOURCE_FINALIZER: &str = "finalizers.fluxcd.io";

/// The JSON patch that takes source-controller's finalizer off an object
/// whose finalizers are `finalizers`, and only it: a `test` of the entry
/// first, so a list changed since it was read fails the patch instead of
/// losing someone else's finalizer. `None` when it carries none.
pub fn release_patch(finalizers: &[String]) -> Option<json_patch::Patch> {
    let at = finalizers.iter().position(|f| f == SOURCE_FINALIZER)?;
    let patch = serde_json::json!([
        {"op": "test", "path": format!("/metadata/finalizers/{at}"), "value": SOURCE_FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{at}")},
    ]);
    serde_json::from_value(patch).ok()
}

/// Takes source-controller's finalizer off the shadow `name` being deleted,
/// whose finalizers were `finalizers` when the watch saw it:
/// source-controller stores nothing for a shadow, and may not be running,
/// so garbage collection completes either way. Retried with `retry`'s
/// backoff until it is done or no longer needed; a list that changed in
/// between (the `test` fails) comes back through the watch.
pub async fn release(
    api: Api<DynamicObject>,
    name: String,
    finalizers: Vec<String>,
    retry: RetryArgs,
) {
    let Some(patch) = release_patch(&finalizers) else {
        return;
    };
    let namespace = api.namespace().unwrap_or_default().to_string();
    let mut failures = 0;
    loop {
        match api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::<()>::Json(patch.clone()),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(%namespace, %name, "released a deleted shadow from source-controller's finalizer");
                return;
            }
            // Gone, or its finalizers changed since: nothing to do here.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 || e.code == 422 => return,
            Err(error) => {
                failures += 1;
                let delay = retry.delay(failures);
                tracing::warn!(%namespace, %name, %error, retry_in = ?delay, "cannot release a deleted shadow from its finalizer; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The release of shadow `namespace/name` of `kind` being deleted, when the
/// watch of its target in `targets` holds it: a task to run.
pub fn releasing(
    client: &kube::Client,
    targets: &ServedTargets,
    kind: &str,
    namespace: &str,
    name: &str,
    retry: RetryArgs,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let served = targets.values().find(|t| t.resource.kind == kind)?;
    let key = ObjectRef::new_with(name, served.resource.clone()).within(namespace);
    let shadow = served.exports.get(&key)?;
    let finalizers = shadow.metadata.finalizers.clone().unwrap_or_default();
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &served.resource);
    Some(release(api, name.to_string(), finalizers, retry))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_source_controllers_finalizer_is_taken_off() {
        let finalizers: Vec<String> = ["example.com/keep", SOURCE_FINALIZER, "other.io/keep"]
            .map(String::from)
            .to_vec();
        let patch = release_patch(&finalizers).expect("it carries the finalizer");
        let mut object = json!({"metadata": {"finalizers": finalizers}});
        json_patch::patch(&mut object, &patch).unwrap();
        assert_eq!(
            object["metadata"]["finalizers"],
            json!(["example.com/keep", "other.io/keep"])
        );
        assert!(release_patch(&["example.com/keep".to_string()]).is_none());
    }

    #[test]
    fn a_list_changed_since_it_was_read_fails_the_patch() {
        let read = vec!["example.com/a".to_string(), SOURCE_FINALIZER.to_string()];
        let patch = release_patch(&read).unwrap();
        // Someone removed the first finalizer in between: the index moved.
        let mut now = json!({"metadata": {"finalizers": [SOURCE_FINALIZER]}});
        assert!(json_patch::patch(&mut now, &patch).is_err());
        assert_eq!(now["metadata"]["finalizers"], json!([SOURCE_FINALIZER]));
    }
}
