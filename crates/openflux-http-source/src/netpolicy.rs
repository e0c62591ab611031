//! Which network addresses an HttpSource may be fetched from: the defence
//! against server-side request forgery, as plain functions.
//!
//! Anyone who may create an HttpSource can make the controller send GET
//! requests from inside the cluster. By default it refuses addresses that
//! are not on the public internet: loopback, private (RFC 1918, RFC 4193),
//! link-local (cloud metadata services), carrier-grade NAT, unspecified,
//! broadcast, multicast and reserved ranges, IPv4 embedded in IPv6 in any of
//! those, cluster-internal names (single-label names, `*.svc`,
//! `*.cluster.local`) and the Kubernetes API server's address. Operators
//! open ranges with `--allow-network`; the API server stays refused.
//!
//! The checks run on resolved addresses (see `guard`), never on names alone.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The flag that allows a range.
pub const ALLOW_FLAG: &str = "--allow-network";

/// An address range, `address/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// A range that is not `address/prefix` (or a bare address).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network {0:?}: expected an address range such as 10.0.0.0/8, 192.168.1.10/32 or fd00::/8")]
pub struct InvalidCidr(pub String);

impl Cidr {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Cidr {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Cidr {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    /// Whether `ip` is in the range (an IPv4 range never holds an IPv6
    /// address: embedded IPv4 is unwrapped by the caller).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = InvalidCidr;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidCidr(s.to_string());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| invalid())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| invalid())?
            }
            Some(_) => return Err(invalid()),
            None => max,
        };
        if prefix > max {
            return Err(invalid());
        }
        // The range starts at its network address.
        Ok(Cidr {
            addr: mask_addr(addr, prefix),
            prefix,
        })
    }
}

fn mask_addr(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The ranges refused by default, most specific first, each with what it is.
pub const BLOCKED: &[(Cidr, &str)] = &[
    (Cidr::v4(255, 255, 255, 255, 32), "broadcast"),
    (Cidr::v4(0, 0, 0, 0, 8), "unspecified (this network)"),
    (Cidr::v4(10, 0, 0, 0, 8), "private (RFC 1918)"),
    (Cidr::v4(100, 64, 0, 0, 10), "carrier-grade NAT (RFC 6598)"),
    (Cidr::v4(127, 0, 0, 0, 8), "loopback"),
    (
        Cidr::v4(169, 254, 0, 0, 16),
        "link-local (cloud metadata services)",
    ),
    (Cidr::v4(172, 16, 0, 0, 12), "private (RFC 1918)"),
    (Cidr::v4(192, 168, 0, 0, 16), "private (RFC 1918)"),
    (Cidr::v4(224, 0, 0, 0, 4), "multicast"),
    (Cidr::v4(240, 0, 0, 0, 4), "reserved"),
    (Cidr::v6([0; 8], 128), "unspecified"),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback"),
    (
        Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        "unique local (RFC 4193)",
    ),
    (Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
    (
        Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        "site-local (deprecated)",
    ),
    (Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
    (
        Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        "NAT64 local use (RFC 8215)",
    ),
];

/// The IPv4 address an IPv6 address carries, where it reaches that IPv4
/// address: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`)
/// and the NAT64 well-known prefix (`64:ff9b::a.b.c.d`).
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let low = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    let high = bits >> 32;
    let mapped = high == 0xffff;
    let nat64 = high == 0x0064_ff9b_0000_0000_0000_0000;
    let compatible = high == 0 && bits > 1;
    (mapped || nat64 || compatible).then_some(low)
}

/// Why an address or a host is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Blocked {
    /// The address is in a refused range.
    #[error("{}", address_message(host, addr, range, what))]
    Address {
        host: String,
        addr: IpAddr,
        range: Cidr,
        what: &'static str,
    },
    /// A cluster-internal name, with an address outside the allowed ranges
    /// (or none that resolves).
    #[error("host '{host}' is a cluster-internal name{}; the HttpSource controller fetches it only when all its addresses are in a range allowed with {ALLOW_FLAG}", .addr.map(|a| format!(" and resolves to {a}, which is not allowed")).unwrap_or_else(|| " that does not resolve here".to_string()))]
    ClusterName { host: String, addr: Option<IpAddr> },
    /// The Kubernetes API server: never fetched.
    #[error("host '{host}' is the Kubernetes API server (KUBERNETES_SERVICE_HOST); the HttpSource controller never fetches from it")]
    ApiServer { host: String },
}

fn address_message(host: &str, addr: &IpAddr, range: &Cidr, what: &str) -> String {
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    let subject = if host == addr.to_string() {
        format!("address {addr} is in")
    } else {
        format!("host '{host}' resolves to {addr}, in")
    };
    format!(
        "{subject} the blocked {what} range {range}; the HttpSource controller fetches it only when an operator allows it with {ALLOW_FLAG} (e.g. {ALLOW_FLAG}={addr}/{bits})"
    )
}

/// What a host name is, before resolving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameClass {
    /// A name on the internet: its addresses must not be blocked.
    Public,
    /// A name only the cluster resolves: its addresses must be allowed.
    ClusterInternal,
}

/// The address policy of the controller.
#[derive(Debug, Clone, Default)]
pub struct NetworkPolicy {
    allowed: Vec<Cidr>,
    /// `KUBERNETES_SERVICE_HOST`: an address or a name.
    api_server: Option<String>,
}

impl NetworkPolicy {
    pub fn new(allowed: Vec<Cidr>, api_server: Option<String>) -> Self {
        let api_server = api_server.map(|h| normalize(&h)).filter(|h| !h.is_empty());
        NetworkPolicy {
            allowed,
            api_server,
        }
    }

    pub fn allowed(&self) -> &[Cidr] {
        &self.allowed
    }

    fn is_allowed(&self, ip: IpAddr) -> bool {
        let inner = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.allowed
            .iter()
            .any(|c| c.contains(ip) || inner.is_some_and(|i| c.contains(i)))
    }

    fn is_api_server(&self, ip: IpAddr) -> bool {
        let Some(api) = &self.api_server else {
            return false;
        };
        let Ok(api) = api.parse::<IpAddr>() else {
            return false;
        };
        let canonical = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        canonical(api) == canonical(ip)
    }

    /// Classifies a host name (an address in brackets or not is not a name:
    /// see [`NetworkPolicy::check_ip`]). Refuses the API server's name.
    pub fn check_name(&self, host: &str) -> Result<NameClass, Blocked> {
        let name = normalize(host);
        if self.api_server.as_deref() == Some(name.as_str()) {
            return Err(Blocked::ApiServer {
                host: host.to_string(),
            });
        }
        let internal = !name.contains('.')
            || name.ends_with(".svc")
            || name.ends_with(".cluster.local")
            || name == "cluster.local"
            || name.ends_with(".localhost");
        Ok(if internal {
            NameClass::ClusterInternal
        } else {
            NameClass::Public
        })
    }

    /// Checks one address `host` stands for (or is).
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), Blocked> {
        if self.is_api_server(ip) {
            return Err(Blocked::ApiServer {
                host: host.to_string(),
            });
        }
        if self.is_allowed(ip) {
            return Ok(());
        }
        let inner = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        for (range, what) in BLOCKED {
            if range.contains(ip) || inner.is_some_and(|i| range.contains(i)) {
                return Err(Blocked::Address {
                    host: host.to_string(),
                    addr: ip,
                    range: *range,
                    what,
                });
            }
        }
        Ok(())
    }

    /// Checks the addresses a name resolved to: every one must pass (the
    /// client connects to any of them). A cluster-internal name passes only
    /// when all its addresses are explicitly allowed, and never unresolved.
    pub fn check_resolved(&self, host: &str, addrs: &[IpAddr]) -> Result<(), Blocked> {
        let class = self.check_name(host)?;
        if class == NameClass::ClusterInternal && addrs.is_empty() {
            return Err(Blocked::ClusterName {
                host: host.to_string(),
                addr: None,
            });
        }
        for ip in addrs {
            self.check_ip(host, *ip)?;
            if class == NameClass::ClusterInternal && !self.is_allowed(*ip) {
                return Err(Blocked::ClusterName {
                    host: host.to_string(),
                    addr: Some(*ip),
                });
            }
        }
        Ok(())
    }
}

/// A host name compared case-insensitively, without a trailing dot.
fn normalize(host: &str) -> String {
    host.trim()
        .trim_end_matches('.')
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses the values of `--allow-network` (each may hold several ranges,
    /// comma-separated).
    fn parse_allowed(values: &[String]) -> Result<Vec<Cidr>, InvalidCidr> {
        values
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::parse)
            .collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy(allowed: &[&str]) -> NetworkPolicy {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        NetworkPolicy::new(parse_allowed(&allowed).unwrap(), None)
    }

    #[test]
    fn parses_ranges_and_bare_addresses() {
        let c: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains(ip("10.255.0.1")));
        assert!(!c.contains(ip("11.0.0.1")));
        assert_eq!(
            "192.168.1.10".parse::<Cidr>().unwrap().to_string(),
            "192.168.1.10/32"
        );
        assert_eq!("fd00::1/8".parse::<Cidr>().unwrap().to_string(), "fd00::/8");
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("8.8.8.8")));
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "x/8",
            "10.0.0.0/",
            "10.0.0.0/-1",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_allowed(&["127.0.0.1/32, 10.0.0.0/8".into(), "fd00::/8".into()])
                .unwrap()
                .len(),
            3
        );
        assert!(parse_allowed(&["127.0.0.1/32,nope".into()]).is_err());
    }

    #[test]
    fn blocks_non_public_addresses_by_default() {
        let p = policy(&[]);
        for (addr, what) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("10.0.0.1", "private"),
            ("172.16.5.4", "private"),
            ("172.31.255.255", "private"),
            ("192.168.0.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.100.100.200", "carrier-grade NAT"),
            ("0.0.0.0", "unspecified"),
            ("255.255.255.255", "broadcast"),
            ("224.0.0.1", "multicast"),
            ("240.0.0.1", "reserved"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fd00:ec2::254", "unique local"),
            ("fc00::1", "unique local"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b:1::a00:1", "NAT64 local use"),
            ("64:ff9b:1:ffff::1", "NAT64 local use"),
        ] {
            match p.check_ip("h", ip(addr)) {
                Err(Blocked::Address {
                    what: w, addr: a, ..
                }) => {
                    assert!(w.contains(what), "{addr}: {w}");
                    assert_eq!(a, ip(addr));
                }
                other => panic!("{addr}: {other:?}"),
            }
        }
        for addr in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(p.check_ip("h", ip(addr)), Ok(()), "{addr}");
        }
    }

    #[test]
    fn the_message_names_the_host_the_range_and_the_flag() {
        let err = policy(&[])
            .check_ip("metadata", ip("169.254.169.254"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "host 'metadata' resolves to 169.254.169.254, in the blocked link-local (cloud metadata services) range 169.254.0.0/16; the HttpSource controller fetches it only when an operator allows it with --allow-network (e.g. --allow-network=169.254.169.254/32)"
        );
        let err = policy(&[])
            .check_ip("::1", ip("::1"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("address ::1 is in the blocked loopback range ::1/128;"),
            "{err}"
        );
        assert!(err.ends_with("(e.g. --allow-network=::1/128)"), "{err}");
    }

    #[test]
    fn allowed_ranges_open_blocked_ones() {
        let p = policy(&["127.0.0.1/32", "10.0.0.0/8"]);
        assert_eq!(p.check_ip("h", ip("127.0.0.1")), Ok(()));
        assert_eq!(p.check_ip("h", ip("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(p.check_ip("h", ip("10.9.8.7")), Ok(()));
        assert!(p.check_ip("h", ip("127.0.0.2")).is_err());
        assert!(p.check_ip("h", ip("::1")).is_err());
        assert!(p.check_ip("h", ip("192.168.1.1")).is_err());
    }

    #[test]
    fn cluster_internal_names_need_allowed_addresses() {
        let p = policy(&["10.96.0.0/12"]);
        for name in [
            "podinfo.apps.svc",
            "podinfo.apps.svc.cluster.local",
            "podinfo.apps.svc.cluster.local.",
            "PODINFO.APPS.SVC",
            "kubernetes",
            "localhost",
            "a.localhost",
        ] {
            assert_eq!(p.check_name(name), Ok(NameClass::ClusterInternal), "{name}");
        }
        assert_eq!(p.check_name("example.com"), Ok(NameClass::Public));
        assert_eq!(p.check_name("svc.example.com"), Ok(NameClass::Public));

        let svc = "podinfo.apps.svc.cluster.local";
        assert_eq!(p.check_resolved(svc, &[ip("10.96.3.4")]), Ok(()));
        // Unresolved, or at an address not allowed: refused, even a public one.
        assert!(matches!(
            p.check_resolved(svc, &[]),
            Err(Blocked::ClusterName { addr: None, .. })
        ));
        assert!(matches!(
            p.check_resolved(svc, &[ip("10.96.3.4"), ip("8.8.8.8")]),
            Err(Blocked::ClusterName { addr: Some(_), .. })
        ));
        // A public name passes when none of its addresses is blocked.
        assert_eq!(
            p.check_resolved("example.com", &[ip("93.184.216.34")]),
            Ok(())
        );
        assert!(p
            .check_resolved("example.com", &[ip("93.184.216.34"), ip("127.0.0.1")])
            .is_err());
        assert_eq!(p.check_resolved("example.com", &[]), Ok(()));
    }

    #[test]
    fn the_api_server_is_never_fetched() {
        let allowed = parse_allowed(&["0.0.0.0/0".into(), "::/0".into()]).unwrap();
        let p = NetworkPolicy::new(allowed.clone(), Some("10.96.0.1".into()));
        assert!(matches!(
            p.check_ip("kubernetes.default", ip("10.96.0.1")),
            Err(Blocked::ApiServer { .. })
        ));
        assert!(matches!(
            p.check_ip("x", ip("::ffff:10.96.0.1")),
            Err(Blocked::ApiServer { .. })
        ));
        assert_eq!(p.check_ip("x", ip("10.96.0.2")), Ok(()));
        let named = NetworkPolicy::new(allowed, Some("API.example.com.".into()));
        assert!(matches!(
            named.check_name("api.example.com"),
            Err(Blocked::ApiServer { .. })
        ));
        assert!(named.check_ip("x", ip("1.2.3.4")).is_ok());
    }
}
