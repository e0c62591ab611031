//! The two webhooks openflux is measured against through the API server:
//! one that only allows, and one that only answers openflux's own patch.

use std::sync::Arc;

use anyhow::bail;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use openflux::webhook::server::{MAX_BODY_BYTES, MUTATE_PATH};
use serde_json::json;

use super::{kustomization, Path};
use crate::webhook_setup::{answer_of, SOURCES_PER_NAMESPACE};

/// The least a webhook the API server accepts does: answer "allowed" for
/// the request's uid (the API server refuses an answer for another uid).
pub fn allowing_router() -> Router {
    #[derive(serde::Deserialize)]
    struct Review<'a> {
        #[serde(borrow)]
        request: Request<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        uid: std::borrow::Cow<'a, str>,
    }
    async fn allow(body: Bytes) -> Response {
        match serde_json::from_slice::<Review>(&body) {
            Ok(review) => {
                let answer = json!({
                    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": review.request.uid, "allowed": true},
                });
                ([(CONTENT_TYPE, "application/json")], answer.to_string()).into_response()
            }
            Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        }
    }
    Router::new()
        .route(MUTATE_PATH, post(allow))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// openflux's patch (base64, as its answer carries it) for the create of
/// each source of the webhook benchmark's index in `ns`, by source number:
/// what the patching baseline answers.
pub async fn patches_of(openflux: &Router, ns: &str) -> anyhow::Result<Vec<String>> {
    let mut patches = Vec::with_capacity(SOURCES_PER_NAMESPACE);
    for i in 0..SOURCES_PER_NAMESPACE {
        let mut object = serde_json::to_value(kustomization(Path::Openflux, i))?;
        object["metadata"]["namespace"] = json!(ns);
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": format!("patch-{i}"),
                "resource": {"group": "kustomize.toolkit.fluxcd.io", "version": "v1", "resource": "kustomizations"},
                "operation": "CREATE", "namespace": ns, "name": format!("app-{i}"),
                "userInfo": {"username": "bench"},
                "object": object,
            },
        });
        let body = Bytes::from(serde_json::to_vec(&review)?);
        let answer: serde_json::Value = serde_json::from_slice(&answer_of(openflux, &body).await?)?;
        let Some(patch) = answer.pointer("/response/patch").and_then(|p| p.as_str()) else {
            bail!("openflux answered the create of app-{i} in {ns} without a patch: {answer}");
        };
        patches.push(patch.to_string());
    }
    Ok(patches)
}

/// The least a webhook that rewrites does: answer, for the request's uid,
/// the patch computed beforehand for the create of `app-<i>` (source
/// `i` modulo the sources of a namespace).
pub fn patching_router(patches: Arc<Vec<String>>) -> Router {
    #[derive(serde::Deserialize)]
    struct Review<'a> {
        #[serde(borrow)]
        request: Request<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        uid: std::borrow::Cow<'a, str>,
        #[serde(borrow)]
        name: std::borrow::Cow<'a, str>,
    }
    let patch = move |body: Bytes| {
        let patches = patches.clone();
        async move {
            let review = match serde_json::from_slice::<Review>(&body) {
                Ok(review) => review,
                Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
            };
            let i = review
                .request
                .name
                .strip_prefix("app-")
                .and_then(|n| n.parse::<usize>().ok())
                .map(|n| n % patches.len());
            let Some(i) = i else {
                return (StatusCode::BAD_REQUEST, "no app-<n> name").into_response();
            };
            let answer = json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {
                    "uid": review.request.uid, "allowed": true,
                    "patchType": "JSONPatch", "patch": patches[i],
                },
            });
            ([(CONTENT_TYPE, "application/json")], answer.to_string()).into_response()
        }
    };
    Router::new()
        .route(MUTATE_PATH, post(patch))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}
