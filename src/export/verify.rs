//! The trust check before an Artifact of a custom source is exported: its
//! writer (recorded by the webhook, see [`crate::export::trust`]) must be allowed to
//! update the status of the source the Artifact's controller ownerReference
//! names, which the API server answers in a SubjectAccessReview. Answers are
//! kept for [`ANSWER_TTL`], so a steady stream of revisions costs no review.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::api::PostParams;
use kube::core::GroupVersionKind;
use kube::{Api, Client, ResourceExt};

use crate::api::{split_api_version, Artifact};
use crate::export::trust::{access_review, unseen, verdict, Claim, Verdict, Writer};
use crate::locks;
use crate::vocabulary::marks::{ADOPTED_FROM_LABEL, ADOPTED_WRITER_ANNOTATION, WRITER_ANNOTATION};

/// How long an answer of the API server is reused.
pub const ANSWER_TTL: Duration = Duration::from_secs(60);

/// The trust check, built once per run.
pub struct Verifier {
    client: Client,
    enabled: bool,
    /// openflux's own user name, from a SelfSubjectReview.
    me: Option<String>,
    answers: Mutex<HashMap<String, (Instant, Verdict)>>,
    plurals: Mutex<HashMap<String, String>>,
}

impl Verifier {
    /// `enabled: false` trusts every Artifact (`--verify-artifact-writers=false`).
    pub async fn new(client: Client, enabled: bool) -> Self {
        let me = match enabled {
            true => whoami(&client).await,
            false => None,
        };
        Self {
            client,
            enabled,
            me,
            answers: Mutex::default(),
            plurals: Mutex::default(),
        }
    }

    /// Whether `artifact` may speak for the source its controller owner
    /// names. Artifacts without such an owner need no check.
    pub async fn check(&self, artifact: &Artifact) -> Result<Verdict, kube::Error> {
        let Some(owner) = artifact.controller_owner() else {
            return Ok(Verdict::Trusted);
        };
        if !self.enabled {
            return Ok(Verdict::Trusted);
        }
        let namespace = artifact.namespace().unwrap_or_default();
        if let Some(verdict) = unseen(&namespace) {
            return Ok(verdict);
        }
        let annotations = artifact.annotations();
        let mut written = annotations
            .get(WRITER_ANNOTATION)
            .and_then(|w| Writer::from_annotation(w));
        let adopted = artifact.labels().contains_key(ADOPTED_FROM_LABEL);
        if adopted && written.as_ref().map(|w| &w.username) == self.me.as_ref() {
            written = annotations
                .get(ADOPTED_WRITER_ANNOTATION)
                .and_then(|w| Writer::from_annotation(w));
        }
        let Some(writer) = written else {
            return Ok(Verdict::Untrusted(format!(
                "no writer is recorded on this Artifact (annotation {WRITER_ANNOTATION}): it was written \
                 while openflux's admission webhook for Artifacts was not installed; install it \
                 (webhook-config/) and write the Artifact again"
            )));
        };
        let (group, version) = split_api_version(&owner.api_version);
        let key = format!(
            "{}|{group}|{}|{namespace}|{}",
            writer.to_annotation(),
            owner.kind,
            owner.name
        );
        if let Some((at, answer)) = locks::lock(&self.answers).get(&key) {
            if at.elapsed() < ANSWER_TTL {
                return Ok(answer.clone());
            }
        }
        let plural = self.plural(group, version, &owner.kind).await?;
        let claim = Claim {
            group,
            resource: &plural,
            namespace: &namespace,
            name: &owner.name,
        };
        let review: SubjectAccessReview = serde_json::from_value(access_review(&writer, &claim))
            .map_err(kube::Error::SerdeError)?;
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = serde_json::to_value(answered.status).unwrap_or_default();
        let answer = verdict(&writer, &claim, &status);
        let mut answers = locks::lock(&self.answers);
        answers.retain(|_, (at, _)| at.elapsed() < ANSWER_TTL);
        answers.insert(key, (Instant::now(), answer.clone()));
        Ok(answer)
    }

    async fn plural(&self, group: &str, version: &str, kind: &str) -> Result<String, kube::Error> {
        let key = format!("{group}/{version}/{kind}");
        if let Some(p) = locks::lock(&self.plurals).get(&key) {
            return Ok(p.clone());
        }
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        locks::lock(&self.plurals).insert(key, resource.plural.clone());
        Ok(resource.plural)
    }
}

/// openflux's own user name, as the API server sees it.
async fn whoami(client: &Client) -> Option<String> {
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"
    }))
    .ok()?;
    match Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
    {
        Ok(r) => r.status?.user_info?.username,
        Err(error) => {
            tracing::warn!(%error, "cannot learn openflux's own identity (SelfSubjectReview); adopted Open Flux Artifacts are checked as written by openflux");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ArtifactSpec;
    use axum::http::{Request, Response};
    use serde_json::json;

    /// A client whose API server answers what the check asks: who openflux
    /// is, where the source kind is served, and that every writer may
    /// update every status.
    fn allowing_client() -> Client {
        let service = tower::service_fn(|request: Request<kube::client::Body>| async move {
            let path = request.uri().path().to_string();
            let body = if path.ends_with("/selfsubjectreviews") {
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                       "status": {"userInfo": {"username": "system:serviceaccount:openflux-system:openflux"}}})
            } else if path.ends_with("/subjectaccessreviews") {
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                       "spec": {}, "status": {"allowed": true}})
            } else {
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "sources.example.com/v1",
                       "resources": [{"name": "webs", "singularName": "web", "namespaced": true,
                                      "kind": "Web", "verbs": ["get", "list", "watch"]}]})
            };
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            Ok::<_, std::convert::Infallible>(Response::new(kube::client::Body::from(bytes)))
        });
        Client::new(service, "default")
    }

    fn artifact_in(namespace: &str, writer: &str) -> Artifact {
        let mut artifact = Artifact::new("a", ArtifactSpec::default());
        artifact.metadata.namespace = Some(namespace.into());
        artifact.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "sources.example.com/v1".into(),
                kind: "Web".into(),
                name: "web".into(),
                uid: "u1".into(),
                controller: Some(true),
                block_owner_deletion: None,
            },
        ]);
        let writer = Writer {
            username: writer.into(),
            ..Writer::default()
        };
        artifact.metadata.annotations = Some(
            [(WRITER_ANNOTATION.to_string(), writer.to_annotation())]
                .into_iter()
                .collect(),
        );
        artifact
    }

    #[tokio::test]
    async fn an_artifact_where_the_webhook_does_not_look_is_never_trusted_from_its_annotation() {
        let verifier = Verifier::new(allowing_client(), true).await;
        // Where the webhook records writers, the recorded one is checked.
        assert_eq!(
            verifier
                .check(&artifact_in("apps", "kubernetes-admin"))
                .await
                .unwrap(),
            Verdict::Trusted
        );
        // The webhook's entries for Artifacts skip these namespaces: the
        // annotation there is whatever the object claims.
        for namespace in ["kube-system", "openflux-system"] {
            let verdict = verifier
                .check(&artifact_in(namespace, "kubernetes-admin"))
                .await
                .unwrap();
            let Verdict::Untrusted(message) = verdict else {
                panic!("{namespace}: an Artifact claiming its writer was trusted");
            };
            assert!(message.contains(namespace), "{message}");
        }
    }
}
