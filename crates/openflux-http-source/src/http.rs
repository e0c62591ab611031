//! The HTTP client of the fetches and one fetch: a GET that follows at most
//! [`MAX_REDIRECTS`] redirects, checks every hop (and a proxy) against the
//! network policy, sends credentials only to the origin of `spec.url`, and
//! reads the body up to a size limit within one overall timeout.
//!
//! Whatever that timeout, a fetch also fails when the server sends nothing
//! for the stall bound (`--fetch-stall-timeout`): waiting for the response
//! headers, or between two reads of the body. A server that holds the
//! connection open without sending cannot keep a worker for the whole
//! timeout of its source.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, LOCATION};
use reqwest::{Client, ClientBuilder, Url};

use crate::fetch::{judge, Auth, FetchError, Fetched, Validators, Verdict};
use crate::guard::{blocked_in, Guard};
use crate::redact::redact_url;
use crate::redirect::{is_redirect, next_url, same_origin, MAX_REDIRECTS};
use crate::transport::Transport;

/// How long establishing a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds the clients of the fetches, every one resolving names through the
/// [`Guard`] and following no redirect by itself.
pub struct Http {
    guard: Guard,
    /// The client of sources without TLS or proxy settings of their own.
    shared: Client,
    /// How long a fetch waits for the response, or for the next bytes of
    /// its body, before it fails.
    stall: Duration,
}

/// A client that cannot be built from a source's TLS or proxy settings.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the HTTP client: {0}")]
pub struct ClientError(String);

impl Http {
    /// `stall`: the stall bound, see the module documentation.
    pub fn new(guard: Guard, stall: Duration) -> Result<Self, ClientError> {
        let shared = builder(&guard)
            .build()
            .map_err(|e| ClientError(error_chain(&e)))?;
        Ok(Http {
            guard,
            shared,
            stall,
        })
    }

    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The client for a source's transport: the shared one, or one with its
    /// CA, client certificate and proxy. A proxy named by a source replaces
    /// the environment's (`HTTPS_PROXY`, ...) for it.
    pub fn client_for(&self, transport: &Transport) -> Result<Client, ClientError> {
        if transport.is_default() {
            return Ok(self.shared.clone());
        }
        let err = |e: reqwest::Error| ClientError(error_chain(&e));
        let mut b = builder(&self.guard);
        if let Some(tls) = &transport.tls {
            if let Some(ca) = &tls.ca {
                b = b.tls_certs_merge(reqwest::Certificate::from_pem_bundle(ca).map_err(err)?);
            }
            if let Some(identity) = &tls.identity {
                b = b.identity(reqwest::Identity::from_pem(identity).map_err(err)?);
            }
        }
        if let Some(proxy) = &transport.proxy {
            let mut p = reqwest::Proxy::all(proxy.url.clone()).map_err(err)?;
            if let Some((user, password)) = &proxy.basic {
                p = p.basic_auth(user, password);
            }
            b = b.proxy(p);
        }
        b.build().map_err(err)
    }

    /// One fetch, see the module documentation.
    pub async fn fetch(&self, client: &Client, request: Get<'_>) -> Result<Fetched, FetchError> {
        let deadline = tokio::time::Instant::now() + request.timeout;
        if let Some(proxy) = request.proxy {
            self.guard
                .check_url(proxy)
                .await
                .map_err(|b| FetchError::Blocked(format!("proxy {}: {b}", redact_url(proxy))))?;
        }
        let mut url = request.url.clone();
        let mut hops = 0;
        loop {
            let shown = redact_url(&url);
            self.guard
                .check_url(&url)
                .await
                .map_err(|b| FetchError::Blocked(format!("GET {shown}: {b}")))?;
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            if remaining.is_zero() {
                return Err(FetchError::Failed(format!(
                    "GET {shown}: timed out after {:?}",
                    request.timeout
                )));
            }
            let mut get = client.get(url.clone()).timeout(remaining);
            if same_origin(&url, request.url) {
                if let Some((user, password)) = &request.auth.basic {
                    get = get.basic_auth(user, Some(password));
                }
                for (name, value) in &request.auth.headers {
                    get = get.header(name.as_str(), value.as_str());
                }
            }
            for (name, value) in request.conditional {
                get = get.header(name, value.as_str());
            }
            let failed = |e: reqwest::Error| match blocked_in(&e) {
                Some(b) => FetchError::Blocked(format!("GET {shown}: {b}")),
                None => {
                    FetchError::Failed(format!("GET {shown}: {}", error_chain(&e.without_url())))
                }
            };
            let stalled = || {
                FetchError::Failed(format!(
                    "GET {shown}: no data from {} for {}; the server stalled",
                    url.host_str().unwrap_or_default(),
                    go_duration(self.stall)
                ))
            };
            let mut response = tokio::time::timeout(self.stall, get.send())
                .await
                .map_err(|_| stalled())?
                .map_err(failed)?;
            let status = response.status().as_u16();
            if is_redirect(status) {
                if hops == MAX_REDIRECTS {
                    return Err(FetchError::Failed(format!(
                        "GET {}: stopped after {MAX_REDIRECTS} redirects",
                        redact_url(request.url)
                    )));
                }
                let location = response
                    .headers()
                    .get(LOCATION)
                    .map(|v| v.to_str().unwrap_or("\u{fffd}"));
                url = next_url(&url, location)
                    .map_err(|why| FetchError::Failed(format!("GET {shown}: {why}")))?;
                hops += 1;
                continue;
            }
            match judge(status, !request.conditional.is_empty()) {
                Verdict::NotModified => return Ok(Fetched::NotModified),
                Verdict::Failed(why) => {
                    return Err(FetchError::Failed(format!("GET {shown}: {why}")))
                }
                Verdict::Download => {}
            }
            if response
                .content_length()
                .is_some_and(|n| n > request.max_size)
            {
                return Err(FetchError::TooLarge(request.max_size));
            }
            let validators = Validators::from_headers(response.headers());
            let mut bytes = Vec::new();
            loop {
                let chunk = tokio::time::timeout(self.stall, response.chunk())
                    .await
                    .map_err(|_| stalled())?
                    .map_err(failed)?;
                let Some(chunk) = chunk else { break };
                if (bytes.len() + chunk.len()) as u64 > request.max_size {
                    return Err(FetchError::TooLarge(request.max_size));
                }
                bytes.extend_from_slice(&chunk);
            }
            return Ok(Fetched::Body { bytes, validators });
        }
    }
}

/// What one fetch sends.
pub struct Get<'a> {
    /// `spec.url` without its userinfo (which is in `auth`).
    pub url: &'a Url,
    pub auth: &'a Auth,
    /// The proxy of `spec.proxySecretRef`, checked like a hop.
    pub proxy: Option<&'a Url>,
    pub conditional: &'a [(HeaderName, String)],
    /// For the whole fetch, redirects and body included.
    pub timeout: Duration,
    pub max_size: u64,
}

fn builder(guard: &Guard) -> ClientBuilder {
    Client::builder()
        .user_agent(concat!("openflux-http-source/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(guard.clone()))
}

/// A duration as Go writes it: `300ms`, `30s`, `1m30s`, `1h0m0s`.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, ms) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, ms) = (ms / 60_000, ms % 60_000);
    let seconds = if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        let text = format!("{}.{:03}", ms / 1000, ms % 1000);
        format!("{}s", text.trim_end_matches('0'))
    };
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

/// An error with its sources, so "error sending request" says why.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::net::{IpAddr, SocketAddr};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use axum::http::StatusCode;
    use axum::response::IntoResponse;

    use crate::guard::{Lookup, LookupFuture};
    use crate::netpolicy::NetworkPolicy;

    /// A resolver that answers from a script: each name's answers in turn,
    /// the last one repeated.
    #[derive(Default)]
    struct Scripted {
        answers: Mutex<HashMap<String, Vec<Vec<IpAddr>>>>,
        calls: AtomicUsize,
    }

    impl Scripted {
        fn answer(self, name: &str, answers: &[&[&str]]) -> Self {
            let parsed = answers
                .iter()
                .map(|a| a.iter().map(|ip| ip.parse().unwrap()).collect())
                .collect();
            self.answers.lock().unwrap().insert(name.into(), parsed);
            self
        }
    }

    impl Lookup for Scripted {
        fn lookup(&self, host: &str) -> LookupFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut answers = self.answers.lock().unwrap();
            let result = match answers.get_mut(host) {
                Some(list) if list.len() > 1 => Ok(list.remove(0)),
                Some(list) => Ok(list[0].clone()),
                None => Err(std::io::Error::other("no such host")),
            };
            Box::pin(async move { result })
        }
    }

    /// A server on `ip` that counts requests and answers `/ok` with a body
    /// and `/to/<url>` with a redirect there.
    async fn server(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let router = axum::Router::new().route(
            "/{*path}",
            axum::routing::get(
                move |axum::extract::Path(path): axum::extract::Path<String>| {
                    let counted = counted.clone();
                    async move {
                        counted.fetch_add(1, Ordering::SeqCst);
                        match path.strip_prefix("to/") {
                            Some(to) => {
                                (StatusCode::FOUND, [(LOCATION, to.to_string())]).into_response()
                            }
                            None => "kind: ConfigMap\n".into_response(),
                        }
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        (addr, hits)
    }

    fn http(allowed: &[&str], lookup: Arc<Scripted>) -> Http {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let allowed = allowed.iter().map(|s| s.parse().unwrap()).collect();
        let policy = NetworkPolicy::new(allowed, None);
        Http::new(Guard::with_lookup(policy, lookup), Duration::from_secs(30)).unwrap()
    }

    async fn get(http: &Http, url: &str) -> Result<Fetched, FetchError> {
        let url = Url::parse(url).unwrap();
        let client = http.client_for(&Transport::default()).unwrap();
        let auth = Auth::default();
        http.fetch(
            &client,
            Get {
                url: &url,
                auth: &auth,
                proxy: None,
                conditional: &[],
                timeout: Duration::from_secs(10),
                max_size: 1 << 20,
            },
        )
        .await
    }

    /// The client connects to the address the policy checked: a name the
    /// (scripted) resolver maps to the allowed loopback server is fetched.
    #[tokio::test]
    async fn connects_to_the_checked_address() {
        let (addr, hits) = server("127.0.0.1").await;
        let dns = Arc::new(Scripted::default().answer("content.example", &[&["127.0.0.1"]]));
        let http = http(&["127.0.0.1/32"], dns.clone());
        let fetched = get(&http, &format!("http://content.example:{}/ok", addr.port())).await;
        assert!(matches!(fetched, Ok(Fetched::Body { .. })), "{fetched:?}");
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        // Checked before the request, and again by the connection's resolver.
        assert_eq!(dns.calls.load(Ordering::SeqCst), 2);
    }

    /// DNS rebinding: the name first resolves to a public address (the
    /// check before the request passes), then to loopback when the client
    /// connects. The connection's resolver refuses it: nothing is sent.
    #[tokio::test]
    async fn a_rebinding_answer_is_refused_when_connecting() {
        let (addr, hits) = server("127.0.0.1").await;
        let dns = Arc::new(
            Scripted::default().answer("rebind.example", &[&["93.184.216.34"], &["127.0.0.1"]]),
        );
        let http = http(&[], dns);
        let fetched = get(&http, &format!("http://rebind.example:{}/ok", addr.port())).await;
        match fetched {
            Err(FetchError::Blocked(m)) => {
                assert!(m.contains("127.0.0.1") && m.contains("loopback"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(hits.load(Ordering::SeqCst), 0);
    }

    /// Every redirect hop is checked: a redirect from an allowed server to a
    /// refused address is not followed.
    #[tokio::test]
    async fn a_redirect_to_a_refused_address_is_not_followed() {
        let (allowed, hits) = server("127.0.0.1").await;
        let (refused, refused_hits) = server("127.0.0.2").await;
        let http = http(&["127.0.0.1/32"], Arc::new(Scripted::default()));
        let url = format!("http://{allowed}/to/http://{refused}/ok");
        match get(&http, &url).await {
            Err(FetchError::Blocked(m)) => assert!(m.contains("127.0.0.2"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        assert_eq!(refused_hits.load(Ordering::SeqCst), 0);
        // Addresses written in other forms are the same addresses.
        for form in [
            "http://2130706434/ok",
            "http://0x7f.0.0.2/ok",
            "http://[::ffff:127.0.0.2]/ok",
        ] {
            match get(&http, form).await {
                Err(FetchError::Blocked(m)) => assert!(m.contains("loopback"), "{form}: {m}"),
                other => panic!("{form}: {other:?}"),
            }
        }
    }

    #[test]
    fn writes_durations_as_go_does() {
        for (d, text) in [
            (Duration::from_millis(300), "300ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
        ] {
            assert_eq!(go_duration(d), text);
        }
    }

    /// How a tarpit answers.
    #[derive(Clone, Copy)]
    enum Tarpit {
        /// Reads the request and never answers.
        Silent,
        /// Answers the headers and a first byte of the body, then one
        /// byte every few seconds.
        Drip,
    }

    /// A server on 127.0.0.1 that holds every connection open as `mode`
    /// says, for as long as the client stays.
    async fn tarpit(mode: Tarpit) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    if let Tarpit::Silent = mode {
                        // Holds the connection until the client leaves.
                        let _ = conn.read(&mut buf).await;
                        return;
                    }
                    let head = "HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n";
                    if conn.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    loop {
                        if conn.write_all(b"k").await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                });
            }
        });
        addr
    }

    /// A server that stops sending fails the fetch after the stall bound,
    /// not after the source's (much longer) timeout, and says so.
    #[tokio::test]
    async fn a_stalled_server_fails_the_fetch_after_the_stall_bound() {
        let dns = Arc::new(Scripted::default());
        let http = Http {
            stall: Duration::from_millis(300),
            ..http(&["127.0.0.1/32"], dns)
        };
        for mode in [Tarpit::Drip, Tarpit::Silent] {
            let addr = tarpit(mode).await;
            let url = Url::parse(&format!("http://{addr}/slow.tgz")).unwrap();
            let client = http.client_for(&Transport::default()).unwrap();
            let auth = Auth::default();
            let fetch = http.fetch(
                &client,
                Get {
                    url: &url,
                    auth: &auth,
                    proxy: None,
                    conditional: &[],
                    timeout: Duration::from_secs(60),
                    max_size: 1 << 20,
                },
            );
            let fetched = tokio::time::timeout(Duration::from_secs(5), fetch)
                .await
                .expect("the fetch waits out the source's timeout: no stall bound");
            match fetched {
                Err(FetchError::Failed(m)) => assert!(
                    m.starts_with(&format!("GET http://{addr}/slow.tgz: "))
                        && m.contains("no data from 127.0.0.1 for 300ms; the server stalled"),
                    "{m}"
                ),
                other => panic!("{other:?}"),
            }
        }
    }
}
