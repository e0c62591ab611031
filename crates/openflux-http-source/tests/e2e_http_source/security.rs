//! The defences against a user who may create HttpSources: the network
//! policy (`--allow-network`), redirects, credentials, redaction, TLS and
//! proxy settings from Secrets, and bounded durations.

use super::*;

#[path = "security/tls.rs"]
mod tls;

/// `Launch` with these `--allow-network` values.
fn allowing(ns: &str, allow: &[&str]) -> Launch {
    Launch {
        allow: allow.iter().map(|a| a.to_string()).collect(),
        ..Launch::new(ns, &[])
    }
}

/// Waits until the source is refused (`BlockedAddress`); returns it and the
/// message.
async fn wait_blocked(w: &World, name: &str) -> (DynamicObject, String) {
    w.wait_not_ready(name, "BlockedAddress").await
}

fn stalled(hs: &DynamicObject) -> Option<String> {
    condition(hs, "Stalled").map(|c| c.0)
}

/// By default nothing but public addresses is fetched: loopback (the test's
/// own content server), the cloud metadata address, private addresses in
/// IPv4-mapped IPv6 form and cluster-internal names are refused, with a
/// message naming the address, the range and the flag, and nothing is sent
/// to them. Allowing the range with `--allow-network` (a restart of the
/// controller) lets the source through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_private_and_cluster_addresses_by_default() {
    let w = world_launched("hs-ssrf", |ns| allowing(ns, &[])).await;
    let path = "app.tgz";
    w.server
        .content
        .put(path, tgz(&[("app.yaml", CONFIG_ONE)], 0, 0));
    let loopback = w.server.url(path);
    let port = w.server.addr.port();
    let cases = [
        (
            "loopback",
            loopback.clone(),
            "address 127.0.0.1 is in the blocked loopback range 127.0.0.0/8",
            true,
        ),
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "address 169.254.169.254 is in the blocked link-local (cloud metadata services) range 169.254.0.0/16",
            true,
        ),
        (
            "mapped",
            "http://[::ffff:10.0.0.1]/app.tgz".to_string(),
            "private (RFC 1918) range 10.0.0.0/8",
            true,
        ),
        (
            "cluster",
            "http://app.team.svc.cluster.local/app.tgz".to_string(),
            "host 'app.team.svc.cluster.local' is a cluster-internal name",
            false,
        ),
    ];
    for (name, url, _, _) in &cases {
        w.apply_source(name, json!({"url": url, "interval": "1m"}))
            .await;
    }
    for (name, _, needle, stalls) in &cases {
        let (hs, message) = wait_blocked(&w, name).await;
        assert!(message.contains(needle), "{name}: {message}");
        assert!(message.contains("--allow-network"), "{name}: {message}");
        if *stalls {
            assert_eq!(stalled(&hs).as_deref(), Some("True"), "{name}: {message}");
        } else {
            assert_eq!(stalled(&hs), None, "{name}: retried, not stalled");
            assert_eq!(
                condition(&hs, "Reconciling").map(|c| c.0).as_deref(),
                Some("True")
            );
        }
        assert!(revision(&hs).is_none(), "{name}: nothing published");
        assert!(w.artifact(name).await.is_none(), "{name}: no Artifact");
    }
    let (_, message) = wait_blocked(&w, "loopback").await;
    assert!(
        message.starts_with(&format!("GET http://127.0.0.1:{port}/app.tgz: ")),
        "{message}"
    );
    assert!(
        message.ends_with("(e.g. --allow-network=127.0.0.1/32)"),
        "{message}"
    );
    wait_for("a BlockedAddress warning event", TIMEOUT, || async {
        let e = w.events("loopback", "BlockedAddress").await;
        e.iter()
            .any(|e| e.type_.as_deref() == Some("Warning"))
            .then_some(())
    })
    .await;
    assert_eq!(
        w.server.content.stats(path).requests,
        0,
        "nothing was sent to the refused address"
    );

    // The operator allows loopback: after the restart the source is fetched;
    // the metadata address stays refused.
    let World {
        env,
        ns,
        server,
        controller,
        kubeconfig,
        _dir,
    } = w;
    drop(controller);
    let controller = Controller::launch(
        &kubeconfig,
        ns.name(),
        allowing(ns.name(), &["127.0.0.1/32"]),
    )
    .await;
    let w = World {
        env,
        ns,
        server,
        controller,
        kubeconfig,
        _dir,
    };
    w.wait_ready("loopback", None).await;
    assert!(w.server.content.stats(path).full >= 1);
    let (_, message) = wait_blocked(&w, "metadata").await;
    assert!(message.contains("169.254.169.254"), "{message}");
}

/// The API server's address (`KUBERNETES_SERVICE_HOST`) is refused even
/// when its range is allowed, and every redirect hop is checked: a redirect
/// from an allowed server to a refused address (or to the API server) is
/// not followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_the_api_server_and_redirects_to_refused_addresses() {
    let api_server = ContentServer::start_on("127.0.0.3").await;
    let elsewhere = ContentServer::start_on("127.0.0.2").await;
    let w = world_launched("hs-hops", |ns| Launch {
        env: vec![("KUBERNETES_SERVICE_HOST".into(), "127.0.0.3".into())],
        ..allowing(ns, &["127.0.0.1/32", "127.0.0.3/32"])
    })
    .await;
    let body = tgz(&[("app.yaml", CONFIG_ONE)], 0, 0);
    api_server.content.put("app.tgz", body.clone());
    elsewhere.content.put("app.tgz", body.clone());
    w.server.content.with("hop.tgz", |s| {
        s.redirect = Some(elsewhere.url("app.tgz"));
    });
    w.server.content.with("hop-api.tgz", |s| {
        s.redirect = Some(api_server.url("app.tgz"));
    });
    w.apply_source(
        "api",
        json!({"url": api_server.url("app.tgz"), "interval": "1m"}),
    )
    .await;
    w.apply_source(
        "hop",
        json!({"url": w.server.url("hop.tgz"), "interval": "1m"}),
    )
    .await;
    w.apply_source(
        "hop-api",
        json!({"url": w.server.url("hop-api.tgz"), "interval": "1m"}),
    )
    .await;

    let (hs, message) = wait_blocked(&w, "api").await;
    assert!(
        message.contains("is the Kubernetes API server (KUBERNETES_SERVICE_HOST)"),
        "{message}"
    );
    assert_eq!(stalled(&hs).as_deref(), Some("True"));

    let (hs, message) = wait_blocked(&w, "hop").await;
    assert!(
        message.contains(&format!(
            "GET {}: address 127.0.0.2 is in the blocked loopback range",
            elsewhere.url("app.tgz")
        )),
        "{message}"
    );
    assert_eq!(stalled(&hs), None, "a redirect may change: retried");
    assert!(w.server.content.stats("hop.tgz").requests >= 1);

    let (_, message) = wait_blocked(&w, "hop-api").await;
    assert!(message.contains("Kubernetes API server"), "{message}");

    assert_eq!(elsewhere.content.stats("app.tgz").requests, 0);
    assert_eq!(api_server.content.stats("app.tgz").requests, 0);
}

/// Credentials (the Secret's headers and the URL's userinfo) follow a
/// redirect within the origin of `spec.url` and never to another origin;
/// redirects are bounded; and no URL in the status, the Events or the logs
/// shows a credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_stay_with_their_origin_and_are_redacted() {
    let other = ContentServer::start_on("127.0.0.2").await;
    let w = world_launched("hs-creds", |ns| {
        allowing(ns, &["127.0.0.1/32", "127.0.0.2/32"])
    })
    .await;
    let ns = w.ns().to_string();
    w.env
        .apply(&json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds", "namespace": ns},
            "stringData": {"headers": "X-Api-Key: k3y-value\n"},
        }))
        .await
        .expect("Secret");
    let body = tgz(&[("app.yaml", CONFIG_ONE)], 0, 0);
    let content = &w.server.content;
    // user:pa55
    let basic = "Basic dXNlcjpwYTU1";
    content.with("start.tgz", |s| s.redirect = Some("/private.tgz".into()));
    content.put("private.tgz", body.clone());
    content.with("private.tgz", |s| s.authorization = Some(basic.into()));
    content.with("away.tgz", |s| s.redirect = Some(other.url("public.tgz")));
    other.content.put("public.tgz", body.clone());
    content.with("loop.tgz", |s| s.redirect = Some("/loop.tgz".into()));
    for n in 1..=10 {
        content.with(&format!("chain-{n}"), |s| {
            s.redirect = Some(format!("/chain-{}", n - 1))
        });
    }
    content.put("chain-0", body.clone());

    let port = w.server.addr.port();
    let with_userinfo = |path: &str| format!("http://user:pa55@127.0.0.1:{port}/{path}");
    for (name, path) in [
        ("same", "start.tgz"),
        ("away", "away.tgz"),
        ("missing", "missing.tgz?token=t0ken-value&v=1"),
        ("loop", "loop.tgz"),
        ("chain", "chain-10"),
    ] {
        w.apply_source(
            name,
            json!({"url": with_userinfo(path), "interval": "1m", "secretRef": {"name": "creds"}}),
        )
        .await;
    }

    // Same origin: the redirect keeps the credentials.
    w.wait_ready("same", None).await;
    let seen = content.stats("private.tgz").seen;
    let last = seen.last().expect("a request for private.tgz");
    assert_eq!(last.get("authorization").map(String::as_str), Some(basic));
    assert_eq!(last.get("x-api-key").map(String::as_str), Some("k3y-value"));

    // Another origin: nothing of them.
    w.wait_ready("away", None).await;
    let first_hop = &content.stats("away.tgz").seen[0];
    assert_eq!(
        first_hop.get("authorization").map(String::as_str),
        Some(basic)
    );
    let public = other.content.stats("public.tgz").seen;
    assert!(!public.is_empty());
    for request in &public {
        assert!(!request.contains_key("authorization"), "{request:?}");
        assert!(!request.contains_key("x-api-key"), "{request:?}");
    }

    // Ten redirects are followed; an eleventh is not.
    w.wait_ready("chain", None).await;
    let (_, message) = w.wait_not_ready("loop", "FetchFailed").await;
    assert!(message.contains("stopped after 10 redirects"), "{message}");

    // Redacted: the status, the Events and the logs.
    let (_, message) = w.wait_not_ready("missing", "FetchFailed").await;
    // The userinfo went into the request's basic auth: the URL shown is
    // the one requested, without it.
    assert!(
        message.starts_with(&format!(
            "GET http://127.0.0.1:{port}/missing.tgz?token=***&v=1: HTTP status 404"
        )),
        "{message}"
    );
    let new_artifact = wait_for("the NewArtifact event of 'same'", TIMEOUT, || async {
        w.events("same", "NewArtifact").await.into_iter().next()
    })
    .await;
    let note = new_artifact.note.unwrap_or_default();
    assert!(
        note.contains(&format!("from 'http://***@127.0.0.1:{port}/start.tgz'")),
        "{note}"
    );
    wait_for("the FetchFailed event of 'missing'", TIMEOUT, || async {
        (!w.events("missing", "FetchFailed").await.is_empty()).then_some(())
    })
    .await;
    let events: Api<K8sEvent> = Api::namespaced(w.env.client.clone(), &ns);
    let events = serde_json::to_string(
        &events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items,
    )
    .expect("json");
    let mut statuses = String::new();
    for name in ["same", "away", "missing", "loop", "chain"] {
        let hs = w.source(name).await.expect("the HttpSource");
        statuses.push_str(&serde_json::to_string(&hs.data["status"]).expect("json"));
    }
    let log = w.controller.log_text();
    for (what, text) in [("events", &events), ("status", &statuses), ("log", &log)] {
        assert!(!text.is_empty(), "{what}");
        for secret in ["pa55", "t0ken-value", "k3y-value"] {
            assert!(!text.contains(secret), "{what} shows {secret}: {text}");
        }
    }
}

/// `spec.proxySecretRef`: the fetch goes through the proxy of the Secret
/// (the test's content server acting as one), with its credentials; a
/// proxy at a refused address is refused like a URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_through_the_proxy_of_its_secret() {
    let w = world("hs-proxy").await;
    let ns = w.ns().to_string();
    w.server
        .content
        .put("app.tgz", tgz(&[("app.yaml", CONFIG_ONE)], 0, 0));
    for (name, address) in [
        ("proxy", format!("http://{}", w.server.addr)),
        ("refused-proxy", "http://127.0.0.4:3128".to_string()),
        ("cluster-proxy", "http://squid.proxy.svc:3128".to_string()),
    ] {
        w.env
            .apply(&json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": ns},
                "stringData": {"address": address, "username": "u", "password": "p"},
            }))
            .await
            .expect("Secret");
        w.apply_source(
            name,
            json!({
                "url": "http://upstream.example/app.tgz", "interval": "1m",
                "proxySecretRef": {"name": name},
            }),
        )
        .await;
    }
    let hs = w.wait_ready("proxy", None).await;
    let bytes = w
        .controller
        .download(&text(&hs, "/status/artifact/url"))
        .await;
    assert_eq!(
        untgz(&bytes),
        [("app.yaml".to_string(), CONFIG_ONE.to_string())]
    );
    let seen = w.server.content.stats("app.tgz").seen;
    let through_proxy = seen.last().expect("a request through the proxy");
    // u:p
    assert_eq!(
        through_proxy.get("proxy-authorization").map(String::as_str),
        Some("Basic dTpw")
    );
    assert_eq!(
        through_proxy.get("host").map(String::as_str),
        Some("upstream.example")
    );

    let (_, message) = wait_blocked(&w, "refused-proxy").await;
    assert!(
        message.starts_with(
            "proxy http://127.0.0.4:3128/: address 127.0.0.4 is in the blocked loopback range"
        ),
        "{message}"
    );
    let (_, message) = wait_blocked(&w, "cluster-proxy").await;
    assert!(
        message.contains("'squid.proxy.svc' is a cluster-internal name"),
        "{message}"
    );
}

/// `interval` and `timeout` are bounded by the CRD: the API server refuses
/// zero, more than `8760h` (interval) or `1h` (timeout), and values beyond
/// what a duration holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_unbounded_durations() {
    let env = cluster().await;
    install_crds(&env).await;
    let ns = env.namespace("hs-bounds").await;
    let source = |name: &str, interval: &str, timeout: &str| {
        json!({
            "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
            "metadata": {"name": name, "namespace": ns.name()},
            "spec": {"url": "https://example.com/a.tgz", "interval": interval, "timeout": timeout},
        })
    };
    env.apply(&source("max", "8760h", "1h"))
        .await
        .expect("the largest durations are accepted");
    for (name, interval, timeout, needle) in [
        (
            "year-and-a-bit",
            "8761h",
            "1m",
            "interval must be greater than 0s and at most 8760h",
        ),
        ("huge", "99999999999999h", "1m", "interval"),
        ("zero", "0s", "1m", "interval must be greater than 0s"),
        (
            "long-timeout",
            "1m",
            "61m",
            "timeout must be greater than 0s and at most 1h",
        ),
        (
            "zero-timeout",
            "1m",
            "0ms",
            "timeout must be greater than 0s",
        ),
    ] {
        let err = env
            .apply(&source(name, interval, timeout))
            .await
            .expect_err(&format!("{interval}/{timeout} should be refused"));
        let err = format!("{err:#}");
        assert!(err.contains(needle), "{name}: {err}");
    }
}
