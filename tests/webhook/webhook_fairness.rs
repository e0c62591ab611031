//! What one client cannot take from the others: a reference with a huge
//! field, bodies trickled a byte at a time, connections held open with a
//! request now and then, and a flood of maximum-size reviews. Each runs
//! against the webhook's own HTTPS server in this process; the clients
//! that misbehave ([`attack`]) come from 127.0.0.2, the ordinary ones (as
//! the API server's would) from 127.0.0.1, and an ordinary review must be
//! answered within [`ORDINARY`] throughout.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use openflux::index::OwnerIndex;
use openflux::webhook::server::{MAX_BODY_BYTES, MAX_CONNECTIONS, MUTATE_PATH, REQUEST_TIMEOUT};
use openflux::webhook::{self, WebhookArgs, WebhookMetrics};
use serde_json::{json, Value};

use crate::attack::{self, ordinary_peer, other_peer};

/// The bound on an ordinary admission, whatever else is in flight.
const ORDINARY: Duration = Duration::from_secs(1);
/// How the webhook's 408 for a body slower than its read timeout
/// begins.
const SLOW_BODY: &str = "the request body did not arrive within";
/// The group whose kinds the cluster of these tests serves.
const GROUP: &str = "widgets.example.com";

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// A webhook whose cluster serves sixty kinds of [`GROUP`] and knows no
/// Artifact.
async fn start() -> Server {
    let kinds: Vec<String> = (0..60).map(|i| format!("Widget{i:02}Source")).collect();
    let served: Vec<(&str, &str)> = kinds.iter().map(|k| (k.as_str(), GROUP)).collect();
    let facts = openflux::cluster::facts::Facts::everywhere(
        openflux::cluster::target::Target::ExternalArtifact,
        &served,
    );
    let mut index = OwnerIndex::new();
    index.reset([]);
    let args = WebhookArgs {
        webhook_addr: "127.0.0.1:0".parse().unwrap(),
        webhook_dns_names: vec!["localhost".into()],
        webhook_ips: vec!["127.0.0.1".parse().unwrap()],
        ..WebhookArgs::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(webhook::serve_on(
        listener,
        args,
        None,
        webhook::Knowledge {
            index: Arc::new(RwLock::new(index)),
            facts: Arc::new(RwLock::new(facts)),
            ..Default::default()
        },
        WebhookMetrics::default(),
        async {
            let _ = stopped.await;
        },
    ));
    Server {
        addr,
        stop: Some(stop),
        task,
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// An AdmissionReview of a Kustomization whose `spec.sourceRef` is
/// `source_ref`, with `padding` bytes in an annotation.
fn review(source_ref: Value, padding: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "operation": "CREATE", "namespace": "apps", "name": "app",
            "kind": {"group": "kustomize.toolkit.fluxcd.io", "version": "v1", "kind": "Kustomization"},
            "resource": {"group": "kustomize.toolkit.fluxcd.io", "version": "v1", "resource": "kustomizations"},
            "object": {
                "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                "metadata": {"name": "app", "namespace": "apps", "annotations": {"padding": "p".repeat(padding)}},
                "spec": {"interval": "5m", "path": "./", "sourceRef": source_ref}
            }
        }
    }))
    .unwrap()
}

/// The ordinary review: a Kustomization naming a misspelt kind of
/// [`GROUP`], refused with the closest served kinds.
fn ordinary_review() -> Vec<u8> {
    review(
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Widget07Sourse", "name": "web"}),
        0,
    )
}

/// Sends the ordinary review on a new connection from 127.0.0.1 and
/// asserts it is answered (the misspelt kind refused) within [`ORDINARY`];
/// `what` says what else is going on.
async fn ordinary_is_answered(addr: SocketAddr, what: &str) {
    let started = Instant::now();
    let answered = tokio::time::timeout(ORDINARY, async {
        let mut sender = attack::client_from(ordinary_peer(), addr)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        attack::post(&mut sender, MUTATE_PATH, ordinary_review()).await
    })
    .await;
    let (status, answer) = match answered {
        Ok(Ok(answered)) => answered,
        Ok(Err(e)) => panic!(
            "{what}: the ordinary review failed after {:?}: {e}",
            started.elapsed()
        ),
        Err(_) => panic!("{what}: the ordinary review was not answered within {ORDINARY:?}"),
    };
    let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{what}: {answer}");
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        answer["response"]["allowed"] == false && message.contains("Widget07Source"),
        "{what}: {answer}"
    );
}

/// Ordinary reviews, one after the other, until `attack` is done (at least
/// three, at most `rounds`); then what the attack returned.
async fn ordinary_throughout<T>(
    addr: SocketAddr,
    what: &str,
    rounds: usize,
    mut attack: tokio::sync::oneshot::Receiver<T>,
) -> T {
    let mut round = 0;
    loop {
        ordinary_is_answered(addr, &format!("round {round} {what}")).await;
        round += 1;
        if round >= 3 {
            match attack.try_recv() {
                Ok(done) => return done,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                    panic!("{what}: the clients' thread ended without a result")
                }
                Err(_) if round >= rounds => {
                    return attack.await.expect("the clients' result");
                }
                Err(_) => {}
            }
        }
    }
}

/// Eight reviews whose reference has a kind of 3 MiB (a name no CRD may
/// have) are refused for their length, and an ordinary review beside them
/// is answered in time: the closest-kind suggestion never runs on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_kind_does_not_stall_the_webhook() {
    let server = start().await;
    let kind = "Q".repeat(3 * 1024 * 1024 - 4096);
    let huge = review(
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": kind, "name": "x"}),
        0,
    );
    assert!(huge.len() <= MAX_BODY_BYTES);
    let addr = server.addr;
    let clients = attack::on_a_niced_thread(move || async move {
        let mut flood = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let body = huge.clone();
            flood.spawn(async move {
                let mut sender = attack::client_from(other_peer(), addr)
                    .await
                    .map_err(|e| e.to_string())?;
                attack::post(&mut sender, MUTATE_PATH, body).await
            });
        }
        flood.join_all().await
    });
    let answers = ordinary_throughout(server.addr, "beside 3 MiB kinds", 30, clients).await;
    for answered in answers {
        let (status, answer) = answered.expect("each huge review is answered");
        if status == 429 {
            continue; // Shed: told to come back.
        }
        let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
        assert_eq!(status, 200, "{answer:.300}");
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(answer["response"]["status"]["code"], 400, "{message:.300}");
        assert!(
            message.contains("spec.sourceRef.kind is") && message.len() < 400,
            "{message:.300}"
        );
    }
}

/// Two hundred clients that send the head of a 60,000-byte review and
/// then a byte a second hold nothing an ordinary review needs, and are
/// cut once their body is overdue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_bodies_do_not_crowd_out_others() {
    let server = start().await;
    let addr = server.addr;
    let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<()>(200);
    let clients = attack::on_a_niced_thread(move || async move {
        let mut tricklers = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let started = started_tx.clone();
            tricklers.spawn(attack::trickle(
                other_peer(),
                addr,
                MUTATE_PATH,
                60_000,
                started,
            ));
        }
        drop(started_tx);
        tricklers.join_all().await
    });
    let mut started = 0;
    while started_rx.recv().await.is_some() {
        started += 1;
    }
    assert!(started >= 190, "only {started} of 200 tricklers started");
    // Through the first body deadline and past it.
    let held = ordinary_throughout(server.addr, "beside 200 tricklers", 4, clients).await;
    for trickler in held {
        let (took, answer) = trickler.expect("a trickler");
        assert!(
            took <= REQUEST_TIMEOUT + Duration::from_secs(2),
            "a trickler was held {took:?}"
        );
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "a trickler was answered {answer:.200}"
        );
    }
}

/// With every one of the server's connections taken by a client that sent
/// a request and keeps its connection, a new client still gets in: the
/// connection idle the longest makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_asked_make_room_for_new_ones() {
    use futures::StreamExt;
    let server = start().await;
    let cheap = review(
        json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "web"}),
        0,
    );
    let addr = server.addr;
    let (keep_tx, keep_rx) = tokio::sync::oneshot::channel::<()>();
    let (asked_tx, asked_rx) = tokio::sync::oneshot::channel::<usize>();
    let clients = attack::on_a_niced_thread(move || async move {
        let held: Vec<_> = futures::stream::iter(0..MAX_CONNECTIONS)
            .map(|_| {
                let body = cheap.clone();
                async move {
                    let mut sender = attack::client_from(other_peer(), addr).await.ok()?;
                    let (status, _) = attack::post(&mut sender, MUTATE_PATH, body).await.ok()?;
                    (status == 200).then_some(sender)
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        let _ = asked_tx.send(held.iter().flatten().count());
        // Every connection kept until the test is done.
        let _ = keep_rx.await;
        drop(held);
    });
    let asked = asked_rx.await.expect("the count of connections that asked");
    assert!(
        asked + 8 >= MAX_CONNECTIONS,
        "only {asked} connections asked"
    );
    for round in 0..3 {
        ordinary_is_answered(server.addr, &format!("round {round}, every place taken")).await;
    }
    let _ = keep_tx.send(());
    clients.await.expect("the clients' thread");
}

/// Clients that each write maximum-size reviews into a server with room
/// for two at a time all read an answer (200, or 429 to come back later),
/// never a connection reset in the middle of their body. The flood's own
/// thread runs at a lower priority and writes 48 bodies at once, so on a
/// loaded machine a body let in may reach the server slower than
/// [`BODY_READ_TIMEOUT`](openflux::webhook::limits::BODY_READ_TIMEOUT):
/// its answer is then the 408 that says so, which is an answer too. A 408
/// for any other reason (a body held past [`REQUEST_TIMEOUT`]) fails the
/// test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_maximum_size_reviews_is_answered_not_reset() {
    let server = start().await;
    let body = review(
        json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "web"}),
        MAX_BODY_BYTES - 2048,
    );
    assert!(body.len() <= MAX_BODY_BYTES);
    let addr = server.addr;
    let clients = attack::on_a_niced_thread(move || async move {
        let mut flood = tokio::task::JoinSet::new();
        for client in 0..48 {
            let body = body.clone();
            // Half from the peer of the ordinary reviews: no peer is spared.
            let from = if client % 2 == 0 {
                other_peer()
            } else {
                ordinary_peer()
            };
            flood.spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..2 {
                    statuses
                        .push(attack::write_whole_then_read(from, addr, MUTATE_PATH, &body).await?);
                }
                Ok::<_, String>(statuses)
            });
        }
        flood.join_all().await
    });
    let results = ordinary_throughout(server.addr, "beside the flood", 60, clients).await;
    let mut seen = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    for done in results {
        match done {
            Ok(answers) => {
                for (status, said) in answers {
                    let slow_body = status == 408 && said.starts_with(SLOW_BODY);
                    let key = (status, if slow_body { SLOW_BODY } else { "" });
                    *seen.entry(key).or_insert(0) += 1;
                }
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} clients failed: {failures:?}",
        failures.len()
    );
    assert!(
        seen.keys()
            .all(|answer| [(200, ""), (429, ""), (408, SLOW_BODY)].contains(answer)),
        "answers: {seen:?}"
    );
    assert!(seen.contains_key(&(200, "")), "answers: {seen:?}");
}
