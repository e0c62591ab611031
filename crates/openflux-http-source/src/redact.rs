//! URLs with their credentials masked, for every place a URL is shown: logs,
//! the status (conditions), Kubernetes Events and notifications.
//!
//! The userinfo becomes `***` and so does the value of every query
//! parameter whose name looks like a credential (`token`, `sig`,
//! `X-Amz-Signature`, `api_key`, `password`, ...).

use reqwest::Url;

/// The mask.
pub const MASK: &str = "***";

/// Substrings of query parameter names whose values are masked.
const SECRET_PARAMS: &[&str] = &[
    "token",
    "sig",
    "key",
    "secret",
    "pass",
    "pwd",
    "auth",
    "credential",
    "session",
];

fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|s| name.contains(s))
}

/// `url` with its credentials masked. A string that does not parse as a
/// URL still loses anything between `://` and an `@`.
pub fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(u) => redact_url(&u),
        Err(_) => redact_unparsed(url),
    }
}

/// A parsed URL with its credentials masked.
pub fn redact_url(url: &Url) -> String {
    let mut u = url.clone();
    if !u.username().is_empty() || u.password().is_some() {
        let _ = u.set_password(None);
        let _ = u.set_username(MASK);
    }
    if let Some(query) = u.query() {
        let masked: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_secret_param(name) => format!("{name}={MASK}"),
                _ => pair.to_string(),
            })
            .collect();
        u.set_query(Some(&masked.join("&")));
    }
    u.to_string()
}

fn redact_unparsed(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    match url[start..authority_end].rfind('@') {
        Some(at) => format!("{}{MASK}{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_userinfo() {
        assert_eq!(
            redact("https://user:s3cret@example.com/a.tgz"),
            "https://***@example.com/a.tgz"
        );
        assert_eq!(
            redact("https://ghp_token@example.com/a.tgz"),
            "https://***@example.com/a.tgz"
        );
        assert_eq!(
            redact("http://example.com:8080/a.tgz"),
            "http://example.com:8080/a.tgz"
        );
    }

    #[test]
    fn masks_credential_like_query_parameters() {
        assert_eq!(
            redact("https://b.s3.amazonaws.com/a.tgz?X-Amz-Credential=AKIA&X-Amz-Signature=abc&versionId=3"),
            "https://b.s3.amazonaws.com/a.tgz?X-Amz-Credential=***&X-Amz-Signature=***&versionId=3"
        );
        assert_eq!(
            redact("https://a.blob.core.windows.net/c/a.tgz?sv=2020&sig=xyz%3D"),
            "https://a.blob.core.windows.net/c/a.tgz?sv=2020&sig=***"
        );
        assert_eq!(
            redact("https://e.com/a?access_token=t&api_key=k&page=2&flag"),
            "https://e.com/a?access_token=***&api_key=***&page=2&flag"
        );
    }

    #[test]
    fn masks_what_it_can_of_an_unparsable_url() {
        assert_eq!(
            redact("https://u:p@exa mple.com/x"),
            "https://***@exa mple.com/x"
        );
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact("http://[bad/x@y"), "http://[bad/x@y");
    }
}
