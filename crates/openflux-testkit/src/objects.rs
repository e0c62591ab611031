//! Objects of any kind: server-side apply through discovery, reads,
//! conditions, reconcile requests and the CRDs the tests install.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context as _};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{pinned_kind, Scope};
use kube::Client;

use crate::*;

/// Splits `group/version` (or `version` for the core group) and builds a GVK.
pub fn gvk(api_version: &str, kind: &str) -> GroupVersionKind {
    match api_version.split_once('/') {
        Some((group, version)) => GroupVersionKind::gvk(group, version, kind),
        None => GroupVersionKind::gvk("", api_version, kind),
    }
}

/// The API for a kind, found by discovery (`namespace` is ignored for
/// cluster-scoped kinds and means "all namespaces" when `None`).
pub async fn dynamic_api(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
) -> anyhow::Result<(Api<DynamicObject>, ApiResource)> {
    let (ar, caps) = pinned_kind(client, &gvk(api_version, kind))
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let api = match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    Ok((api, ar))
}

/// Server-side applies one object given as JSON (field manager
/// [`FIELD_MANAGER`], conflicts forced). Namespaced kinds need
/// `metadata.namespace`.
pub async fn apply(client: &Client, obj: &serde_json::Value) -> anyhow::Result<DynamicObject> {
    let api_version = obj["apiVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("object without apiVersion: {obj}"))?;
    let kind = obj["kind"]
        .as_str()
        .ok_or_else(|| anyhow!("object without kind: {obj}"))?;
    let name = obj["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow!("object without metadata.name: {obj}"))?;
    let namespace = obj["metadata"]["namespace"].as_str();
    let (ar, caps) = pinned_kind(client, &gvk(api_version, kind))
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = namespace.ok_or_else(|| {
                anyhow!("{kind} {name} is namespaced but has no metadata.namespace")
            })?;
            Api::namespaced_with(client.clone(), ns, &ar)
        }
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| {
        format!(
            "applying {kind} {}{name}",
            namespace.map(|n| format!("{n}/")).unwrap_or_default()
        )
    })
}

/// Server-side applies every non-empty document of a YAML (or JSON) text,
/// in order.
pub async fn apply_yaml(client: &Client, text: &str) -> anyhow::Result<Vec<DynamicObject>> {
    use serde::Deserialize as _;
    let mut applied = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_json::Value::deserialize(doc).context("parsing YAML")?;
        if value.is_null() {
            continue;
        }
        applied.push(apply(client, &value).await?);
    }
    Ok(applied)
}

/// Gets an object (`None` if it does not exist).
pub async fn get(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
) -> anyhow::Result<Option<DynamicObject>> {
    let (api, _) = dynamic_api(client, api_version, kind, namespace).await?;
    api.get_opt(name)
        .await
        .with_context(|| format!("getting {kind} {name}"))
}

/// The `Ready` condition of an object's status: `(status, reason, message)`.
pub fn ready_condition(obj: &DynamicObject) -> Option<(String, String, String)> {
    condition(obj, "Ready")
}

/// A condition of an object's status: `(status, reason, message)`.
pub fn condition(obj: &DynamicObject, type_: &str) -> Option<(String, String, String)> {
    let conditions = obj.data.get("status")?.get("conditions")?.as_array()?;
    let c = conditions
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some(type_))?;
    let field = |k: &str| {
        c.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Some((field("status"), field("reason"), field("message")))
}

/// True when `Ready` is `True` and `status.observedGeneration` (if present)
/// matches `metadata.generation`.
pub fn is_ready(obj: &DynamicObject) -> bool {
    let observed = obj
        .data
        .get("status")
        .and_then(|s| s.get("observedGeneration"))
        .and_then(|g| g.as_i64());
    let current = observed.is_none() || observed == obj.metadata.generation;
    current && ready_condition(obj).is_some_and(|(status, _, _)| status == "True")
}

/// True when the Deployment's `Available` condition is `True`.
pub fn is_available(deployment: &k8s_openapi::api::apps::v1::Deployment) -> bool {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Available" && c.status == "True")
        })
}

/// A JSON pointer lookup in an object's body (`"/status/artifact/revision"`).
pub fn field<'a>(obj: &'a DynamicObject, pointer: &str) -> Option<&'a serde_json::Value> {
    obj.data.pointer(pointer)
}

/// Merge-patches the object `namespace`/`name` of a kind with `patch`, as
/// a user editing it would (not a server-side apply).
pub async fn merge_patch(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    patch: &serde_json::Value,
) -> anyhow::Result<DynamicObject> {
    let (api, _) = dynamic_api(client, api_version, kind, Some(namespace)).await?;
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("patching {kind} {namespace}/{name}"))
}

/// Asks a Flux object to reconcile now (`reconcile.fluxcd.io/requestedAt`).
pub async fn request_reconcile(
    client: &Client,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let patch = serde_json::json!({
        "metadata": { "annotations": { "reconcile.fluxcd.io/requestedAt": now.to_string() } }
    });
    merge_patch(client, api_version, kind, namespace, name, &patch)
        .await
        .with_context(|| format!("requesting reconciliation of {kind} {namespace}/{name}"))?;
    Ok(())
}

// ------------------------------------------------------------------ CRDs --

/// Installs openflux's CRDs, Artifact and SourcePolicy (as committed under
/// manifests/), and waits until SourcePolicy is served: openflux's webhook
/// judges nothing that may name an export before it has listed policies.
pub async fn install_artifact_crd(env: &Env) {
    env.apply_yaml(include_str!("../../../manifests/crds/artifacts.yaml"))
        .await
        .expect("installing the Artifact CRD");
    env.apply_yaml(include_str!("../../../manifests/crds/sourcepolicies.yaml"))
        .await
        .expect("installing the SourcePolicy CRD");
    wait_established(env, &["sourcepolicies.openflux.dev"]).await;
}

/// Installs the test-only custom source kind `TestSource` of `group`
/// (version v1, any content), standing in for a third party's source.
pub async fn install_test_source_crd(env: &Env, group: &str) {
    env.apply(&serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("testsources.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "TestSource", "plural": "testsources", "singular": "testsource"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .await
    .unwrap_or_else(|e| panic!("installing the TestSource CRD of {group}: {e}"));
}

/// Waits (bounded by [`TIMEOUT`]) until every named CRD is Established.
pub async fn wait_established(env: &Env, names: &[&str]) {
    wait_established_within(env, names, TIMEOUT).await
}

/// Waits, at most `timeout` for each, until every named CRD is Established
/// and discovery serves each of its served versions: the API server marks
/// a CRD Established a moment before its group version is discoverable,
/// and a client that resolves the kind by discovery fails in between.
pub async fn wait_established_within(env: &Env, names: &[&str], timeout: Duration) {
    for name in names {
        wait_for(&format!("CRD {name} established"), timeout, || async {
            let crd = env
                .get(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    name,
                )
                .await
                .ok()
                .flatten()?;
            let established = crd.data["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True");
            if !established {
                return None;
            }
            let group = crd.data["spec"]["group"].as_str()?;
            let kind = crd.data["spec"]["names"]["kind"].as_str()?;
            for version in crd.data["spec"]["versions"].as_array()? {
                if version["served"] != true {
                    continue;
                }
                let gvk = GroupVersionKind::gvk(group, version["name"].as_str()?, kind);
                pinned_kind(&env.client, &gvk).await.ok()?;
            }
            Some(())
        })
        .await;
    }
}

/// A ConfigMap `app-config` with `data.value`, as a manifest in a source.
pub fn configmap_yaml(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  value: {value}\n"
    )
}

/// Waits (within `timeout`) until ConfigMap `ns/name` holds `value` under
/// `data.value`: what a consumer applied from its source.
pub async fn configmap_holds(env: &Env, ns: &str, name: &str, value: &str, timeout: Duration) {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.client.clone(), ns);
    wait_for(
        &format!("ConfigMap {ns}/{name} to hold {value:?}"),
        timeout,
        || {
            let cms = cms.clone();
            async move {
                let cm = cms.get_opt(name).await.ok().flatten()?;
                (cm.data?.get("value")? == value).then_some(())
            }
        },
    )
    .await;
}
