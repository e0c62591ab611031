//! Clients that misbehave, for the tests of the webhook's bounds: bodies
//! trickled a byte at a time, maximum-size reviews written whole before
//! the answer is read, connections that keep their place with a request
//! now and then. They connect from a loopback address of their own
//! (127.0.0.2: one peer, as a Pod is) and run on a thread of their own at
//! a lower CPU priority, as clients on other machines would not take the
//! webhook's CPU; what the tests measure is the server's fairness, not
//! the machine's.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::accept_any::AcceptAny;

/// The address the misbehaving clients come from.
pub fn other_peer() -> IpAddr {
    IpAddr::from([127, 0, 0, 2])
}

/// The address of another misbehaving client (a second Pod).
pub fn third_peer() -> IpAddr {
    IpAddr::from([127, 0, 0, 3])
}

/// The address ordinary clients come from (as the API server's do).
pub fn ordinary_peer() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}

/// A TLS connection to `addr` from the local address `from`, with a send
/// buffer of what a client across a network has in flight (not the
/// megabytes a loopback socket buffers): a body the server does not read
/// stays unwritten.
pub async fn tls_from(from: IpAddr, addr: SocketAddr) -> std::io::Result<TlsStream<TcpStream>> {
    let socket = TcpSocket::new_v4()?;
    socket.set_send_buffer_size(64 * 1024)?;
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(addr).await?;
    tcp.set_nodelay(true)?;
    let config = rustls::ClientConfig::builder_with_provider(openflux::certs::provider())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny))
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Runs `make()`'s future on a thread of its own, at a lower CPU priority
/// (nice 10), on a runtime of its own; its output arrives on the receiver.
pub fn on_a_niced_thread<F, T>(
    make: impl FnOnce() -> F + Send + 'static,
) -> tokio::sync::oneshot::Receiver<T>
where
    F: Future<Output = T>,
    T: Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions; setpriority only reads its
        // arguments and reports failure through its return value (a
        // failure leaves the priority as it was, which is harmless here).
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 10);
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the clients");
        let _ = tx.send(runtime.block_on(make()));
    });
    rx
}

/// Sends the head of a POST to `path` declaring `length` bytes and one
/// byte of its body, then a byte a second until the server answers or
/// closes. `started` is told once the head is sent. How long the server
/// held it, and what it answered (empty when it closed without a word).
pub async fn trickle(
    from: IpAddr,
    addr: SocketAddr,
    path: &str,
    length: usize,
    started: tokio::sync::mpsc::Sender<()>,
) -> Result<(Duration, String), String> {
    let mut tls = tls_from(from, addr)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n{{"
    );
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tls.flush().await.map_err(|e| e.to_string())?;
    let _ = started.send(()).await;
    let began = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(Duration::from_secs(1), tls.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {
                if tls.write_all(b" ").await.is_err() || tls.flush().await.is_err() {
                    break;
                }
            }
        }
        if began.elapsed() > Duration::from_secs(30) {
            return Err("still open after 30 s".to_string());
        }
    }
    Ok((
        began.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    ))
}

/// Posts `body` to `path` as a simple client does: the whole request
/// written, then the answer read to its end (the request asks to close).
/// The status and the answer's body, or what failed: a reset while
/// writing is what the API server counts as a failed call, not an answer
/// to retry.
pub async fn write_whole_then_read(
    from: IpAddr,
    addr: SocketAddr,
    path: &str,
    body: &[u8],
) -> Result<(u16, String), String> {
    let mut tls = tls_from(from, addr)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("writing the head: {e}"))?;
    tls.write_all(body)
        .await
        .map_err(|e| format!("writing the body: {e}"))?;
    tls.flush()
        .await
        .map_err(|e| format!("writing the body: {e}"))?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut answer)).await;
    match read {
        Err(_) => return Err("no answer within 30 s".into()),
        // A peer that closes without close_notify after a whole answer is
        // fine; what counts is that the answer arrived.
        Ok(Err(e)) if answer.is_empty() => return Err(format!("reading the answer: {e}")),
        Ok(_) => {}
    }
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            let start: String = text.chars().take(64).collect();
            format!("not an HTTP answer: {start:?}")
        })?;
    let said = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Ok((status, said.to_string()))
}

/// An HTTP/1.1 client on a connection from `from`.
pub async fn client_from(
    from: IpAddr,
    addr: SocketAddr,
) -> std::io::Result<hyper::client::conn::http1::SendRequest<axum::body::Body>> {
    let tls = tls_from(from, addr).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Posts `body` to `path` on `sender`: the status and the answer's bytes.
pub async fn post(
    sender: &mut hyper::client::conn::http1::SendRequest<axum::body::Body>,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Vec<u8>), String> {
    let request = hyper::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(axum::body::Body::from(body))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("sending: {e:?}"))?;
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(axum::body::Body::new(response.into_body()), usize::MAX)
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    Ok((status, bytes.to_vec()))
}
