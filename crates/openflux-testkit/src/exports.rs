//! What openflux exported an Artifact as: an ExternalArtifact or a shadow
//! OCIRepository, whichever the cluster's consumers take. Tests find it
//! through the Artifact's `status.exportedRef`, so they hold on every Flux
//! line and with every feature gate setting.

use kube::core::DynamicObject;

use crate::{field, ready_condition, wait_for, Env, TIMEOUT};

/// `openflux.dev/v1alpha1`, the Artifact API.
const ARTIFACT: &str = "openflux.dev/v1alpha1";

/// Waits until Artifact `namespace`/`name` says it is exported and its
/// export satisfies `ready`; returns the Artifact and the export.
pub async fn wait_export(
    env: &Env,
    namespace: &str,
    name: &str,
    ready: impl Fn(&DynamicObject) -> bool,
) -> (DynamicObject, DynamicObject) {
    wait_for(
        &format!("Artifact {namespace}/{name} to be exported"),
        TIMEOUT,
        || async {
            let artifact = env.find(ARTIFACT, "Artifact", namespace, name).await?;
            if ready_condition(&artifact)?.1 != "Exported" {
                return None;
            }
            let reference = field(&artifact, "/status/exportedRef")?;
            let export = env
                .find(
                    reference["apiVersion"].as_str()?,
                    reference["kind"].as_str()?,
                    namespace,
                    reference["name"].as_str()?,
                )
                .await?;
            ready(&export).then_some((artifact, export))
        },
    )
    .await
}

/// Kind, apiVersion and name of an export, as a consumer's reference names it.
pub fn reference_to(export: &DynamicObject) -> serde_json::Value {
    let types = export.types.clone().unwrap_or_default();
    serde_json::json!({
        "apiVersion": types.api_version,
        "kind": types.kind,
        "name": export.metadata.name.clone().unwrap_or_default(),
    })
}

/// Whether the export is a shadow OCIRepository.
pub fn is_shadow(export: &DynamicObject) -> bool {
    export
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key("openflux.dev/shadow"))
}

/// The revision of the custom source as the export carries it: the
/// artifact's revision, or for a shadow whose revision had to become the
/// digest, the origin revision in its metadata.
pub fn source_revision(export: &DynamicObject) -> Option<String> {
    let artifact = field(export, "/status/artifact")?;
    let origin = artifact
        .pointer("/metadata/org.opencontainers.image.revision")
        .and_then(|v| v.as_str());
    origin
        .or_else(|| artifact["revision"].as_str())
        .map(str::to_string)
}
