//! One tenant cannot stall the shared controller: a server that stops
//! sending fails a fetch after the stall bound (`--fetch-stall-timeout`),
//! and the sources of one namespace hold at most their share of the
//! workers (`--concurrent`), so another namespace's source keeps updating
//! while a tarpit holds its own.

use super::*;

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The controller's workers, and one namespace's share of them (half).
const WORKERS: usize = 4;
const SHARE: usize = 2;
/// The stall bound the controller runs with here.
const STALL: &str = "5s";
/// How often the tarpit sends a byte: more often than the stall bound, so
/// only the sources' timeout (10m) would end those fetches.
const DRIP: Duration = Duration::from_secs(2);

/// A server on 127.0.0.1 that answers `/silent` with nothing at all, and
/// any other path with headers, then a byte every [`DRIP`] for as long as
/// the client stays. Counts the dripping connections open now and at most.
struct Tarpit {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Tarpit {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("binding the tarpit");
        let addr = listener.local_addr().expect("tarpit address");
        let (open, most): (Arc<AtomicUsize>, Arc<AtomicUsize>) = Default::default();
        let (counting, max) = (open.clone(), most.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(hold(conn, counting.clone(), max.clone()));
            }
        });
        Tarpit {
            addr,
            open,
            most,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

impl Drop for Tarpit {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn hold(mut conn: tokio::net::TcpStream, open: Arc<AtomicUsize>, most: Arc<AtomicUsize>) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    if request.starts_with(b"GET /silent ") {
        // Nothing, until the client leaves.
        let _ = conn.read(&mut buf).await;
        return;
    }
    let head = "HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n";
    if conn.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let now = open.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    let mut tick = tokio::time::interval(DRIP);
    loop {
        tokio::select! {
            read = conn.read(&mut buf) => {
                if matches!(read, Ok(0) | Err(_)) {
                    break;
                }
            }
            _ = tick.tick() => {
                if conn.write_all(b"k").await.is_err() {
                    break;
                }
            }
        }
    }
    open.fetch_sub(1, Ordering::SeqCst);
}

async fn apply_source(env: &Env, ns: &str, name: &str, selector: &str, spec: serde_json::Value) {
    env.apply(&json!({
        "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {"e2e.openflux.dev/fairness": selector},
        },
        "spec": spec,
    }))
    .await
    .expect("applying the HttpSource");
}

async fn artifact_revision(env: &Env, ns: &str, name: &str) -> Option<String> {
    let artifact = env.get(ARTIFACT, "Artifact", Some(ns), name).await.ok()??;
    field(&artifact, "/spec/revision")?
        .as_str()
        .map(str::to_string)
}

/// Six sources of one namespace point at a tarpit that drips a byte every
/// few seconds (each fetch would hold its worker for the source's 10m
/// timeout); a source of another namespace is still fetched, and follows
/// its remote within its interval. One more tarpit source, whose server
/// sends nothing, fails after the stall bound and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tarpit_in_one_namespace_does_not_stall_another() {
    let env = cluster().await;
    install_crds(&env).await;
    let tarpit_ns = env.namespace("hs-tarpit").await;
    let apps_ns = env.namespace("hs-fair").await;
    // Only this test's sources: other tests' controllers own theirs.
    let selector = tarpit_ns.name().to_string();
    let tarpit = Tarpit::start().await;
    let content = ContentServer::start().await;
    let launch = Launch {
        watch_all: true,
        ..Launch::new(
            tarpit_ns.name(),
            &[
                format!("--concurrent={WORKERS}"),
                format!("--fetch-stall-timeout={STALL}"),
                format!("--watch-label-selector=e2e.openflux.dev/fairness={selector}"),
            ],
        )
    };
    // Every namespace is watched: as the cluster admin (the shipped
    // ClusterRole is proven by the single-namespace tests).
    let controller = Controller::launch(&admin_kubeconfig(&env), tarpit_ns.name(), launch).await;

    // A server that sends nothing: the fetch fails after the stall bound,
    // whatever the source's timeout, and the condition and Event say why.
    apply_source(
        &env,
        tarpit_ns.name(),
        "silent",
        &selector,
        json!({"url": tarpit.url("silent"), "interval": "1m", "timeout": "10m"}),
    )
    .await;
    let expected = format!("no data from 127.0.0.1 for {STALL}; the server stalled");
    let message = wait_for("the silent source to fail as stalled", TIMEOUT, || async {
        let obj = env
            .get(HTTP_SOURCE, "HttpSource", Some(tarpit_ns.name()), "silent")
            .await
            .ok()??;
        let (status, reason, message) = ready_condition(&obj)?;
        (status == "False" && reason == "FetchFailed").then_some(message)
    })
    .await;
    assert!(message.contains(&expected), "{message}");
    wait_for("a FetchFailed Event naming the stall", TIMEOUT, || async {
        let events: Api<K8sEvent> = Api::namespaced(env.client.clone(), tarpit_ns.name());
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("silent")
                    && e.reason.as_deref() == Some("FetchFailed")
                    && e.note.as_deref().is_some_and(|n| n.contains(&expected))
            })
            .then_some(())
    })
    .await;
    env.delete_object(HTTP_SOURCE, "HttpSource", tarpit_ns.name(), "silent")
        .await;

    // Six dripping sources: their namespace's share of the workers is held.
    for i in 0..6 {
        apply_source(
            &env,
            tarpit_ns.name(),
            &format!("tarpit-{i}"),
            &selector,
            json!({"url": tarpit.url(&format!("drip-{i}.tgz")), "interval": "1m", "timeout": "10m"}),
        )
        .await;
    }
    wait_for(
        "the tarpit to hold its share of the workers",
        TIMEOUT,
        || async { (tarpit.open() >= SHARE).then_some(()) },
    )
    .await;

    // Another namespace's source is fetched, and updated within its interval.
    let path = "app.tgz";
    content
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_ONE)], 0, 0));
    apply_source(
        &env,
        apps_ns.name(),
        "app",
        &selector,
        json!({"url": content.url(path), "interval": "2s"}),
    )
    .await;
    let first = wait_for(
        "the other namespace's Artifact while the tarpit holds its share",
        Duration::from_secs(30),
        || artifact_revision(&env, apps_ns.name(), "app"),
    )
    .await;
    content
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_TWO)], 0, 0));
    let second = wait_for(
        "the other namespace's Artifact to follow its remote",
        Duration::from_secs(20),
        || async {
            artifact_revision(&env, apps_ns.name(), "app")
                .await
                .filter(|r| *r != first)
        },
    )
    .await;
    assert_ne!(first, second);

    // All the while the tarpit held its share and no more, and still does.
    assert_eq!(
        tarpit.most(),
        SHARE,
        "the tarpit's namespace held more than its share"
    );
    assert_eq!(tarpit.open(), SHARE);
    drop(controller);
}
