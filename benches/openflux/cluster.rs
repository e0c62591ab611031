//! What the cluster benchmarks share: resources, CRDs, namespaces.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::Client;
use serde_json::json;

use crate::support::{Env, TestNamespace};

pub const ARTIFACT: &str = "openflux.dev/v1alpha1";
pub const SOURCE: &str = "source.toolkit.fluxcd.io/v1";
pub const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
pub const TEST_SOURCE: &str = "bench.openflux.dev/v1";

/// Field manager of every write the benchmarks make.
pub const MANAGER: &str = "openflux-bench";

/// The resource of `kind` in `api_version` with its plural `plural`.
pub fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn api(client: &Client, ns: &str, ar: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, ar)
}

pub fn git_repositories() -> ApiResource {
    resource(SOURCE, "GitRepository", "gitrepositories")
}
pub fn oci_repositories() -> ApiResource {
    resource(SOURCE, "OCIRepository", "ocirepositories")
}
pub fn artifacts() -> ApiResource {
    resource(ARTIFACT, "Artifact", "artifacts")
}
pub fn kustomizations() -> ApiResource {
    resource(KUSTOMIZE, "Kustomization", "kustomizations")
}

/// Installs the Artifact CRD and the CRD of the bench's custom source kind
/// (`TestSource`, which no controller serves: the bench is its producer),
/// and waits until both are established.
pub async fn install_crds(env: &Env) -> anyhow::Result<()> {
    let crds = include_str!("../../manifests/crds/artifacts.yaml");
    env.apply_yaml(crds)
        .await
        .context("installing the Artifact CRD")?;
    env.apply(&json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "testsources.bench.openflux.dev"},
        "spec": {
            "group": "bench.openflux.dev",
            "names": {"kind": "TestSource", "plural": "testsources", "singular": "testsource"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .await
    .context("installing the TestSource CRD")?;
    crate::support::wait_established_within(
        env,
        &["artifacts.openflux.dev", "testsources.bench.openflux.dev"],
        Duration::from_secs(60),
    )
    .await;
    Ok(())
}

/// Deletes a bench namespace and, given a bound, waits until it is gone so
/// the next measurement does not run beside its clean-up. Returns how long
/// that took, or `None` when not waited for or not finished in time (then it
/// finishes alone).
pub async fn delete_namespace(
    env: &Env,
    ns: TestNamespace,
    timeout: Option<Duration>,
) -> Option<Duration> {
    let name = ns.name().to_string();
    let started = Instant::now();
    ns.delete().await;
    let timeout = timeout?;
    let api: Api<Namespace> = Api::all(env.client.clone());
    loop {
        if let Ok(None) = api.get_opt(&name).await {
            return Some(started.elapsed());
        }
        if started.elapsed() >= timeout {
            eprintln!(
                "warning: namespace {name} still terminating after {timeout:?}; not waiting longer"
            );
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
