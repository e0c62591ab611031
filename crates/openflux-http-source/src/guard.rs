//! The network policy on the wire: the HTTP client's DNS resolver, so the
//! addresses a connection is made to are the addresses that were checked
//! (no second lookup a DNS rebinding could answer differently), and the
//! check of a URL before each request (addresses written in the URL, which
//! the client does not resolve; names a proxy will resolve).

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

use crate::netpolicy::{Blocked, NameClass, NetworkPolicy};

/// A name lookup's result.
pub type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves host names (the system resolver, or a scripted one in tests).
pub trait Lookup: Send + Sync {
    fn lookup(&self, host: &str) -> LookupFuture;
}

/// The system's resolver (`getaddrinfo`).
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> LookupFuture {
        let host = host.to_string();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// The policy with the resolver it checks.
#[derive(Clone)]
pub struct Guard {
    policy: Arc<NetworkPolicy>,
    lookup: Arc<dyn Lookup>,
}

impl Guard {
    pub fn new(policy: NetworkPolicy) -> Self {
        Self::with_lookup(policy, Arc::new(SystemLookup))
    }

    pub fn with_lookup(policy: NetworkPolicy, lookup: Arc<dyn Lookup>) -> Self {
        Guard {
            policy: Arc::new(policy),
            lookup,
        }
    }

    /// What can be said of a URL without a lookup: an address in it that is
    /// refused, or the API server's name. `Ok` for every other name.
    pub fn check_static(&self, url: &Url) -> Result<(), Blocked> {
        match host(url) {
            Some(UrlHost::Ip(ip)) => self.policy.check_ip(&ip.to_string(), ip),
            Some(UrlHost::Name(name)) => self.policy.check_name(name).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Checks a URL's host before a request: its address, or every address
    /// its name resolves to here. A public name that does not resolve here
    /// passes (the request fails by itself, or a proxy resolves it); a
    /// cluster-internal one does not.
    pub async fn check_url(&self, url: &Url) -> Result<(), Blocked> {
        self.check_static(url)?;
        let Some(UrlHost::Name(name)) = host(url) else {
            return Ok(());
        };
        match self.lookup.lookup(name).await {
            Ok(addrs) => self.policy.check_resolved(name, &addrs),
            Err(_) if self.policy.check_name(name)? == NameClass::Public => Ok(()),
            Err(_) => self.policy.check_resolved(name, &[]),
        }
    }
}

impl Resolve for Guard {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = guard.lookup.lookup(&host).await?;
            guard.policy.check_resolved(&host, &addrs)?;
            let addrs: Addrs = Box::new(
                addrs
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, 0))
                    .collect::<Vec<_>>()
                    .into_iter(),
            );
            Ok(addrs)
        })
    }
}

/// The host of a URL: an address, or a name to resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlHost<'a> {
    Ip(IpAddr),
    Name(&'a str),
}

/// The host of a URL (the URL parser has already normalized IPv4 forms
/// such as `2130706433` or `0x7f.1` to dotted decimal).
pub fn host(url: &Url) -> Option<UrlHost<'_>> {
    let h = url.host_str()?;
    if let Some(v6) = h.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6.parse().ok().map(UrlHost::Ip);
    }
    Some(match h.parse::<std::net::Ipv4Addr>() {
        Ok(v4) => UrlHost::Ip(IpAddr::V4(v4)),
        Err(_) => UrlHost::Name(h),
    })
}

/// The refusal behind an error, when that is why it failed.
pub fn blocked_in(error: &(dyn std::error::Error + 'static)) -> Option<Blocked> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(blocked) = e.downcast_ref::<Blocked>() {
            return Some(blocked.clone());
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn reads_the_host_the_way_the_client_connects_to_it() {
        let ip = |s: &str| UrlHost::Ip(s.parse().unwrap());
        assert_eq!(host(&url("http://2130706433/")), Some(ip("127.0.0.1")));
        assert_eq!(host(&url("http://0x7f.1/")), Some(ip("127.0.0.1")));
        assert_eq!(host(&url("http://[::1]:8080/")), Some(ip("::1")));
        assert_eq!(
            host(&url("http://[::ffff:169.254.169.254]/")),
            Some(ip("::ffff:169.254.169.254"))
        );
        assert_eq!(
            host(&url("https://Example.COM/a")),
            Some(UrlHost::Name("example.com"))
        );
    }

    #[test]
    fn refuses_addresses_in_urls_without_a_lookup() {
        let guard = Guard::new(NetworkPolicy::new(Vec::new(), Some("10.96.0.1".into())));
        assert!(guard.check_static(&url("http://127.1/")).is_err());
        assert!(guard.check_static(&url("http://[fe80::1]/")).is_err());
        assert!(matches!(
            guard.check_static(&url("https://10.96.0.1/")),
            Err(Blocked::ApiServer { .. })
        ));
        assert_eq!(guard.check_static(&url("https://example.com/")), Ok(()));
        assert_eq!(guard.check_static(&url("https://8.8.8.8/")), Ok(()));
    }

    #[test]
    fn finds_a_refusal_behind_other_errors() {
        let blocked = Blocked::ClusterName {
            host: "a.svc".into(),
            addr: None,
        };
        #[derive(Debug, thiserror::Error)]
        #[error("connect error")]
        struct Wrapped(#[source] Blocked);
        assert_eq!(blocked_in(&Wrapped(blocked.clone())), Some(blocked));
        assert_eq!(blocked_in(&std::io::Error::other("refused")), None);
    }
}
