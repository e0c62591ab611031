//! What a fetch sends and what its answer means, as plain functions:
//! credentials from a Secret, the request fingerprint, conditional requests
//! and the verdict on a response status (the fetch itself is `http`'s).
//!
//! A fetch sends `If-None-Match`/`If-Modified-Since` only when the validators
//! it remembers belong to the artifact that is published now and whose file
//! is in storage: a `304 Not Modified` then keeps that artifact without a
//! download. Anything that changes the request or what is built from the
//! response (URL, credentials, TLS and proxy settings, ignore patterns,
//! expected digest) changes the request fingerprint and so forces a full
//! download.

use std::collections::BTreeMap;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use crate::transport::Transport;

/// Credentials read from the Secret of `spec.secretRef`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// Basic auth from the keys `username` and `password`.
    pub basic: Option<(String, String)>,
    /// Headers from the key `headers`, one `Name: value` a line.
    pub headers: Vec<(String, String)>,
}

/// Reads credentials from a Secret's data. Either `username` and `password`
/// (basic auth), or `headers`, or both; a Secret with neither is an error,
/// as is a malformed header line.
pub fn auth_from_secret(data: &BTreeMap<String, Vec<u8>>) -> Result<Auth, String> {
    let text = |key: &str| -> Result<Option<String>, String> {
        data.get(key)
            .map(|v| String::from_utf8(v.clone()).map_err(|_| format!("key {key:?} is not UTF-8")))
            .transpose()
    };
    let basic = match (text("username")?, text("password")?) {
        (Some(u), Some(p)) => Some((u, p)),
        (None, None) => None,
        _ => return Err("keys 'username' and 'password' must be set together".into()),
    };
    let mut headers = Vec::new();
    if let Some(lines) = text("headers")? {
        for (n, line) in lines.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| format!("line {} of key 'headers' is not 'Name: value'", n + 1))?;
            let (name, value) = (name.trim(), value.trim());
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("line {} of key 'headers': invalid header name", n + 1))?;
            HeaderValue::from_str(value)
                .map_err(|_| format!("line {} of key 'headers': invalid header value", n + 1))?;
            headers.push((name.to_string(), value.to_string()));
        }
    }
    if basic.is_none() && headers.is_empty() {
        return Err("secret has neither 'username'/'password' nor 'headers'".into());
    }
    Ok(Auth { basic, headers })
}

/// A digest of everything that shapes a request or what is built from its
/// response. Validators remembered under another fingerprint are not used.
pub fn fingerprint(
    url: &str,
    auth: &Auth,
    transport: &Transport,
    ignore: Option<&str>,
    expected_digest: Option<&str>,
) -> String {
    let mut h = Sha256::new();
    let mut field = |s: &[u8]| {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s);
    };
    field(url.as_bytes());
    if let Some((u, p)) = &auth.basic {
        field(u.as_bytes());
        field(p.as_bytes());
    }
    for (n, v) in &auth.headers {
        field(n.as_bytes());
        field(v.as_bytes());
    }
    for f in transport.fingerprint_fields() {
        field(f);
    }
    field(ignore.unwrap_or("\0default").as_bytes());
    field(expected_digest.unwrap_or("").as_bytes());
    hex::encode(h.finalize())
}

/// HTTP cache validators of a response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Validators {
    pub etag: Option<String>,
    pub last_modified: Option<String>,
}

impl Validators {
    /// Reads `ETag` and `Last-Modified` from response headers.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let get = |name: reqwest::header::HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        Validators {
            etag: get(reqwest::header::ETAG),
            last_modified: get(reqwest::header::LAST_MODIFIED),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.etag.is_none() && self.last_modified.is_none()
    }
}

/// The validators of the response an artifact was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    pub fingerprint: String,
    pub validators: Validators,
    /// Digest of the artifact built from that response.
    pub digest: String,
}

/// The conditional headers to send, if any: only when the remembered
/// validators were taken under the same fingerprint, for the artifact that
/// is published (`published_digest`) and still in storage.
pub fn conditional_headers(
    remembered: Option<&Remembered>,
    fingerprint: &str,
    published_digest: Option<&str>,
    stored: bool,
) -> Vec<(HeaderName, String)> {
    let Some(r) = remembered else {
        return Vec::new();
    };
    if !stored || r.fingerprint != fingerprint || published_digest != Some(r.digest.as_str()) {
        return Vec::new();
    }
    let mut headers = Vec::new();
    if let Some(etag) = &r.validators.etag {
        headers.push((reqwest::header::IF_NONE_MATCH, etag.clone()));
    }
    if let Some(lm) = &r.validators.last_modified {
        headers.push((reqwest::header::IF_MODIFIED_SINCE, lm.clone()));
    }
    headers
}

/// What to make of a response status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the published artifact; nothing was downloaded.
    NotModified,
    /// Read the body.
    Download,
    /// The fetch failed.
    Failed(String),
}

/// Judges a response status. A 304 counts only when a conditional request
/// was sent; otherwise it is an error like any other non-2xx status.
pub fn judge(status: u16, conditional: bool) -> Verdict {
    match status {
        304 if conditional => Verdict::NotModified,
        200..=299 => Verdict::Download,
        s => Verdict::Failed(format!(
            "HTTP status {s}{}",
            reqwest::StatusCode::from_u16(s)
                .ok()
                .and_then(|c| c.canonical_reason())
                .map(|r| format!(" {r}"))
                .unwrap_or_default()
        )),
    }
}

/// The result of a fetch.
#[derive(Debug)]
pub enum Fetched {
    NotModified,
    Body {
        bytes: Vec<u8>,
        validators: Validators,
    },
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Network error, timeout or HTTP error status.
    #[error("{0}")]
    Failed(String),
    /// The body is larger than the limit.
    #[error("download exceeds the maximum size of {0} bytes")]
    TooLarge(u64),
    /// The URL, a redirect or the proxy is at an address the network
    /// policy refuses.
    #[error("{0}")]
    Blocked(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn reads_basic_auth_and_headers() {
        let auth = auth_from_secret(&data(&[("username", "u"), ("password", "p")])).unwrap();
        assert_eq!(auth.basic, Some(("u".into(), "p".into())));
        assert!(auth.headers.is_empty());

        let auth = auth_from_secret(&data(&[(
            "headers",
            "Authorization: Bearer abc\n\nX-Api-Key:  k:1 \n",
        )]))
        .unwrap();
        assert_eq!(
            auth.headers,
            [
                ("Authorization".to_string(), "Bearer abc".to_string()),
                ("X-Api-Key".to_string(), "k:1".to_string())
            ]
        );
    }

    #[test]
    fn rejects_unusable_secrets() {
        assert!(auth_from_secret(&data(&[])).is_err());
        assert!(auth_from_secret(&data(&[("username", "u")])).is_err());
        assert!(auth_from_secret(&data(&[("headers", "no colon here")])).is_err());
        assert!(auth_from_secret(&data(&[("headers", "Bad Name: v")])).is_err());
        assert!(auth_from_secret(&data(&[("headers", "X: a\nb")])).is_err());
    }

    fn remembered() -> Remembered {
        Remembered {
            fingerprint: "f".into(),
            validators: Validators {
                etag: Some("\"v1\"".into()),
                last_modified: Some("Wed, 21 Oct 2015 07:28:00 GMT".into()),
            },
            digest: "sha256:aa".into(),
        }
    }

    #[test]
    fn sends_validators_for_the_published_artifact() {
        let r = remembered();
        let headers = conditional_headers(Some(&r), "f", Some("sha256:aa"), true);
        assert_eq!(
            headers,
            [
                (reqwest::header::IF_NONE_MATCH, "\"v1\"".to_string()),
                (
                    reqwest::header::IF_MODIFIED_SINCE,
                    "Wed, 21 Oct 2015 07:28:00 GMT".to_string()
                )
            ]
        );
    }

    #[test]
    fn downloads_in_full_when_validators_do_not_apply() {
        let r = remembered();
        // Nothing remembered (first fetch, or after a restart).
        assert!(conditional_headers(None, "f", Some("sha256:aa"), true).is_empty());
        // The request or the build changed.
        assert!(conditional_headers(Some(&r), "g", Some("sha256:aa"), true).is_empty());
        // Another artifact is published (e.g. the last build was rejected).
        assert!(conditional_headers(Some(&r), "f", Some("sha256:bb"), true).is_empty());
        assert!(conditional_headers(Some(&r), "f", None, true).is_empty());
        // The file is gone from storage: a 304 could not restore it.
        assert!(conditional_headers(Some(&r), "f", Some("sha256:aa"), false).is_empty());
        // The server sent no validators.
        let bare = Remembered {
            validators: Validators::default(),
            ..r
        };
        assert!(conditional_headers(Some(&bare), "f", Some("sha256:aa"), true).is_empty());
    }

    #[test]
    fn judges_statuses() {
        assert_eq!(judge(304, true), Verdict::NotModified);
        assert!(matches!(judge(304, false), Verdict::Failed(_)));
        assert_eq!(judge(200, true), Verdict::Download);
        assert_eq!(judge(203, false), Verdict::Download);
        assert_eq!(
            judge(404, false),
            Verdict::Failed("HTTP status 404 Not Found".into())
        );
        assert!(matches!(judge(500, true), Verdict::Failed(m) if m.contains("500")));
    }

    #[test]
    fn fingerprint_changes_with_what_shapes_the_artifact() {
        let auth = Auth::default();
        let t = Transport::default();
        let base = fingerprint("http://a/x", &auth, &t, None, None);
        assert_eq!(base, fingerprint("http://a/x", &auth, &t, None, None));
        assert_ne!(base, fingerprint("http://a/y", &auth, &t, None, None));
        assert_ne!(base, fingerprint("http://a/x", &auth, &t, Some(""), None));
        assert_ne!(
            base,
            fingerprint("http://a/x", &auth, &t, None, Some("sha256:00"))
        );
        let basic = Auth {
            basic: Some(("u".into(), "p".into())),
            headers: vec![],
        };
        assert_ne!(base, fingerprint("http://a/x", &basic, &t, None, None));
        let proxied = Transport {
            proxy: Some(crate::transport::ProxyConfig {
                url: reqwest::Url::parse("http://proxy:3128").unwrap(),
                basic: None,
            }),
            tls: None,
        };
        assert_ne!(base, fingerprint("http://a/x", &auth, &proxied, None, None));
    }
}
