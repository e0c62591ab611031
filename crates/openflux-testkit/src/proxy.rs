//! A proxy between one openflux process and the API server, for races a
//! test cannot make with a healthy network: it sees every request of that
//! process, and on the test's word holds the answers to its writes (so a
//! reconcile's chain of writes stalls between writes), holds some writes
//! before they are sent on, or stops passing the Lease traffic (as a
//! network that cuts one replica's renewals would).
//!
//! openflux talks plain HTTP to the proxy on loopback; the proxy sends
//! each request on over TLS as the identity of the kubeconfig it was given
//! (the same client certificate or token openflux would use), so the API
//! server authenticates, authorizes and admits it as openflux's own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::http::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::config::{KubeConfigOptions, Kubeconfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// One write (POST, PUT, PATCH, DELETE) the proxy passed on, Lease traffic
/// aside.
#[derive(Clone, Debug)]
pub struct Write {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// When the proxy sent it on to the API server.
    pub sent: Instant,
    /// When the API server's answer came (before any hold).
    pub answered: Option<Instant>,
    pub status: Option<u16>,
}

#[derive(Default)]
struct Rules {
    /// How long the answer to each write is held once it came.
    delay_answers: Duration,
    /// Writes whose path contains one of these are held before they are
    /// sent on, until [`ApiProxy::release`].
    hold_before_sending: Vec<String>,
}

struct State {
    upstream: kube::Client,
    rules: Mutex<Rules>,
    leases_cut: AtomicBool,
    /// Writes held before sending; bumped on each.
    held: tokio::sync::watch::Sender<usize>,
    /// Bumped on each release.
    released: tokio::sync::watch::Sender<u64>,
    writes: Mutex<Vec<Write>>,
}

/// A running proxy; stops (with every connection) on drop.
pub struct ApiProxy {
    pub addr: SocketAddr,
    kubeconfig: PathBuf,
    state: Arc<State>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

impl ApiProxy {
    /// Starts a proxy that acts as the identity of `kubeconfig` towards the
    /// API server.
    pub async fn start(kubeconfig: &Path) -> Self {
        let kc = Kubeconfig::read_from(kubeconfig)
            .unwrap_or_else(|e| panic!("reading {}: {e}", kubeconfig.display()));
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("a client configuration from the kubeconfig");
        let upstream = kube::Client::try_from(config).expect("a client for the API server");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(State {
            upstream,
            rules: Mutex::new(Rules::default()),
            leases_cut: AtomicBool::new(false),
            held: tokio::sync::watch::channel(0).0,
            released: tokio::sync::watch::channel(0).0,
            writes: Mutex::new(Vec::new()),
        });
        let server = tokio::spawn(serve(listener, state.clone()));
        let kubeconfig =
            std::env::temp_dir().join(format!("{}.kubeconfig", crate::unique_name("api-proxy")));
        std::fs::write(&kubeconfig, plain_kubeconfig(addr)).expect("writing the proxy kubeconfig");
        ApiProxy {
            addr,
            kubeconfig,
            state,
            server,
        }
    }

    /// The kubeconfig a process uses to talk through this proxy.
    pub fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig.clone()
    }

    /// Holds the answer to each later write for `delay` once it came: the
    /// write is applied at once, its sender learns of it `delay` later.
    pub fn delay_write_answers(&self, delay: Duration) {
        self.state.rules.lock().unwrap().delay_answers = delay;
    }

    /// From now on, Lease requests are never passed on nor answered: the
    /// process can no longer renew its Lease, and its other requests go
    /// through as before.
    pub fn cut_leases(&self) {
        self.state.leases_cut.store(true, Ordering::SeqCst);
    }

    /// Holds each later write whose path contains `path_part` before it is
    /// sent on, until [`Self::release`].
    pub fn hold_writes_to(&self, path_part: &str) {
        self.hold_writes_to_any(&[path_part]);
    }

    /// [`Self::hold_writes_to`] for writes whose path contains any of
    /// `path_parts`.
    pub fn hold_writes_to_any(&self, path_parts: &[&str]) {
        self.state.rules.lock().unwrap().hold_before_sending =
            path_parts.iter().map(|p| p.to_string()).collect();
    }

    /// Writes held by [`Self::hold_writes_to`] so far.
    pub fn held(&self) -> usize {
        *self.state.held.borrow()
    }

    /// Sends the held writes on and holds no more.
    pub fn release(&self) {
        self.state.rules.lock().unwrap().hold_before_sending.clear();
        self.state.released.send_modify(|n| *n += 1);
    }

    /// Every write passed on so far, in the order they were sent.
    pub fn writes(&self) -> Vec<Write> {
        self.state.writes.lock().unwrap().clone()
    }
}

/// A kubeconfig naming the proxy, with no credentials of its own.
fn plain_kubeconfig(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: proxy\n  cluster:\n    server: http://{addr}\n\
         users:\n- name: proxy\n  user: {{}}\n\
         contexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\n\
         current-context: proxy\n"
    )
}

async fn serve(listener: tokio::net::TcpListener, state: Arc<State>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        let state = state.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| forward(state.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn answer(status: StatusCode, text: String) -> Response<Body> {
    let mut res = Response::new(full(Bytes::from(text)));
    *res.status_mut() = status;
    res
}

async fn forward(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, BoxError> {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let lease = path.starts_with("/apis/coordination.k8s.io/");
    if lease && state.leases_cut.load(Ordering::SeqCst) {
        // Neither passed on nor answered: the caller's own timeout decides.
        std::future::pending::<()>().await;
    }
    let write = is_write(&parts.method) && !lease;
    if write {
        let hold = state.rules.lock().unwrap().hold_before_sending.clone();
        if hold.iter().any(|part| path.contains(part.as_str())) {
            let mut released = state.released.subscribe();
            state.held.send_modify(|n| *n += 1);
            let _ = released.changed().await;
        }
    }
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Ok(answer(StatusCode::BAD_REQUEST, e.to_string())),
    };
    let mut up = Request::builder().method(parts.method.clone()).uri(&path);
    for (name, value) in &parts.headers {
        if !matches!(
            *name,
            header::HOST | header::CONTENT_LENGTH | header::CONNECTION | header::TRANSFER_ENCODING
        ) {
            up = up.header(name, value);
        }
    }
    let up = up.body(kube::client::Body::from(bytes))?;
    if !write {
        // Reads and watches stream through as they come.
        let res = match state.upstream.send(up).await {
            Ok(res) => res,
            Err(e) => return Ok(answer(StatusCode::BAD_GATEWAY, e.to_string())),
        };
        let (mut head, body) = res.into_parts();
        head.headers.remove(header::CONTENT_LENGTH);
        head.headers.remove(header::TRANSFER_ENCODING);
        let body = body.map_err(BoxError::from).boxed_unsync();
        return Ok(Response::from_parts(head, body));
    }
    let index = {
        let mut writes = state.writes.lock().unwrap();
        writes.push(Write {
            method: parts.method.to_string(),
            path: path.clone(),
            sent: Instant::now(),
            answered: None,
            status: None,
        });
        writes.len() - 1
    };
    // A write once sent on is seen through to the API server's answer even
    // when its sender gives up on it (a reconcile aborted mid-request drops
    // its connection): the API server may well apply it, and when it
    // answered is what a test of fencing needs to know.
    let exchange = tokio::spawn({
        let state = state.clone();
        async move {
            let res = match state.upstream.send(up).await {
                Ok(res) => res,
                Err(e) => return Err(e.to_string()),
            };
            let (mut head, body) = res.into_parts();
            head.headers.remove(header::CONTENT_LENGTH);
            head.headers.remove(header::TRANSFER_ENCODING);
            let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            let mut writes = state.writes.lock().unwrap();
            let w = &mut writes[index];
            w.answered = Some(Instant::now());
            w.status = Some(head.status.as_u16());
            Ok((head, bytes))
        }
    });
    let (head, bytes) = match exchange.await {
        Ok(Ok(answered)) => answered,
        Ok(Err(e)) => return Ok(answer(StatusCode::BAD_GATEWAY, e)),
        Err(e) => return Ok(answer(StatusCode::BAD_GATEWAY, e.to_string())),
    };
    let delay = state.rules.lock().unwrap().delay_answers;
    tokio::time::sleep(delay).await;
    Ok(Response::from_parts(head, full(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// An API server stand-in on loopback that answers every request
    /// `after` it came, and the kubeconfig that names it.
    async fn slow_upstream(
        after: Duration,
    ) -> (tempfile::NamedTempFile, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req| async move {
                        tokio::time::sleep(after).await;
                        Ok::<_, std::convert::Infallible>(Response::new(full(Bytes::from("{}"))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let mut kubeconfig = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut kubeconfig, plain_kubeconfig(addr).as_bytes()).unwrap();
        (kubeconfig, server)
    }

    #[tokio::test]
    async fn a_write_its_sender_gave_up_on_is_seen_through_to_the_answer() {
        let (upstream, server) = slow_upstream(Duration::from_millis(300)).await;
        let proxy = ApiProxy::start(upstream.path()).await;
        let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        conn.write_all(
            b"POST /api/v1/namespaces/t/configmaps HTTP/1.1\r\nhost: x\r\n\
              content-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while proxy.writes().is_empty() {
            assert!(
                Instant::now() < deadline,
                "the proxy never sent the write on"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The sender gives up while the API server still works on it.
        drop(conn);
        while proxy.writes()[0].answered.is_none() {
            assert!(
                Instant::now() < deadline,
                "a write sent on was never seen answered once its sender left: {:?}",
                proxy.writes()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(proxy.writes()[0].status, Some(200));
        server.abort();
    }
}
