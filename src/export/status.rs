//! Writing what an Artifact's status says of its export, with the Event a
//! change of its `Ready` condition means.

use kube::api::Patch;
use kube::ResourceExt;

use super::{events, Exporter};
use crate::api::{Artifact, ArtifactStatus};
use crate::control::{apply_params, hash_of, Error, Requeue};

impl Exporter {
    /// An export the API server refused (or that could not be sent): said
    /// on the Artifact (`Ready=False`, `ExportFailed`, the server's
    /// message, and the Event a change of `Ready` means) and counted; the
    /// error goes on to the error policy, which retries with backoff.
    pub(super) async fn export_failed(
        &self,
        artifact: &Artifact,
        status: &ArtifactStatus,
        error: Error,
    ) -> Result<Requeue, Error> {
        self.ctx.metrics.export_failures.inc();
        tracing::warn!(%error, "export failed");
        if let Err(e) = self.set_status(artifact, status.clone()).await {
            tracing::warn!(error = %e, "cannot say on the Artifact that its export failed");
        }
        Err(error)
    }

    /// Writes an Artifact's status and, when its `Ready` condition changed,
    /// emits the Event that change means.
    pub(super) async fn set_status(
        &self,
        artifact: &Artifact,
        status: ArtifactStatus,
    ) -> Result<(), Error> {
        let event = events::ready_event(artifact, artifact.ready_condition(), &status);
        let target = events::alert_target(artifact, &status);
        let wrote = self.apply_status(artifact, status).await?;
        if let (true, Some(event)) = (wrote, event) {
            self.ctx
                .events
                .publish(artifact, &event, target.as_ref())
                .await;
        }
        Ok(())
    }

    /// Writes the status of an Artifact unless it already is `status`.
    async fn apply_status(
        &self,
        artifact: &Artifact,
        status: ArtifactStatus,
    ) -> Result<bool, Error> {
        if artifact.status.as_ref() == Some(&status) {
            return Ok(false);
        }
        let ns = artifact
            .namespace()
            .ok_or(Error::MissingField("namespace"))?;
        let name = artifact.name_any();
        let key = format!("artifact-status/{ns}/{name}");
        let rv = artifact.resource_version();
        let hash = hash_of(&status)?;
        if self.ctx.memo.already_written(&key, rv.as_deref(), hash) {
            return Ok(false);
        }
        let body = serde_json::json!({
            "apiVersion": crate::api::API_VERSION,
            "kind": crate::api::KIND,
            "status": status,
        });
        self.ctx
            .artifact_api(&ns)
            .patch_status(&name, &apply_params(), &Patch::Apply(&body))
            .await?;
        self.ctx.memo.record(key, rv, hash);
        Ok(true)
    }
}
