//! The HTTPS shell around [`decide`](super::rewrite::decide): an axum router
//! for `POST /mutate` served over rustls, HTTP/1.1 and HTTP/2.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use super::consumers;
use super::decision::{Decision, Options};
use super::metrics::WebhookMetrics;
use super::review::{self, ReviewError};
use super::rewrite::decide;
use crate::facts::Facts;
use crate::index::OwnerIndex;
use crate::locks;

/// Path the API server posts AdmissionReviews to.
pub const MUTATE_PATH: &str = "/mutate";
/// Largest request body accepted: the API server's own request limit.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// Time a client gets to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client gets to send the headers of a request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time open connections get to finish at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What the request handler needs.
#[derive(Clone)]
pub struct AppState {
    pub knowledge: Knowledge,
    pub metrics: WebhookMetrics,
    pub options: Arc<Options>,
}

/// The webhook's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn mutate(State(state): State<AppState>, body: Bytes) -> Response {
    let started = Instant::now();
    let request = match review::parse(&body) {
        Ok(request) => request,
        Err(ReviewError::Unanswerable(message)) => {
            tracing::warn!(%message, "unreadable admission request");
            state
                .metrics
                .observe("unknown", "error", started.elapsed().as_secs_f64());
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
        Err(ReviewError::Invalid { uid, message }) => {
            tracing::warn!(%uid, %message, "malformed admission request");
            state
                .metrics
                .observe("unknown", "error", started.elapsed().as_secs_f64());
            return Json(review::refusal(&uid, 400, &message)).into_response();
        }
    };
    let consumer = consumers::find(&request.resource.group, &request.resource.resource)
        .map(|c| c.label())
        .or_else(|| {
            super::rewrite::writer::is_artifact_resource(
                &request.resource.group,
                &request.resource.resource,
            )
            .then_some("artifacts")
        })
        .unwrap_or("unknown");
    let name = request
        .object
        .as_ref()
        .and_then(|o| o.pointer("/metadata/name"))
        .and_then(|n| n.as_str())
        .or(request.name.as_deref())
        .unwrap_or("");
    let span = tracing::info_span!(
        "admission",
        uid = %request.uid,
        consumer,
        namespace = request.namespace.as_deref().unwrap_or(""),
        name,
        operation = ?request.operation,
        dry_run = request.dry_run.unwrap_or(false),
    );
    let mut decision = {
        // Hold the read lock for the decision only; it never crosses an await.
        let index = locks::read(&state.knowledge.index);
        let facts = locks::read(&state.knowledge.facts);
        let view = super::rewrite::View {
            index: &index,
            facts: &facts,
        };
        decide(&request, view, &state.options)
    };
    let answer = review::response(&request.uid, &decision).unwrap_or_else(|error| {
        decision = Decision::internal(error.to_string());
        review::refusal(&request.uid, 500, &error.to_string())
    });
    let outcome = decision.outcome();
    span.in_scope(|| match &decision {
        Decision::Unchanged => tracing::debug!(outcome, "admitted unchanged"),
        Decision::Rewrite { patch, warnings } => {
            // Debug: every re-apply of such an object is rewritten again.
            tracing::debug!(outcome, %patch, ?warnings, "rewrote source reference")
        }
        Decision::Deny { message } => tracing::info!(outcome, %message, "denied"),
        Decision::Error { code, message } if *code >= 500 => {
            tracing::error!(outcome, code, %message, "not decided")
        }
        Decision::Error { code, message } => tracing::warn!(outcome, code, %message, "not decided"),
    });
    state
        .metrics
        .observe(consumer, outcome, started.elapsed().as_secs_f64());
    Json(answer).into_response()
}

/// Serves `app` over TLS on `listener` until `shutdown` completes; then
/// stops accepting, lets open connections finish their requests (up to
/// [`SHUTDOWN_GRACE`]) and returns.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) {
    let acceptor = TlsAcceptor::from(tls);
    let (stop_tx, stop_rx) = watch::channel(());
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let span = tracing::debug_span!("connection", %peer);
                    connections.spawn(
                        connection(acceptor.clone(), tcp, peer, app.clone(), stop_rx.clone())
                            .instrument(span),
                    );
                }
                Err(error) => {
                    // For example too many open files: back off instead of spinning.
                    tracing::warn!(%error, "cannot accept a webhook connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(());
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "closing webhook connections that did not finish in time"
        );
        connections.shutdown().await;
    }
}

async fn connection(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    app: Router,
    mut stop: watch::Receiver<()>,
) {
    let _ = tcp.set_nodelay(true);
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let service = TowerToHyperService::new(app);
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "webhook connection ended with an error");
            }
        }
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            if let Err(error) = conn.await {
                tracing::debug!(%peer, %error, "webhook connection ended with an error");
            }
        }
    }
}

/// What the webhook decides from, kept up to date by openflux's watches:
/// the owner index and the export targets.
#[derive(Clone, Default)]
pub struct Knowledge {
    pub index: Arc<std::sync::RwLock<OwnerIndex>>,
    pub facts: Arc<std::sync::RwLock<Facts>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use std::sync::RwLock;
    use tower::ServiceExt;

    fn app() -> Router {
        let mut index = OwnerIndex::new();
        index.reset([]);
        router(AppState {
            knowledge: Knowledge {
                index: Arc::new(RwLock::new(index)),
                facts: Default::default(),
            },
            metrics: WebhookMetrics::default(),
            options: Arc::new(Options::default()),
        })
    }

    async fn post(body: impl Into<Body>) -> (StatusCode, Vec<u8>) {
        let response = app()
            .oneshot(
                Request::post(MUTATE_PATH)
                    .header("content-type", "application/json")
                    .body(body.into())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, bytes.to_vec())
    }

    #[tokio::test]
    async fn answers_malformed_requests_without_panicking() {
        let (status, _) = post("{").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) =
            post(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        // With a uid: a well-formed AdmissionReview answer.
        let (status, body) = post(
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","resource":{"group":"","version":"v1","resource":"pods"},"object":{"spec":{}}}}"#,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["response"]["uid"], "u");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["code"], 400);
    }

    #[tokio::test]
    async fn refuses_bodies_over_the_limit() {
        let (status, _) = post(vec![b' '; MAX_BODY_BYTES + 1]).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn only_post_mutate_is_served() {
        let response = app()
            .oneshot(Request::get(MUTATE_PATH).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        let response = app()
            .oneshot(Request::post("/other").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
}
