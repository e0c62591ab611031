//! The bodies are compared with examples written by hand from the JSON tags
//! of `fluxcd/pkg/apis/event/v1beta1.Event` and `corev1.ObjectReference`
//! (testdata/); the posting with a real HTTP server standing in for
//! notification-controller.

use super::*;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post as post_route;
use axum::Router;
use k8s_openapi::jiff::Timestamp;

fn at(rfc3339: &str) -> Time {
    Time(rfc3339.parse::<Timestamp>().unwrap())
}

fn source() -> ObjectReference {
    ObjectReference {
        api_version: Some("sources.openflux.dev/v1alpha1".into()),
        kind: Some("HttpSource".into()),
        name: Some("podinfo".into()),
        namespace: Some("apps".into()),
        uid: Some("0b0d6a52-1c7e-4f5e-9d0e-3c1f0b7e2a11".into()),
        ..ObjectReference::default()
    }
}

fn fixture(name: &str) -> serde_json::Value {
    let text = match name {
        "new-artifact" => include_str!("testdata/new-artifact.json"),
        "fetch-failed-exported" => include_str!("testdata/fetch-failed-exported.json"),
        other => panic!("no fixture {other}"),
    };
    serde_json::from_str(text).unwrap()
}

#[test]
fn a_new_artifact_is_posted_as_flux_does() {
    let annotations = BTreeMap::from([
        (
            "event.toolkit.fluxcd.io/team".to_string(),
            "platform".to_string(),
        ),
        (
            "kubectl.kubernetes.io/last-applied".to_string(),
            "{}".to_string(),
        ),
    ]);
    let event = FluxEvent::normal(
        "NewArtifact",
        "stored artifact with revision 'sha256:3f1c' from 'https://example.com/podinfo.tar.gz'",
    )
    .with_metadata(META_REVISION, "sha256:3f1c")
    .with_metadata(META_DIGEST, "sha256:3f1c");
    let reporter = Reporter {
        controller: "openflux-http-source".into(),
        instance: Some("openflux-http-source-5d9c7f-x2k4q".into()),
    };
    let body = notification(
        &source(),
        &annotations,
        &event,
        &reporter,
        at("2025-06-01T10:00:00Z"),
    );
    let expected = fixture("new-artifact");
    assert_eq!(serde_json::to_value(&body).unwrap(), expected);
    // And the recorded body reads back as the same event.
    let read: NotificationEvent = serde_json::from_value(expected).unwrap();
    assert_eq!(read, body);
}

#[test]
fn a_warning_about_the_exported_object_has_its_group_and_severity_error() {
    let exported = ObjectReference {
        api_version: Some("source.toolkit.fluxcd.io/v1".into()),
        kind: Some("ExternalArtifact".into()),
        name: Some("httpsource-podinfo".into()),
        namespace: Some("apps".into()),
        ..ObjectReference::default()
    };
    let event = FluxEvent::warning(
        "FetchFailed",
        "GET https://example.com/podinfo.tar.gz: 503 Service Unavailable",
    );
    let reporter = Reporter {
        controller: "openflux-http-source".into(),
        instance: None,
    };
    let body = notification(
        &exported,
        &BTreeMap::new(),
        &event,
        &reporter,
        at("2025-06-01T10:05:00Z"),
    );
    assert_eq!(
        serde_json::to_value(&body).unwrap(),
        fixture("fetch-failed-exported")
    );
    let with_revision = notification(
        &exported,
        &BTreeMap::new(),
        &event.clone().with_metadata(META_REVISION, "sha256:aa"),
        &reporter,
        at("2025-06-01T10:05:00Z"),
    );
    assert_eq!(
        with_revision.metadata,
        BTreeMap::from([(
            "source.toolkit.fluxcd.io/revision".to_string(),
            "sha256:aa".to_string()
        )])
    );
}

/// A stand-in for notification-controller: answers the scripted statuses in
/// turn (then 200), or hangs, and keeps the bodies it got.
#[derive(Clone, Default)]
struct Receiver {
    script: Arc<Mutex<Vec<u16>>>,
    bodies: Arc<Mutex<Vec<serde_json::Value>>>,
    hang: Arc<Mutex<Option<Duration>>>,
}

async fn receive(State(r): State<Receiver>, body: axum::body::Bytes) -> StatusCode {
    let hang = *r.hang.lock().unwrap();
    if let Some(d) = hang {
        tokio::time::sleep(d).await;
    }
    if let Ok(v) = serde_json::from_slice(&body) {
        r.bodies.lock().unwrap().push(v);
    }
    let mut script = r.script.lock().unwrap();
    let code = if script.is_empty() {
        200
    } else {
        script.remove(0)
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::OK)
}

async fn receiver(script: &[u16]) -> (SocketAddr, Receiver) {
    let r = Receiver::default();
    *r.script.lock().unwrap() = script.to_vec();
    let app = Router::new()
        .route("/", post_route(receive))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, r)
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        timeout: Duration::from_millis(300),
        retries: 4,
        min_wait: Duration::from_millis(5),
        max_wait: Duration::from_millis(20),
    }
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn sample() -> NotificationEvent {
    let reporter = Reporter {
        controller: "c".into(),
        instance: None,
    };
    notification(
        &source(),
        &BTreeMap::new(),
        &FluxEvent::normal("NewArtifact", "stored"),
        &reporter,
        at("2025-06-01T10:00:00Z"),
    )
}

fn url(addr: SocketAddr) -> Url {
    Url::parse(&format!("http://{addr}/")).unwrap()
}

use reqwest::Url;

#[tokio::test]
async fn retries_server_errors_then_delivers() {
    let (addr, r) = receiver(&[500, 503]).await;
    notifier::post(&http(), &url(addr), &sample(), quick())
        .await
        .unwrap();
    let bodies = r.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3);
    assert_eq!(bodies[2]["reason"], "NewArtifact");
    assert_eq!(bodies[2]["involvedObject"]["kind"], "HttpSource");
}

#[tokio::test]
async fn a_duplicate_or_a_refusal_is_not_retried() {
    let (addr, r) = receiver(&[429]).await;
    notifier::post(&http(), &url(addr), &sample(), quick())
        .await
        .unwrap();
    assert_eq!(r.bodies.lock().unwrap().len(), 1);

    let (addr, r) = receiver(&[400]).await;
    let err = notifier::post(&http(), &url(addr), &sample(), quick())
        .await
        .unwrap_err();
    assert!(matches!(err, NotifyError::Refused(s) if s == StatusCode::BAD_REQUEST));
    assert_eq!(r.bodies.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn gives_up_after_the_retries() {
    let (addr, r) = receiver(&[500, 500, 500, 500, 500, 500]).await;
    let err = notifier::post(&http(), &url(addr), &sample(), quick())
        .await
        .unwrap_err();
    assert!(
        matches!(err, NotifyError::Failed { attempts: 5, .. }),
        "{err}"
    );
    assert_eq!(r.bodies.lock().unwrap().len(), 5);

    // Nobody listening: connection errors are retried too, then reported.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let err = notifier::post(&http(), &url(closed), &sample(), quick())
        .await
        .unwrap_err();
    assert!(
        matches!(err, NotifyError::Failed { attempts: 5, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_hanging_receiver_times_out() {
    let (addr, r) = receiver(&[]).await;
    *r.hang.lock().unwrap() = Some(Duration::from_secs(5));
    let policy = RetryPolicy {
        retries: 1,
        ..quick()
    };
    let started = std::time::Instant::now();
    let err = notifier::post(&http(), &url(addr), &sample(), policy)
        .await
        .unwrap_err();
    assert!(
        matches!(err, NotifyError::Failed { attempts: 2, .. }),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn the_notifier_queues_without_waiting() {
    let (addr, r) = receiver(&[]).await;
    *r.hang.lock().unwrap() = Some(Duration::from_secs(30));
    let notifier = Notifier::spawn(url(addr), http(), quick());
    let started = std::time::Instant::now();
    let mut accepted = 0;
    for _ in 0..notifier::QUEUE + 10 {
        if notifier.send(sample()) {
            accepted += 1;
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "sending never waits"
    );
    // The queue, plus the one the task took and is posting.
    assert!(
        (notifier::QUEUE..=notifier::QUEUE + 1).contains(&accepted),
        "{accepted}"
    );
}

#[tokio::test]
async fn the_notifier_delivers_in_the_background() {
    let (addr, r) = receiver(&[503]).await;
    let notifier = Notifier::spawn(url(addr), http(), quick());
    assert!(notifier.send(sample()));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while r.bodies.lock().unwrap().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "not delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn waits_grow_and_are_capped() {
    let policy = RetryPolicy::default();
    let waits: Vec<u64> = (0..6).map(|a| policy.wait(a).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 30]);
    assert_eq!(policy.wait(40), Duration::from_secs(30));
}

/// One row: message, expected note length and whether it was cut.
#[test]
fn notes_longer_than_the_api_server_takes_are_cut() {
    let rows: Vec<(String, usize, bool)> = vec![
        ("short".to_string(), 5, false),
        ("a".repeat(MAX_NOTE), MAX_NOTE, false),
        ("a".repeat(MAX_NOTE + 1), MAX_NOTE, true),
        ("a".repeat(5 * MAX_NOTE), MAX_NOTE, true),
        // A character across the cut is left out whole.
        (
            format!("{}é{}", "a".repeat(MAX_NOTE - 4), "b".repeat(10)),
            MAX_NOTE - 1,
            true,
        ),
    ];
    for (i, (message, len, cut)) in rows.into_iter().enumerate() {
        let note = event_note(&message);
        assert_eq!(note.len(), len, "row {i}");
        assert_eq!(note.ends_with("..."), cut, "row {i}");
        assert!(message.starts_with(note.trim_end_matches("...")), "row {i}");
    }
}
