//! The HTTPS shell around [`decide`](super::mutate::decide): an axum router
//! for `POST /mutate` served over rustls, HTTP/1.1 and HTTP/2.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::body::BodyDataStream;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

pub use super::answer::{answer, answer_parsed, answer_validation, Answer};
use super::drain::Peer;
use super::large::LargeParser;
use super::limits::{
    content_length, discard, read_stream, Admission, LogBudget, BODY_READ_TIMEOUT,
    LARGE_QUEUE_WAIT, SMALL_BODY_BYTES,
};
pub use super::limits::{read_body, BodyError, MAX_BODY_BYTES, REQUEST_TIMEOUT};
use super::metrics::WebhookMetrics;
use super::refused::Refused;
use super::review::{self, ReviewError};
use crate::cluster::facts::Facts;
use crate::cluster::survey::Fresh;
use crate::index::OwnerIndex;
use crate::locks;
use crate::policy::Policies;
use crate::rewrite::admission::AdmissionRequest;
use crate::rewrite::{Decision, Options, View};

const JSON: header::HeaderValue = header::HeaderValue::from_static("application/json");

/// Path the API server posts AdmissionReviews to.
pub const MUTATE_PATH: &str = "/mutate";
/// Path the API server posts AdmissionReviews of the validating webhook to.
pub const VALIDATE_PATH: &str = "/validate";
/// How long a request whose reference names a kind no API serves waits
/// for the survey to read the cluster again (a CRD created a moment ago
/// shows there) before it is refused.
pub const NOT_SERVED_WAIT: Duration = Duration::from_secs(2);
/// Time a request waits for room (to read its body, then among the
/// requests decided at once) before it is answered 429 with
/// `Retry-After: 1` (the API server retries a 429).
pub const QUEUE_WAIT: Duration = Duration::from_secs(2);
/// Connections open at once. Past it, a new connection takes the place of
/// the oldest that has not sent a request yet, else of the one idle the
/// longest (no request in flight), so neither connections that only
/// connect nor ones that send a request now and then can keep the API
/// server's out; when every one has a request in flight, the new one is
/// closed.
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
    let declared = content_length(request.headers());
    let peer = request.extensions().get::<Peer>().map(|p| p.0);
    let mut body = request.into_body().into_data_stream();
    let handling = handle(state, declared, peer, &mut body, answering);
    let answer = match tokio::time::timeout(REQUEST_TIMEOUT, handling).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(refused)) => Err(refused),
        Err(_) => Err(Refused::TimedOut),
    };
    // Refused before its body was read whole: what is still arriving is
    // read and dropped first (bounded), so the client reads the answer
    // rather than a reset in the middle of its body. A decided request's
    // body was read to its end.
    if answer.is_err() {
        discard(&mut body).await;
    }
    let (answer, response) = match answer {
        Ok(mut answer) => {
            super::metrics::note(&state.logs, &answer);
            let (status, json) = (answer.status, [(header::CONTENT_TYPE, JSON)]);
            let response = match &mut answer.review {
                Ok(review) => (status, json, std::mem::take(review)).into_response(),
                Err(message) => (status, std::mem::take(message)).into_response(),
            };
            (answer, response)
        }
        Err(refused) => {
            let answer = refused.answer();
            super::metrics::note(&state.logs, &answer);
            (answer, refused.response())
        }
    };
    state.metrics.observe(
        answer.consumer,
        answer.outcome,
        started.elapsed().as_secs_f64(),
    );
    response
}

/// Reads the body of `declared` bytes from `peer` within the budgets and
/// decides it; the stream is left where reading stopped.
async fn handle(
    state: &AppState,
    declared: Option<u64>,
    peer: Option<std::net::IpAddr>,
    body: &mut BodyDataStream,
    answering: Answering,
) -> Result<Answer, Refused> {
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(Refused::TooLarge);
    }
    let wait = match Admission::is_large(declared) {
        true => LARGE_QUEUE_WAIT,
        false => QUEUE_WAIT,
    };
    let max = MAX_BODY_BYTES as u64;
    let Some(_reserved) = state.admission.reserve(peer, declared, max, wait).await else {
        return Err(Refused::Busy);
    };
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, read_stream(body, MAX_BODY_BYTES));
    let body = match read.await {
        Ok(Ok(body)) => body,
        Ok(Err(BodyError::TooLarge)) => return Err(Refused::TooLarge),
        Ok(Err(e)) => return Err(Refused::Unreadable(e.to_string())),
        Err(_) => return Err(Refused::SlowBody),
    };
    let arrived = tokio::time::Instant::now();
    let answer = {
        let _deciding = state
            .admission
            .enter(QUEUE_WAIT)
            .await
            .ok_or(Refused::Busy)?;
        decide_body(state, &body, answering).await?
    };
    let Some(fresh) = &state.knowledge.fresh else {
        return Ok(answer);
    };
    if !matches!(answer.decision, Some(Decision::NotServed { .. })) {
        return Ok(answer);
    }
    // The kind may belong to a CRD created a moment ago, which the survey
    // has not read yet: ask it to read the cluster again (however many
    // requests ask, it reads at most as often as its budget of asked
    // readings allows) and decide once more on what it read. No place
    // among the decisions is held while waiting; the body stays within
    // its budget.
    let deadline = arrived + NOT_SERVED_WAIT;
    let mut since = arrived;
    let mut answer = answer;
    while fresh.reading_since(since, deadline).await {
        since = tokio::time::Instant::now();
        let _deciding = state
            .admission
            .enter(QUEUE_WAIT)
            .await
            .ok_or(Refused::Busy)?;
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
                    let first = waiting.enter(peer.ip().to_canonical());
                    let serve = super::connection::serve(acceptor.clone(), tcp, peer, app.clone(), stop_rx.clone(), first);
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, Bytes};
    use axum::http::Request;
    use axum::http::StatusCode;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt;

    use super::super::limits::DRAIN_GRACE;

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

    /// A body that never ends is cut at [`BODY_READ_TIMEOUT`] (408) and
    /// holds only its peer's share of the body budget meanwhile: another
    /// body of unknown size from that peer finds no room (429 with
    /// `Retry-After`), a small one is answered.
    #[tokio::test(start_paused = true)]
    async fn stalled_bodies_time_out_and_hold_only_their_share() {
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
        state.admission = Admission::new(1, 1 << 20, 1 << 20);
        let app = router(state.clone());
        let request = |body: Body| Request::post(MUTATE_PATH).body(body).unwrap();
        let stalled =
            Body::from_stream(futures::stream::pending::<Result<Vec<u8>, std::io::Error>>());
        let started = tokio::time::Instant::now();
        let first = tokio::spawn(app.clone().oneshot(request(stalled)));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let busy = app
            .clone()
            .oneshot(request(Body::from("{}")))
            .await
            .unwrap();
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
        let small = Request::post(MUTATE_PATH)
            .header(header::CONTENT_LENGTH, "1")
            .body(Body::from("{"))
            .unwrap();
        let answered = app.clone().oneshot(small).await.unwrap();
        assert_eq!(answered.status(), StatusCode::BAD_REQUEST);
        let timed_out = first.await.unwrap().unwrap();
        assert_eq!(timed_out.status(), StatusCode::REQUEST_TIMEOUT);
        // Nothing more arrived: the answer went once the drain's grace was
        // over.
        assert_eq!(started.elapsed(), BODY_READ_TIMEOUT + DRAIN_GRACE);
        // Room again once it is gone.
        let (status, _) = post("{").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    /// A body of `chunks` pieces of 64 KiB, one every `gap`; `ended` is set
    /// once it has been read to its end.
    fn arriving(chunks: usize, gap: Duration, ended: Arc<AtomicBool>) -> Body {
        let pieces = futures::stream::unfold(0, move |sent| {
            let ended = ended.clone();
            async move {
                if sent == chunks {
                    ended.store(true, Ordering::SeqCst);
                    return None;
                }
                tokio::time::sleep(gap).await;
                Some((Ok::<_, std::io::Error>(vec![b' '; 64 * 1024]), sent + 1))
            }
        });
        Body::from_stream(pieces)
    }

    /// A webhook with room to read one large body at a time.
    fn narrow() -> Router {
        let mut state = AppState::new(
            Knowledge::default(),
            WebhookMetrics::default(),
            Options::default(),
        );
        state.admission = Admission::new(4, 1 << 20, 1 << 20);
        router(state)
    }

    /// Every request answered before its body was read whole (no room,
    /// too slow to arrive) has the rest read while it keeps arriving,
    /// for longer than the grace, so its client reads the answer and not a
    /// reset; a body that stops is cut at the grace.
    #[tokio::test(start_paused = true)]
    async fn a_body_still_arriving_is_read_to_its_end_before_the_answer() {
        let app = narrow();
        let request = |body: Body| Request::post(MUTATE_PATH).body(body).unwrap();
        // 3 MiB at 640 KiB/s: slower than the body read allows, as fast as
        // the drain asks.
        let (ended, gap) = (Arc::new(AtomicBool::new(false)), Duration::from_millis(100));
        let started = tokio::time::Instant::now();
        let slow = app
            .clone()
            .oneshot(request(arriving(48, gap, ended.clone())))
            .await
            .unwrap();
        assert_eq!(slow.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(ended.load(Ordering::SeqCst), "the slow body was cut");
        assert!(started.elapsed() >= gap * 48, "{:?}", started.elapsed());

        // No room: the large budget's share of this peer is held by a
        // body that never ends.
        let stalled =
            Body::from_stream(futures::stream::pending::<Result<Vec<u8>, std::io::Error>>());
        let holder = tokio::spawn(app.clone().oneshot(request(stalled)));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let ended = Arc::new(AtomicBool::new(false));
        let busy = app
            .clone()
            .oneshot(request(arriving(48, gap, ended.clone())))
            .await
            .unwrap();
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(ended.load(Ordering::SeqCst), "the refused body was cut");
        holder.abort();

        // A body that arrives a piece every 3 s earns no more time than
        // the grace.
        let ended = Arc::new(AtomicBool::new(false));
        let started = tokio::time::Instant::now();
        let trickled = app
            .oneshot(request(arriving(48, Duration::from_secs(3), ended.clone())))
            .await
            .unwrap();
        assert_eq!(trickled.status(), StatusCode::REQUEST_TIMEOUT);
        assert!(!ended.load(Ordering::SeqCst));
        assert!(
            started.elapsed() <= BODY_READ_TIMEOUT + DRAIN_GRACE + Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }

    /// The line about a request refused before it was decided says why,
    /// as its answer does.
    #[tokio::test]
    async fn a_refused_requests_line_says_why() {
        let lines = super::super::metrics::tests::Lines::default();
        let _logging = tracing::subscriber::set_default(lines.subscriber());
        let (status, body) =
            post(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let why = String::from_utf8(body).unwrap();
        assert!(!why.is_empty());
        let logged = lines.parsed();
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert_eq!(logged[0]["msg"], "admission request refused");
        assert_eq!(logged[0]["error"], why.as_str(), "{logged:?}");
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
