//! End to end: the shipped roles for namespace admins, editors and viewers
//! (`manifests/roles.yaml`, `manifests/http-source/roles.yaml`) on the
//! local control plane, whose controller manager aggregates ClusterRoles.
//!
//! A ServiceAccount bound in its namespace to Kubernetes' `admin` or `edit`
//! role creates, changes and deletes HttpSources and Artifacts there; one
//! bound to `view` reads them and is refused every write; none of them may
//! write an HttpSource's status (whoever may, speaks for the source), nor a
//! SourcePolicy.

use openflux_testkit as support;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Api;
use serde_json::json;
use support::identity::{acting_as, wait_allowed};
use support::{cluster, wait_for, Env, TIMEOUT};

const EDIT_ROLES: &str = include_str!("../../manifests/roles.yaml");
const HTTP_SOURCE_ROLES: &str = include_str!("../../manifests/http-source/roles.yaml");
const HTTP_SOURCE_CRD: &str = include_str!("../../manifests/http-source/crd.yaml");

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn http_sources() -> ApiResource {
    resource(
        "sources.openflux.dev",
        "v1alpha1",
        "HttpSource",
        "httpsources",
    )
}

fn artifacts() -> ApiResource {
    resource("openflux.dev", "v1alpha1", "Artifact", "artifacts")
}

/// A ServiceAccount `name` in `ns` bound there to the ClusterRole `role`,
/// once the API server's authorizer lets it use what the role grants.
async fn bound(env: &Env, ns: &str, name: &str, role: &str) -> kube::Client {
    env.apply(&json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": ns},
    }))
    .await
    .expect("creating the ServiceAccount");
    env.apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    }))
    .await
    .expect("binding the ServiceAccount");
    // The binding reaches the authorizer a moment after it is stored: until
    // it does, the ServiceAccount is refused what the role grants.
    let verb = if role == "view" { "list" } else { "patch" };
    for (group, resource) in [
        ("sources.openflux.dev", "httpsources"),
        ("openflux.dev", "artifacts"),
    ] {
        wait_allowed(env, ns, name, verb, group, resource).await;
    }
    acting_as(env, ns, name)
}

/// Waits until the aggregation controller has folded the shipped rules
/// into Kubernetes' `role`.
async fn aggregated(env: &Env, role: &str, group: &str, resource: &str) {
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(env.client.clone());
    wait_for(
        &format!("{resource}.{group} in ClusterRole {role}"),
        TIMEOUT,
        || {
            let roles = roles.clone();
            async move {
                let role = roles.get(role).await.ok()?;
                role.rules?
                    .iter()
                    .any(|r| {
                        r.api_groups.iter().flatten().any(|g| g == group)
                            && r.resources.iter().flatten().any(|x| x == resource)
                    })
                    .then_some(())
            }
        },
    )
    .await;
}

fn http_source(ns: &str, name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "sources.openflux.dev/v1alpha1", "kind": "HttpSource",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"url": "https://example.invalid/app.yaml", "interval": "10m"},
    })
}

fn artifact(ns: &str, name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "url": "http://example.invalid/a.tar.gz",
            "revision": "v1",
            "digest": format!("sha256:{}", "0".repeat(64)),
            "path": "a.tar.gz",
            "lastUpdateTime": "2026-01-01T00:00:00Z",
        },
    })
}

fn is_forbidden(result: Result<impl std::fmt::Debug, anyhow::Error>) -> bool {
    match result {
        Err(e) => e
            .downcast_ref::<kube::Error>()
            .is_some_and(|k| matches!(k, kube::Error::Api(s) if s.code == 403)),
        Ok(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_admins_and_editors_use_custom_sources_and_viewers_only_read() {
    let env = cluster().await;
    support::install_artifact_crd(&env).await;
    env.apply_yaml(HTTP_SOURCE_CRD)
        .await
        .expect("installing the HttpSource CRD");
    support::wait_established(
        &env,
        &["artifacts.openflux.dev", "httpsources.sources.openflux.dev"],
    )
    .await;
    env.apply_yaml(EDIT_ROLES)
        .await
        .expect("installing manifests/roles.yaml");
    env.apply_yaml(HTTP_SOURCE_ROLES)
        .await
        .expect("installing manifests/http-source/roles.yaml");
    for role in ["admin", "edit", "view"] {
        aggregated(&env, role, "openflux.dev", "artifacts").await;
        aggregated(&env, role, "sources.openflux.dev", "httpsources").await;
    }

    let ns = env.namespace("roles").await;
    let ns = ns.name();
    for (who, role) in [("tenant-admin", "admin"), ("tenant-editor", "edit")] {
        let client = bound(&env, ns, who, role).await;
        let source = support::apply(&client, &http_source(ns, who))
            .await
            .unwrap_or_else(|e| panic!("{role}: creating an HttpSource: {e:#}"));
        support::apply(&client, &artifact(ns, who))
            .await
            .unwrap_or_else(|e| panic!("{role}: creating an Artifact: {e:#}"));
        let sources: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &http_sources());
        let status = json!({"status": {"observedGeneration": 1}});
        let refused = sources
            .patch_status(
                &source.metadata.name.clone().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
            "{role} may not write an HttpSource's status: {refused:?}"
        );
        let artifacts: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &artifacts());
        artifacts
            .delete(who, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("{role}: deleting an Artifact: {e}"));
    }

    let viewer = bound(&env, ns, "tenant-viewer", "view").await;
    let sources: Api<DynamicObject> = Api::namespaced_with(viewer.clone(), ns, &http_sources());
    let listed = sources
        .list(&Default::default())
        .await
        .expect("a viewer lists HttpSources");
    assert_eq!(listed.items.len(), 2, "the admin's and the editor's");
    sources
        .get("tenant-admin")
        .await
        .expect("a viewer reads an HttpSource");
    let artifacts: Api<DynamicObject> = Api::namespaced_with(viewer.clone(), ns, &artifacts());
    artifacts
        .list(&Default::default())
        .await
        .expect("a viewer lists Artifacts");
    assert!(
        is_forbidden(support::apply(&viewer, &http_source(ns, "viewer")).await),
        "a viewer may not create an HttpSource"
    );
    assert!(
        is_forbidden(support::apply(&viewer, &artifact(ns, "viewer")).await),
        "a viewer may not create an Artifact"
    );
    let deleted = sources
        .delete("tenant-admin", &DeleteParams::default())
        .await;
    assert!(
        matches!(&deleted, Err(kube::Error::Api(s)) if s.code == 403),
        "a viewer may not delete an HttpSource: {deleted:?}"
    );

    // In another namespace, the same ServiceAccounts may do nothing.
    let other = env.namespace("roles-other").await;
    let admin = acting_as(&env, ns, "tenant-admin");
    assert!(
        is_forbidden(support::apply(&admin, &http_source(other.name(), "x")).await),
        "a namespace admin's rights end at its namespace"
    );

    // SourcePolicies are cluster-scoped and restrict whole namespaces: the
    // aggregated roles only read them, and a RoleBinding grants nothing
    // cluster-scoped, so a namespace admin cannot lift its own restriction.
    aggregated(&env, "view", "openflux.dev", "sourcepolicies").await;
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(env.client.clone());
    for role in ["admin", "edit", "view"] {
        let rules = roles.get(role).await.expect("the aggregated role").rules;
        let writes: Vec<_> = rules
            .iter()
            .flatten()
            .filter(|r| r.resources.iter().flatten().any(|x| x == "sourcepolicies"))
            .flat_map(|r| r.verbs.clone())
            .filter(|v| !["get", "list", "watch"].contains(&v.as_str()))
            .collect();
        assert!(
            writes.is_empty(),
            "{role} may write SourcePolicies: {writes:?}"
        );
    }
    let policy = json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "SourcePolicy",
        "metadata": {"name": support::unique_name("roles")},
        "spec": {"allowedKinds": [{"group": "sources.openflux.dev", "kind": "*"}]}
    });
    assert!(
        is_forbidden(support::apply(&admin, &policy).await),
        "a namespace admin may not write a SourcePolicy"
    );
}
