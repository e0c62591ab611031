//! The HTTPS shell around [`decide`](super::mutate::decide): an axum router
//! for `POST /mutate` served over rustls, HTTP/1.1 and HTTP/2.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

pub use super::answer::{answer, answer_parsed, answer_validation, Answer};
use super::large::LargeParser;
use super::limits::{content_length, Admission, LogBudget, LARGE_QUEUE_WAIT, SMALL_BODY_BYTES};
pub use super::limits::{read_body, BodyError, MAX_BODY_BYTES, REQUEST_TIMEOUT};
use super::metrics::WebhookMetrics;
use super::refused::Refused;
use super::review::{self, AdmissionRequest, ReviewError};
use crate::cluster::facts::Facts;
use crate::cluster::survey::Fresh;
use crate::index::OwnerIndex;
use crate::locks;
use crate::policy::Policies;
use crate::rewrite::{Decision, Options, View};

const JSON: header::HeaderValue = header::HeaderValue::from_static("application/json");

/// Path the API server posts AdmissionReviews to.
pub const MUTATE_PATH: &str = "/mutate";
/// Path the API server posts AdmissionReviews of the validating webhook to.
pub const VALIDATE_PATH: &str = "/validate";
/// Time a client gets to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client gets to send the headers of a request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a connection may sit with no request in flight (from its accept,
/// or from its last request) before it is closed: longer than the API server keeps an idle connection (Go's 90 s),
/// so it closes its own first and never sends on one closing here.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a request whose reference names a kind no API serves waits
/// for the survey to read the cluster again (a CRD created a moment ago
/// shows there) before it is refused.
pub const NOT_SERVED_WAIT: Duration = Duration::from_secs(2);
/// Time a request waits for room among the requests in flight before it
/// is answered 429 with `Retry-After: 1` (the API server retries a 429).
pub const QUEUE_WAIT: Duration = Duration::from_secs(2);
/// Connections open at once. Past it, a new connection takes the place of
/// the oldest that has not sent a request yet, so connections that only
/// connect cannot keep the API server's out; when every one has sent a
/// request, the new one is closed.
pub const MAX_CONNECTIONS: usize = 1024;
/// Time requests in flight get to finish at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
pub use super::drain::SHUTDOWN_DRAIN;

/// What the webhook decides from, kept up to date by openflux's watches:
/// the owner index, the export targets and the SourcePolicies with the
/// namespaces' labels (no policy by default; [`super::serve`] watches them
/// when it has a client).
#[derive(Clone)]
pub struct Knowledge {
    pub index: Arc<RwLock<OwnerIndex>>,
    pub facts: Arc<RwLock<Facts>>,
    /// Asks the survey to read the cluster again before a reference is
    /// refused for a kind no API serves (none: refused from the facts as
    /// they are).
    pub fresh: Option<Fresh>,
    pub policies: Arc<RwLock<Policies>>,
    /// The replica's readiness, held back until the policies are loaded
    /// (none: readiness is not reported).
    pub readiness: Option<Arc<crate::telemetry::Readiness>>,
}

impl Default for Knowledge {
    fn default() -> Self {
        Knowledge {
            index: Arc::default(),
            facts: Arc::default(),
            fresh: None,
            policies: Arc::new(RwLock::new(crate::policy::NONE.clone())),
            readiness: None,
        }
    }
}

/// What the request handler needs.
#[derive(Clone)]
pub struct AppState {
    pub knowledge: Knowledge,
    pub metrics: WebhookMetrics,
    pub options: Arc<Options>,
    pub admission: Admission,
    pub logs: Arc<LogBudget>,
}

impl AppState {
    pub fn new(knowledge: Knowledge, metrics: WebhookMetrics, options: Options) -> Self {
        AppState {
            knowledge,
            metrics,
            options: Arc::new(options),
            admission: Admission::default(),
            logs: Arc::default(),
        }
    }
}

/// The webhook's routes. The state is shared behind one `Arc`, so a
/// request clones one pointer, not each of its parts.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .route(VALIDATE_PATH, post(validate))
        .with_state(Arc::new(state))
}

async fn mutate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    respond(&state, request, answer_parsed).await
}

async fn validate(State(state): State<Arc<AppState>>, request: Request) -> Response {
    respond(&state, request, answer_validation).await
}

/// How a parsed body is answered: the mutating or the validating decision.
type Answering = fn(Result<AdmissionRequest, ReviewError>, View<'_>, &Options) -> Answer;

async fn respond(state: &AppState, request: Request, answering: Answering) -> Response {
    let started = Instant::now();
    let handled = tokio::time::timeout(REQUEST_TIMEOUT, handle(state, request, answering)).await;
    let (answer, response) = match handled {
        Ok(Ok(mut answer)) => {
            let (status, json) = (answer.status, [(header::CONTENT_TYPE, JSON)]);
            let response = match &mut answer.review {
                Ok(review) => (status, json, std::mem::take(review)).into_response(),
                Err(message) => (status, std::mem::take(message)).into_response(),
            };
            (answer, response)
        }
        Ok(Err(refused)) => (refused.answer(), refused.response()),
        Err(_) => {
            let refused = Refused::TimedOut;
            (refused.answer(), refused.response())
        }
    };
    super::metrics::note(&state.logs, &answer);
    state.metrics.observe(
        answer.consumer,
        answer.outcome,
        started.elapsed().as_secs_f64(),
    );
    response
}

async fn handle(
    state: &AppState,
    request: Request,
    answering: Answering,
) -> Result<Answer, Refused> {
    let declared = content_length(request.headers());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(Refused::TooLarge);
    }
    let wait = match declared {
        Some(n) if n <= SMALL_BODY_BYTES => QUEUE_WAIT,
        _ => LARGE_QUEUE_WAIT,
    };
    let admitted = state.admission.enter(declared, MAX_BODY_BYTES as u64, wait);
    let permit = admitted.await.ok_or(Refused::Busy)?;
    let body = match read_body(request.into_body(), MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => return Err(Refused::TooLarge),
        Err(e) => return Err(Refused::Unreadable(e.to_string())),
    };
    let arrived = tokio::time::Instant::now();
    let answer = decide_body(state, &body, answering).await?;
    let Some(fresh) = &state.knowledge.fresh else {
        return Ok(answer);
    };
    if !matches!(answer.decision, Some(Decision::NotServed { .. })) {
        return Ok(answer);
    }
    // The kind may belong to a CRD created a moment ago, which the survey
    // has not read yet: ask it to read the cluster again (however many
    // requests ask, it reads at most every `ASK_GAP`) and decide once more
    // on what it read. The slot is free meanwhile.
    drop(permit);
    let deadline = arrived + NOT_SERVED_WAIT;
    let mut since = arrived;
    let mut answer = answer;
    while fresh.reading_since(since, deadline).await {
        since = tokio::time::Instant::now();
        answer = decide_body(state, &body, answering).await?;
        if !matches!(answer.decision, Some(Decision::NotServed { .. })) {
            break;
        }
    }
    Ok(answer)
}

/// Parses `body` and answers it from what openflux knows now.
async fn decide_body(
    state: &AppState,
    body: &axum::body::Bytes,
    answering: Answering,
) -> Result<Answer, Refused> {
    // A large body is parsed off the runtime's workers, on one thread of
    // lower priority, so the small requests beside it are answered first.
    let parsed = if body.len() as u64 > SMALL_BODY_BYTES {
        let parser = LargeParser::shared().map_err(|e| Refused::Unreadable(e.to_string()))?;
        parser
            .parse(body.clone())
            .await
            .map_err(|e| Refused::Unreadable(e.to_string()))?
    } else {
        review::parse(body)
    };
    // Hold the read locks for the decision only; they never cross an await.
    let index = locks::read(&state.knowledge.index);
    let facts = locks::read(&state.knowledge.facts);
    let policies = locks::read(&state.knowledge.policies);
    let view = View {
        index: &index,
        facts: &facts,
        policies: &policies,
    };
    Ok(answering(parsed, view, &state.options))
}

/// Serves `app` over TLS on `listener` until `shutdown` completes; drains
/// for [`SHUTDOWN_DRAIN`], stops accepting, gives requests in flight up to
/// [`SHUTDOWN_GRACE`] (idle or handshaking connections close) and returns.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) {
    let acceptor = TlsAcceptor::from(tls);
    let (stop_tx, stop_rx) = watch::channel(());
    let mut connections = JoinSet::new();
    let waiting = super::drain::Waiting::default();
    let logs = LogBudget::default();
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = app.layer(axum::middleware::from_fn_with_state(
        draining.clone(),
        super::drain::close_when_draining,
    ));
    let mut drain_until: Option<tokio::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown, if drain_until.is_none() => {
                draining.store(true, std::sync::atomic::Ordering::SeqCst);
                drain_until = Some(tokio::time::Instant::now() + SHUTDOWN_DRAIN);
            }
            () = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)),
                if drain_until.is_some() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept(),
                if connections.len() < MAX_CONNECTIONS || !waiting.is_empty() => match accepted {
                Ok((tcp, peer)) => {
                    if connections.len() >= MAX_CONNECTIONS && !waiting.evict_oldest() {
                        // Every connection has sent a request since the guard.
                        drop(tcp);
                        continue;
                    }
                    let span = tracing::debug_span!("connection", %peer);
                    let first = waiting.enter();
                    let serve = connection(acceptor.clone(), tcp, peer, app.clone(), stop_rx.clone(), first);
                    connections.spawn(serve.instrument(span));
                }
                Err(error) => {
                    // For example too many open files: back off instead of spinning.
                    if let Some(suppressed) = logs.allow() {
                        tracing::warn!(%error, suppressed, "cannot accept a webhook connection");
                    }
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
    first: super::drain::FirstRequest,
) {
    let _ = tcp.set_nodelay(true);
    // A handshake under way at shutdown has no request in flight: drop it.
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
    let tls = tokio::select! {
        done = handshake => match done {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        _ = stop.changed() => return,
        () = first.evicted() => return,
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let activity = super::drain::Activity::new(first);
    let service = TowerToHyperService::new(activity.track(app));
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let mut idle_check = tokio::time::interval(IDLE_TIMEOUT / 4);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "webhook connection ended with an error");
                }
                return;
            }
            _ = stop.changed() => break,
            // Nothing asked yet: the place goes to a newer connection.
            () = activity.evicted(), if !activity.asked() => {
                tracing::debug!(%peer, "connection without a request closed for a newer one");
                return;
            }
            _ = idle_check.tick() => {
                if activity.idle_for() > IDLE_TIMEOUT {
                    tracing::debug!(%peer, "closing an idle connection");
                    break;
                }
            }
        }
    }
    conn.as_mut().graceful_shutdown();
    if let Err(error) = conn.await {
        tracing::debug!(%peer, %error, "webhook connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, Bytes};
    use axum::http::Request;
    use axum::http::StatusCode;
    use tower::ServiceExt;

    fn app() -> Router {
        let mut index = OwnerIndex::new();
        index.reset([]);
        router(AppState::new(
            Knowledge {
                index: Arc::new(RwLock::new(index)),
                facts: Default::default(),
                ..Knowledge::default()
            },
            WebhookMetrics::default(),
            Options::default(),
        ))
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

    /// Posts the fixture of a Kustomization naming HttpSource of
    /// sources.openflux.dev to a webhook that knows no Artifact, decides
    /// from `facts` and asks `fresh`; the AdmissionReview answered.
    async fn review_of_httpsource_reference(
        facts: Arc<RwLock<Facts>>,
        fresh: Option<Fresh>,
    ) -> serde_json::Value {
        let mut index = OwnerIndex::new();
        index.reset([]);
        let app = router(AppState::new(
            Knowledge {
                index: Arc::new(RwLock::new(index)),
                facts,
                fresh,
                ..Knowledge::default()
            },
            WebhookMetrics::default(),
            Options::default(),
        ));
        let body = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/admission/kustomization-create-custom.json"
        ))
        .unwrap();
        let response = app
            .oneshot(Request::post(MUTATE_PATH).body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// A Kustomization naming HttpSource of sources.openflux.dev, answered
    /// by a webhook whose facts serve another kind of that group only;
    /// `fresh`, when given, is answered by a survey that then finds
    /// HttpSource. The answer's `response`.
    async fn answer_for_a_kind_served_a_moment_ago(ask: bool) -> serde_json::Value {
        use crate::cluster::target::{OciVersion, Target};
        let group = "sources.openflux.dev";
        let shadow = Target::Shadow(OciVersion::V1);
        let facts = Arc::new(RwLock::new(Facts::everywhere(shadow, &[("Widget", group)])));
        let (asked, fresh) = crate::cluster::survey::asking();
        let survey = tokio::spawn({
            let facts = facts.clone();
            async move {
                asked.asked().await;
                let began = tokio::time::Instant::now();
                let served = Facts::everywhere(shadow, &[("Widget", group), ("HttpSource", group)]);
                *locks::write(&facts) = served;
                asked.read(began);
                std::future::pending::<()>().await
            }
        });
        let review = review_of_httpsource_reference(facts, ask.then_some(fresh)).await;
        survey.abort();
        review["response"].clone()
    }

    #[tokio::test]
    async fn a_kind_served_a_moment_ago_is_found_by_reading_the_cluster_again() {
        let response = answer_for_a_kind_served_a_moment_ago(true).await;
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response["patch"].is_string(), "{response}");
        // Without asking, the same request is refused from the facts as
        // they were.
        let response = answer_for_a_kind_served_a_moment_ago(false).await;
        assert_eq!(response["allowed"], false, "{response}");
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("which no API of this cluster serves"),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kind_still_not_served_is_refused_within_the_wait() {
        use crate::cluster::target::{OciVersion, Target};
        let facts = Facts::everywhere(
            Target::Shadow(OciVersion::V1),
            &[("Widget", "sources.openflux.dev")],
        );
        // A survey that reads whenever asked and never finds the kind.
        let (asked, fresh) = crate::cluster::survey::asking();
        let readings = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let survey = tokio::spawn({
            let readings = readings.clone();
            async move {
                loop {
                    asked.asked().await;
                    let began = tokio::time::Instant::now();
                    tokio::time::sleep(crate::cluster::survey::ASK_GAP).await;
                    readings.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    asked.read(began);
                }
            }
        });
        let started = tokio::time::Instant::now();
        let review =
            review_of_httpsource_reference(Arc::new(RwLock::new(facts)), Some(fresh)).await;
        let waited = started.elapsed();
        survey.abort();
        assert_eq!(review["response"]["allowed"], false, "{review}");
        assert!(waited <= NOT_SERVED_WAIT, "waited {waited:?}");
        let readings = readings.load(std::sync::atomic::Ordering::SeqCst);
        assert!((1..=4).contains(&readings), "{readings} readings");
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
    async fn bodies_are_read_whole_in_one_piece_or_many() {
        let chunks = |parts: &[&'static [u8]]| {
            let parts: Vec<Result<Bytes, std::io::Error>> =
                parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
            Body::from_stream(futures::stream::iter(parts))
        };
        let read = |parts: &[&'static [u8]], max| read_body(chunks(parts), max);
        assert_eq!(read(&[], 10).await.unwrap(), Bytes::new());
        assert_eq!(read(&[b"abc"], 3).await.unwrap(), "abc");
        assert_eq!(read(&[b"", b"abc", b""], 3).await.unwrap(), "abc");
        assert_eq!(read(&[b"ab", b"c", b"de"], 5).await.unwrap(), "abcde");
        assert_eq!(read(&[b"ab", b"", b"cd"], 4).await.unwrap(), "abcd");
        assert!(matches!(
            read(&[b"abcd"], 3).await,
            Err(BodyError::TooLarge)
        ));
        assert!(matches!(
            read(&[b"ab", b"cd"], 3).await,
            Err(BodyError::TooLarge)
        ));
        assert!(matches!(
            read(&[b"a", b"b", b"c", b"d"], 3).await,
            Err(BodyError::TooLarge)
        ));
        let failing = Body::from_stream(futures::stream::iter([
            Ok(Bytes::from_static(b"ab")),
            Err(std::io::Error::other("reset")),
        ]));
        assert!(matches!(
            read_body(failing, 10).await,
            Err(BodyError::Read(_))
        ));
    }

    #[tokio::test]
    async fn refuses_bodies_over_the_limit() {
        let (status, _) = post(vec![b' '; MAX_BODY_BYTES + 1]).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test(start_paused = true)]
    async fn busy_answers_429_with_retry_after_and_stalled_bodies_408() {
        let mut index = OwnerIndex::new();
        index.reset([]);
        let mut state = AppState::new(
            Knowledge {
                index: Arc::new(RwLock::new(index)),
                facts: Default::default(),
                ..Knowledge::default()
            },
            WebhookMetrics::default(),
            Options::default(),
        );
        state.admission = Admission::new(1, 1 << 20);
        let app = router(state.clone());
        let request = |body: Body| Request::post(MUTATE_PATH).body(body).unwrap();
        // A body that never ends holds the only slot until the timeout.
        let stalled =
            Body::from_stream(futures::stream::pending::<Result<Vec<u8>, std::io::Error>>());
        let first = tokio::spawn(app.clone().oneshot(request(stalled)));
        while state.admission.available() > 0 {
            tokio::task::yield_now().await;
        }
        let busy = app
            .clone()
            .oneshot(request(Body::from("{}")))
            .await
            .unwrap();
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
        let timed_out = first.await.unwrap().unwrap();
        assert_eq!(timed_out.status(), StatusCode::REQUEST_TIMEOUT);
        // Room again once it is gone.
        let (status, _) = post("{").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
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
