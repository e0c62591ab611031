//! Following redirects, as plain functions: how many, where to, and to
//! whom credentials go.
//!
//! The controller follows redirects itself (the HTTP client follows none),
//! so that every hop is checked against the network policy before it is
//! requested, and credentials (`spec.secretRef`'s basic auth and headers,
//! the URL's userinfo) are sent only to the origin (scheme, host and port)
//! of `spec.url`: never to another one, not even over a downgrade to plain
//! HTTP on the same host.

use reqwest::Url;

/// Redirects followed at most, as Go's HTTP client (and so Flux) does.
pub const MAX_REDIRECTS: usize = 10;

/// Whether a status asks to repeat the GET elsewhere.
pub fn is_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// Whether two URLs have the same origin: scheme, host and port (the
/// scheme's default port when none is written).
pub fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host() == b.host()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// The URL a redirect leads to: `location` resolved against the URL that
/// answered, HTTP(S) only, without userinfo (credentials a server names are
/// not sent) and without a fragment.
pub fn next_url(current: &Url, location: Option<&str>) -> Result<Url, String> {
    let location = location.ok_or("a redirect without a Location header")?;
    let mut next = current
        .join(location.trim())
        .map_err(|e| format!("a redirect to an invalid location: {e}"))?;
    if !matches!(next.scheme(), "http" | "https") {
        return Err(format!(
            "a redirect to the unsupported scheme {:?}",
            next.scheme()
        ));
    }
    take_userinfo(&mut next);
    next.set_fragment(None);
    Ok(next)
}

/// Removes the userinfo of a URL and returns it decoded, as basic auth
/// credentials (an empty password when only a user is given).
pub fn take_userinfo(url: &mut Url) -> Option<(String, String)> {
    if url.username().is_empty() && url.password().is_none() {
        return None;
    }
    let user = percent_decode(url.username());
    let password = url.password().map(percent_decode).unwrap_or_default();
    // Only URLs without a host cannot hold userinfo; these have one.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    Some((user, password))
}

/// Decodes `%XX` escapes; invalid escapes are kept as they are.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn follows_the_redirect_statuses() {
        for s in [301, 302, 303, 307, 308] {
            assert!(is_redirect(s), "{s}");
        }
        for s in [200, 300, 304, 305, 400] {
            assert!(!is_redirect(s), "{s}");
        }
    }

    #[test]
    fn origins_are_scheme_host_and_port() {
        let a = url("https://example.com/a.tgz");
        assert!(same_origin(&a, &url("https://example.com:443/b")));
        assert!(same_origin(&a, &url("https://EXAMPLE.com/other?x=1")));
        assert!(!same_origin(&a, &url("http://example.com/a.tgz")));
        assert!(!same_origin(&a, &url("https://example.com:8443/a.tgz")));
        assert!(!same_origin(&a, &url("https://cdn.example.com/a.tgz")));
        assert!(!same_origin(
            &url("https://example.com:8443/"),
            &url("http://example.com:8443/")
        ));
    }

    #[test]
    fn resolves_locations_and_drops_what_a_server_may_not_set() {
        let here = url("https://example.com/releases/v1/app.tgz");
        assert_eq!(
            next_url(&here, Some("../v2/app.tgz")).unwrap().as_str(),
            "https://example.com/releases/v2/app.tgz"
        );
        assert_eq!(
            next_url(&here, Some("//cdn.example.net/x.tgz#frag"))
                .unwrap()
                .as_str(),
            "https://cdn.example.net/x.tgz"
        );
        assert_eq!(
            next_url(&here, Some("http://user:pw@other.example/x"))
                .unwrap()
                .as_str(),
            "http://other.example/x"
        );
        assert!(next_url(&here, None).unwrap_err().contains("Location"));
        assert!(next_url(&here, Some("file:///etc/passwd"))
            .unwrap_err()
            .contains("\"file\""));
        assert!(next_url(&here, Some("gopher://x/")).is_err());
    }

    #[test]
    fn takes_userinfo_out_of_the_url() {
        let mut u = url("https://user%40corp:p%3Ass@example.com/a.tgz");
        assert_eq!(
            take_userinfo(&mut u),
            Some(("user@corp".to_string(), "p:ss".to_string()))
        );
        assert_eq!(u.as_str(), "https://example.com/a.tgz");
        let mut only_user = url("https://token@example.com/");
        assert_eq!(
            take_userinfo(&mut only_user),
            Some(("token".to_string(), String::new()))
        );
        let mut none = url("https://example.com/");
        assert_eq!(take_userinfo(&mut none), None);
        assert_eq!(percent_decode("a%zz%4"), "a%zz%4");
    }
}
