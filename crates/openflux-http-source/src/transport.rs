//! How a fetch connects, read from Secrets the way Flux's sources read them
//! (`fluxcd/pkg/runtime/secrets`): `spec.certSecretRef` (`ca.crt`, and
//! `tls.crt` with `tls.key` for mutual TLS; type `Opaque` or
//! `kubernetes.io/tls`) and `spec.proxySecretRef` (`address`, and
//! optionally `username` and `password`). Plain functions over the
//! Secrets' data.

use std::collections::BTreeMap;

use reqwest::Url;

/// Keys of a certificate Secret, Flux's names.
pub const KEY_CA: &str = "ca.crt";
pub const KEY_CERT: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";
/// Keys of a proxy Secret, Flux's names.
pub const KEY_ADDRESS: &str = "address";
pub const KEY_USERNAME: &str = "username";
pub const KEY_PASSWORD: &str = "password";
/// Longest proxy address accepted (Flux's limit).
pub const MAX_PROXY_URL: usize = 2048;

/// TLS material of `spec.certSecretRef`, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsMaterial {
    /// PEM certificates trusted beside the system's roots.
    pub ca: Option<Vec<u8>>,
    /// PEM client certificate chain followed by its key.
    pub identity: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// The proxy of `spec.proxySecretRef`.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The proxy's URL, without userinfo.
    pub url: Url,
    /// Basic credentials for the proxy (an empty password with only a user).
    pub basic: Option<(String, String)>,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("url", &self.url.as_str())
            .field("basic", &self.basic.is_some())
            .finish()
    }
}

/// How a source's fetches connect, beyond the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transport {
    pub tls: Option<TlsMaterial>,
    pub proxy: Option<ProxyConfig>,
}

impl Transport {
    pub fn is_default(&self) -> bool {
        self.tls.is_none() && self.proxy.is_none()
    }

    /// The fields that shape a request, for the request fingerprint.
    pub fn fingerprint_fields(&self) -> Vec<&[u8]> {
        let mut fields: Vec<&[u8]> = Vec::new();
        if let Some(tls) = &self.tls {
            fields.push(b"tls");
            fields.push(tls.ca.as_deref().unwrap_or_default());
            fields.push(tls.identity.as_deref().unwrap_or_default());
        }
        if let Some(proxy) = &self.proxy {
            fields.push(b"proxy");
            fields.push(proxy.url.as_str().as_bytes());
            if let Some((u, p)) = &proxy.basic {
                fields.push(u.as_bytes());
                fields.push(p.as_bytes());
            }
        }
        fields
    }
}

fn non_empty<'a>(data: &'a BTreeMap<String, Vec<u8>>, key: &str) -> Option<&'a [u8]> {
    data.get(key).map(Vec::as_slice).filter(|v| !v.is_empty())
}

/// Reads `ca.crt`, `tls.crt` and `tls.key`: a CA, a client certificate
/// with its key, or both. A certificate without its key (or the reverse),
/// neither, or PEM that holds no usable certificate is an error.
pub fn tls_from_secret(data: &BTreeMap<String, Vec<u8>>) -> Result<TlsMaterial, String> {
    let ca = non_empty(data, KEY_CA);
    let cert = non_empty(data, KEY_CERT);
    let key = non_empty(data, KEY_KEY);
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => {
            let mut pem = cert.to_vec();
            pem.push(b'\n');
            pem.extend_from_slice(key);
            reqwest::Identity::from_pem(&pem).map_err(|_| {
                format!(
                    "'{KEY_CERT}' and '{KEY_KEY}' are not a PEM certificate and its private key"
                )
            })?;
            Some(pem)
        }
        (Some(_), None) => return Err(format!("'{KEY_CERT}' is set without '{KEY_KEY}'")),
        (None, Some(_)) => return Err(format!("'{KEY_KEY}' is set without '{KEY_CERT}'")),
        (None, None) => None,
    };
    if let Some(ca) = ca {
        let certs = reqwest::Certificate::from_pem_bundle(ca)
            .map_err(|_| format!("'{KEY_CA}' is not PEM"))?;
        if certs.is_empty() {
            return Err(format!("'{KEY_CA}' holds no PEM certificate"));
        }
    }
    if ca.is_none() && identity.is_none() {
        return Err(format!(
            "secret has neither '{KEY_CA}' nor '{KEY_CERT}' and '{KEY_KEY}'"
        ));
    }
    Ok(TlsMaterial {
        ca: ca.map(<[u8]>::to_vec),
        identity,
    })
}

/// Reads `address` (an `http://` or `https://` URL), `username` and
/// `password`, as Flux does: a password without a username is ignored.
pub fn proxy_from_secret(data: &BTreeMap<String, Vec<u8>>) -> Result<ProxyConfig, String> {
    let text = |key: &str| -> Result<Option<String>, String> {
        data.get(key)
            .map(|v| String::from_utf8(v.clone()).map_err(|_| format!("key '{key}' is not UTF-8")))
            .transpose()
    };
    let address = text(KEY_ADDRESS)?.ok_or_else(|| format!("secret has no '{KEY_ADDRESS}'"))?;
    let address = address.trim();
    if address.is_empty() {
        return Err("the proxy address is empty".into());
    }
    if address.len() > MAX_PROXY_URL {
        return Err(format!(
            "the proxy address exceeds {MAX_PROXY_URL} characters"
        ));
    }
    let mut url = Url::parse(address).map_err(|e| format!("invalid proxy address: {e}"))?;
    match url.scheme() {
        "http" | "https" => {}
        "socks5" => {
            return Err("socks5 proxies are not supported: use an http or https proxy".into())
        }
        other => {
            return Err(format!(
                "unsupported proxy scheme {other:?}: use http or https"
            ))
        }
    }
    if url.host().is_none() {
        return Err("the proxy address has no host".into());
    }
    let in_url = crate::redirect::take_userinfo(&mut url);
    let basic = match (text(KEY_USERNAME)?, text(KEY_PASSWORD)?) {
        (Some(u), p) if !u.is_empty() => Some((u, p.unwrap_or_default())),
        _ => in_url,
    };
    Ok(ProxyConfig { url, basic })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect()
    }

    /// A self-signed certificate and its key, PEM.
    fn cert_and_key() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn reads_a_ca_a_client_certificate_or_both() {
        let (cert, key) = cert_and_key();
        let ca_only = tls_from_secret(&data(&[(KEY_CA, cert.as_bytes())])).unwrap();
        assert!(ca_only.ca.is_some() && ca_only.identity.is_none());
        let mtls = tls_from_secret(&data(&[
            (KEY_CERT, cert.as_bytes()),
            (KEY_KEY, key.as_bytes()),
        ]))
        .unwrap();
        assert!(mtls.ca.is_none() && mtls.identity.is_some());
        let both = tls_from_secret(&data(&[
            (KEY_CA, cert.as_bytes()),
            (KEY_CERT, cert.as_bytes()),
            (KEY_KEY, key.as_bytes()),
        ]))
        .unwrap();
        assert!(both.ca.is_some() && both.identity.is_some());
        assert_eq!(
            format!("{both:?}"),
            "TlsMaterial { ca: true, identity: true }"
        );
    }

    #[test]
    fn rejects_unusable_certificate_secrets() {
        let (cert, key) = cert_and_key();
        for (secret, needle) in [
            (data(&[]), "neither"),
            (data(&[("caFile", cert.as_bytes())]), "neither"),
            (data(&[(KEY_CERT, cert.as_bytes())]), "without 'tls.key'"),
            (data(&[(KEY_KEY, key.as_bytes())]), "without 'tls.crt'"),
            (data(&[(KEY_CA, b"not pem")]), "ca.crt"),
            (
                data(&[(KEY_CERT, b"garbage"), (KEY_KEY, key.as_bytes())]),
                "not a PEM certificate",
            ),
        ] {
            let err = tls_from_secret(&secret).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn reads_a_proxy_as_flux_does() {
        let p = proxy_from_secret(&data(&[(KEY_ADDRESS, b"http://proxy.corp:3128")])).unwrap();
        assert_eq!(p.url.as_str(), "http://proxy.corp:3128/");
        assert_eq!(p.basic, None);
        let p = proxy_from_secret(&data(&[
            (KEY_ADDRESS, b"https://proxy.corp"),
            (KEY_USERNAME, b"u"),
            (KEY_PASSWORD, b"p"),
        ]))
        .unwrap();
        assert_eq!(p.basic, Some(("u".into(), "p".into())));
        let user_only =
            proxy_from_secret(&data(&[(KEY_ADDRESS, b"http://p:1"), (KEY_USERNAME, b"u")]))
                .unwrap();
        assert_eq!(user_only.basic, Some(("u".into(), String::new())));
        let password_only =
            proxy_from_secret(&data(&[(KEY_ADDRESS, b"http://p:1"), (KEY_PASSWORD, b"x")]))
                .unwrap();
        assert_eq!(password_only.basic, None);
        // Credentials in the address move out of the URL.
        let inline = proxy_from_secret(&data(&[(KEY_ADDRESS, b"http://a:b@p:1")])).unwrap();
        assert_eq!(inline.url.as_str(), "http://p:1/");
        assert_eq!(inline.basic, Some(("a".into(), "b".into())));
        assert_eq!(
            format!("{inline:?}"),
            "ProxyConfig { url: \"http://p:1/\", basic: true }"
        );
    }

    #[test]
    fn rejects_unusable_proxy_secrets() {
        let long = format!("http://{}", "a".repeat(MAX_PROXY_URL));
        for (secret, needle) in [
            (data(&[]), "no 'address'"),
            (data(&[(KEY_ADDRESS, b" ")]), "empty"),
            (data(&[(KEY_ADDRESS, b"socks5://p:1080")]), "socks5"),
            (data(&[(KEY_ADDRESS, b"ftp://p")]), "unsupported"),
            (data(&[(KEY_ADDRESS, b"not a url")]), "invalid"),
            (data(&[(KEY_ADDRESS, long.as_bytes())]), "exceeds"),
        ] {
            let err = proxy_from_secret(&secret).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn the_fingerprint_follows_the_transport() {
        let none = Transport::default();
        assert!(none.is_default());
        assert!(none.fingerprint_fields().is_empty());
        let proxied = Transport {
            proxy: Some(proxy_from_secret(&data(&[(KEY_ADDRESS, b"http://p:1")])).unwrap()),
            tls: None,
        };
        assert!(!proxied.is_default());
        assert_ne!(proxied.fingerprint_fields(), none.fingerprint_fields());
    }
}
