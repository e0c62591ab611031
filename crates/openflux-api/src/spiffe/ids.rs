//! Which SPIFFE IDs a peer may have, written as Flux writes them in its
//! `--authorized-*-spiffe-id` flags:
//!
//! - `spiffe://<trust domain>`: any ID of that trust domain;
//! - `spiffe://<trust domain>/<path>`: exactly that ID;
//! - `spiffe://<trust domain>/<path>/`: every ID under that path (the
//!   trailing slash makes it a prefix);
//! - `spiffe://self`, `spiffe://self/<path>`, `spiffe://self/<path>/`: the
//!   same, in the trust domain of this process's own X.509-SVID.
//!
//! Parsing is strict (the SPIFFE ID syntax: lower-case trust domain,
//! path segments of letters, digits, `.`, `-` and `_`, no `.` or `..`
//! segment, no query, fragment, port or user): a pattern that could be
//! misread is refused at start rather than matched loosely.

use std::fmt;
use std::str::FromStr;

const SCHEME: &str = "spiffe://";
/// The trust domain name standing for this process's own.
const SELF: &str = "self";

/// One authorized SPIFFE ID pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPattern {
    domain: Domain,
    path: PathMatch,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Domain {
    /// The trust domain of this process's own SVID.
    Own,
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PathMatch {
    /// Any ID of the trust domain.
    Any,
    /// Exactly this path.
    Exact(String),
    /// Paths starting with this one, which ends in `/`.
    Prefix(String),
}

/// A pattern that is not a SPIFFE ID pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid SPIFFE ID {text:?}: {reason}")]
pub struct IdError {
    pub text: String,
    pub reason: &'static str,
}

impl FromStr for IdPattern {
    type Err = IdError;

    fn from_str(text: &str) -> Result<Self, IdError> {
        let fail = |reason| IdError {
            text: text.to_string(),
            reason,
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| fail("it must start with spiffe://"))?;
        let (domain, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if domain.is_empty() {
            return Err(fail("the trust domain is empty"));
        }
        if !domain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
        {
            return Err(fail(
                "a trust domain has lower-case letters, digits, '.', '-' and '_' only",
            ));
        }
        let path = if path.is_empty() {
            PathMatch::Any
        } else if let Some(prefix) = path.strip_suffix('/') {
            if prefix.is_empty() {
                return Err(fail("write the trust domain alone, without '/'"));
            }
            check_path(prefix).map_err(fail)?;
            PathMatch::Prefix(path.to_string())
        } else {
            check_path(path).map_err(fail)?;
            PathMatch::Exact(path.to_string())
        };
        let domain = if domain == SELF {
            Domain::Own
        } else {
            Domain::Named(domain.to_string())
        };
        Ok(IdPattern {
            domain,
            path,
            text: text.to_string(),
        })
    }
}

/// A path of a SPIFFE ID: `/segment(/segment)*`.
fn check_path(path: &str) -> Result<(), &'static str> {
    for segment in path.split('/').skip(1) {
        if segment.is_empty() {
            return Err("a path has no empty segment");
        }
        if segment == "." || segment == ".." {
            return Err("a path has no '.' or '..' segment");
        }
        if !segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        {
            return Err("a path segment has letters, digits, '.', '-' and '_' only");
        }
    }
    Ok(())
}

impl fmt::Display for IdPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl IdPattern {
    /// Whether a peer's SPIFFE ID (trust domain and path, as its verified
    /// certificate names it) matches, `own` being this process's trust
    /// domain (unknown: `self` patterns match nothing).
    pub fn matches(&self, own: Option<&str>, trust_domain: &str, path: &str) -> bool {
        let domain = match &self.domain {
            Domain::Own => own,
            Domain::Named(d) => Some(d.as_str()),
        };
        if domain != Some(trust_domain) {
            return false;
        }
        match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
        }
    }
}

/// The authorized peers: a peer is authorized when any pattern matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizedIds(Vec<IdPattern>);

impl AuthorizedIds {
    pub fn new(patterns: Vec<IdPattern>) -> Self {
        AuthorizedIds(patterns)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn authorizes(&self, own: Option<&str>, trust_domain: &str, path: &str) -> bool {
        self.0.iter().any(|p| p.matches(own, trust_domain, path))
    }

    /// The patterns as written, comma-separated (for logs).
    pub fn describe(&self) -> String {
        let texts: Vec<&str> = self.0.iter().map(|p| p.text.as_str()).collect();
        texts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> IdPattern {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn refuses_what_is_not_a_spiffe_id_pattern() {
        for (text, reason) in [
            ("", "spiffe://"),
            ("https://example.org/a", "spiffe://"),
            ("SPIFFE://example.org", "spiffe://"),
            ("spiffe://", "empty"),
            ("spiffe:///a", "empty"),
            ("spiffe://Example.org", "lower-case"),
            ("spiffe://example.org:8443/a", "lower-case"),
            ("spiffe://user@example.org", "lower-case"),
            ("spiffe://example.org/", "without '/'"),
            ("spiffe://example.org//a", "empty segment"),
            ("spiffe://example.org/a//", "empty segment"),
            ("spiffe://example.org/a/../b", "'..'"),
            ("spiffe://example.org/./b", "'.'"),
            ("spiffe://example.org/a?b", "letters"),
            ("spiffe://example.org/a#b", "letters"),
            ("spiffe://example.org/a b", "letters"),
            ("spiffe://example.org/ä", "letters"),
        ] {
            let err = text.parse::<IdPattern>().unwrap_err();
            assert!(err.to_string().contains(reason), "{text}: {err}");
        }
    }

    /// The four forms, for named and own trust domains, against peers in
    /// and out of them.
    #[test]
    fn matches_as_flux_documents() {
        let own = Some("cluster.example");
        let cases: &[(&str, &str, &str, bool)] = &[
            ("spiffe://td.example", "td.example", "/any/thing", true),
            ("spiffe://td.example", "td.example", "", true),
            ("spiffe://td.example", "other.example", "/any", false),
            (
                "spiffe://td.example/ns/flux/kc",
                "td.example",
                "/ns/flux/kc",
                true,
            ),
            (
                "spiffe://td.example/ns/flux/kc",
                "td.example",
                "/ns/flux/kc2",
                false,
            ),
            (
                "spiffe://td.example/ns/flux/kc",
                "td.example",
                "/ns/flux/kc/x",
                false,
            ),
            (
                "spiffe://td.example/ns/flux/kc",
                "other.example",
                "/ns/flux/kc",
                false,
            ),
            (
                "spiffe://td.example/ns/flux/",
                "td.example",
                "/ns/flux/kc",
                true,
            ),
            (
                "spiffe://td.example/ns/flux/",
                "td.example",
                "/ns/flux/a/b",
                true,
            ),
            (
                "spiffe://td.example/ns/flux/",
                "td.example",
                "/ns/flux",
                false,
            ),
            (
                "spiffe://td.example/ns/flux/",
                "td.example",
                "/ns/fluxx/kc",
                false,
            ),
            ("spiffe://self", "cluster.example", "/w", true),
            ("spiffe://self", "td.example", "/w", false),
            ("spiffe://self/w", "cluster.example", "/w", true),
            ("spiffe://self/w/", "cluster.example", "/w/x", true),
            ("spiffe://self/w/", "td.example", "/w/x", false),
        ];
        for &(pattern, domain, path, want) in cases {
            assert_eq!(
                p(pattern).matches(own, domain, path),
                want,
                "{pattern} vs spiffe://{domain}{path}"
            );
        }
        assert!(
            !p("spiffe://self").matches(None, "self", "/w"),
            "self is no trust domain name when the own one is unknown"
        );
    }

    #[test]
    fn any_pattern_authorizes() {
        let ids = AuthorizedIds::new(vec![p("spiffe://a.example/x"), p("spiffe://b.example/y/")]);
        assert!(ids.authorizes(None, "a.example", "/x"));
        assert!(ids.authorizes(None, "b.example", "/y/z"));
        assert!(!ids.authorizes(None, "a.example", "/y"));
        assert!(!AuthorizedIds::default().authorizes(None, "a.example", "/x"));
        assert!(!ids.authorizes(None, "b.example", "/z"));
        assert_eq!(ids.describe(), "spiffe://a.example/x,spiffe://b.example/y/");
    }
}
