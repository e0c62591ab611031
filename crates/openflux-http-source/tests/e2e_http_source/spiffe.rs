//! The artifact server over SPIFFE mutual TLS, against a real Workload API
//! (a SPIRE server and agent, see `openflux_testkit::spire`).
//!
//! kustomize-controller v1.10 with `--authorized-artifact-server-spiffe-id`
//! cannot be built here (its module's dependencies are refused by the Go
//! module proxy, see e2e/versions.env), so the consumer's side is
//! `spiffe-fetch` (e2e/go/spiffe-fetch): a fetch client built on go-spiffe
//! v2, as kustomize-controller v1.10 is, that presents its own X.509-SVID
//! and accepts only servers whose SPIFFE ID it authorizes, in Flux's ID
//! syntax. Each identity is a binary registered by its path (the unix
//! workload attestor): the controller, a copy of spiffe-fetch standing for
//! kustomize-controller and another copy standing for a workload the
//! controller must refuse.

use super::*;
use support::spire::Spire;

/// What one run of spiffe-fetch gave.
struct Fetched {
    ok: bool,
    /// Its JSON line on success.
    report: serde_json::Value,
    stderr: String,
    body: Vec<u8>,
}

/// Runs `client` (a copy of spiffe-fetch) against `url`, accepting the
/// servers `servers` names.
async fn fetch(client: &Path, spire: &Spire, servers: &[String], url: &str) -> Fetched {
    let out_dir = tempfile::tempdir().expect("temp dir");
    let output = out_dir.path().join("artifact.tar.gz");
    let mut command = Command::new(client);
    command
        .env("SPIFFE_ENDPOINT_SOCKET", spire.endpoint())
        .arg(format!("--output={}", output.display()))
        .arg("--timeout=60s")
        .args(
            servers
                .iter()
                .map(|s| format!("--authorized-artifact-server-spiffe-id={s}")),
        )
        .arg(url)
        .stdin(Stdio::null());
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("spiffe-fetch task")
        .expect("running spiffe-fetch");
    let ok = out.status.success();
    Fetched {
        ok,
        report: serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        body: if ok {
            std::fs::read(&output).expect("the fetched artifact")
        } else {
            Vec::new()
        },
    }
}

/// A copy of spiffe-fetch at `dir/name`: another executable path, so
/// another workload identity.
fn fetch_client(spire: &Spire, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy(spire.bin.join("spiffe-fetch"), &path).expect("copying spiffe-fetch");
    path
}

/// Plain HTTP to the mTLS port: no HTTP answer at all.
async fn plain_http(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let _ = stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_artifacts_over_spiffe_mtls_to_authorized_clients_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let env = cluster().await;
    install_crds(&env).await;
    let ns = env.namespace("hs-spiffe").await;
    // A trust domain no other test uses, and identities shaped as a SPIFFE
    // runtime on Kubernetes would give them, but of this test's own.
    let trust_domain = format!("{}.openflux.test", ns.name());
    let spire = Spire::start(dir.path(), &trust_domain).await;
    let kc_path = "/ns/flux-system/sa/kustomize-controller";
    let kc = fetch_client(&spire, dir.path(), "kustomize-controller");
    let intruder = fetch_client(&spire, dir.path(), "intruder");
    // The controller's SVIDs live 30 s: the agent rotates them while the
    // test runs, and the server must serve the new one without a restart.
    let server_id = spire.register(
        &format!("/ns/{}/sa/openflux-http-source", ns.name()),
        &binary(),
        Duration::from_secs(30),
    );
    let kc_id = spire.register(kc_path, &kc, Duration::from_secs(3600));
    let intruder_id = spire.register(
        &format!("/ns/{}/sa/intruder", ns.name()),
        &intruder,
        Duration::from_secs(3600),
    );

    let kubeconfig = service_account_kubeconfig(&env, ns.name(), dir.path()).await;
    let server = ContentServer::start().await;
    let mut launch = Launch::new(
        ns.name(),
        &[
            // Any workload under flux-system's path in this process's own
            // trust domain, and an ID of a trust domain nobody has.
            "--authorized-artifact-client-spiffe-id=spiffe://self/ns/flux-system/".to_string(),
            "--authorized-artifact-client-spiffe-id=spiffe://elsewhere.test/ns/flux-system/sa/kustomize-controller".to_string(),
        ],
    );
    launch
        .env
        .push(("SPIFFE_ENDPOINT_SOCKET".to_string(), spire.endpoint()));
    let controller = Controller::launch(&kubeconfig, ns.name(), launch).await;
    assert!(
        controller.log_text().contains(&server_id),
        "the controller logs the SPIFFE ID it serves with"
    );

    let served = tgz(&[("deploy/app.yaml", CONFIG_ONE)], 1_700_000_000, 1000);
    server.content.put("app.tar.gz", served);
    env.apply(&json!({
        "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
        "metadata": {"name": "app", "namespace": ns.name()},
        "spec": {"url": server.url("app.tar.gz"), "interval": "1m"},
    }))
    .await
    .expect("applying the HttpSource");
    let artifact = wait_for("the Artifact", TIMEOUT, || async {
        env.get(ARTIFACT, "Artifact", Some(ns.name()), "app")
            .await
            .ok()
            .flatten()
            .filter(|a| field(a, "/spec/url").is_some())
    })
    .await;
    let url = text(&artifact, "/spec/url");
    let digest = text(&artifact, "/spec/digest");
    assert_eq!(
        url,
        format!(
            "https://{}/{}/app/{}.tar.gz",
            controller.storage_addr,
            ns.name(),
            digest.trim_start_matches("sha256:")
        ),
        "served over mTLS, the artifact URL is https"
    );

    // kustomize-controller, authorizing the controller's exact ID, gets
    // the custom source's artifact: the bytes the Artifact's digest names.
    let got = fetch(&kc, &spire, std::slice::from_ref(&server_id), &url).await;
    assert!(got.ok, "authorized fetch failed: {}", got.stderr);
    assert_eq!(sha256(&got.body), digest);
    assert_eq!(got.report["serverID"], server_id.as_str());
    assert_eq!(got.report["clientID"], kc_id.as_str());
    assert_eq!(got.report["tls"], "TLS 1.3");
    assert_eq!(
        untgz(&got.body),
        [("deploy/app.yaml".to_string(), CONFIG_ONE.to_string())]
    );
    let first_serial = got.report["serverSerial"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    // The trust domain form authorizes the controller too.
    let by_domain = fetch(&kc, &spire, &[format!("spiffe://{trust_domain}")], &url).await;
    assert!(
        by_domain.ok,
        "trust domain authorization failed: {}",
        by_domain.stderr
    );

    // A consumer that authorizes another server refuses this one.
    let other = spire.id(&format!("/ns/{}/sa/source-controller", ns.name()));
    let refused = fetch(
        &kc,
        &spire,
        &[
            other.clone(),
            format!("spiffe://{trust_domain}/ns/{}/sa/", "flux-system"),
        ],
        &url,
    )
    .await;
    assert!(
        !refused.ok,
        "a server whose SPIFFE ID is not authorized was accepted"
    );
    assert!(
        refused
            .stderr
            .contains("unauthorized artifact server SPIFFE ID")
            && refused.stderr.contains(&server_id),
        "{}",
        refused.stderr
    );

    // The controller refuses a client whose SPIFFE ID it does not
    // authorize, during the handshake, and counts and logs it.
    let intruded = fetch(&intruder, &spire, std::slice::from_ref(&server_id), &url).await;
    assert!(!intruded.ok, "an unauthorized client got the artifact");
    assert!(intruded.body.is_empty());
    let unauthorized = "openflux_spiffe_peers_total{result=\"unauthorized\"}";
    wait_for("the refused client counted", TIMEOUT, || async {
        (controller.metric(unauthorized).await.unwrap_or(0.0) >= 1.0).then_some(())
    })
    .await;
    assert!(
        controller
            .metric("openflux_spiffe_peers_total{result=\"authorized\"}")
            .await
            >= Some(2.0)
    );
    assert!(
        controller
            .json_log()
            .iter()
            .any(|l| l["peer"] == intruder_id.as_str()),
        "the refused client's SPIFFE ID is logged"
    );
    // Plain HTTP, and TLS without a client certificate, get nothing.
    let answer = plain_http(controller.storage_addr).await;
    assert!(
        !answer.contains(" 200 "),
        "plain HTTP was answered: {answer}"
    );

    // The agent rotates the controller's SVID; new handshakes get the new
    // certificate from the running server.
    let rotated = wait_for(
        "the controller's rotated SVID to be served",
        Duration::from_secs(120),
        || async {
            let got = fetch(&kc, &spire, std::slice::from_ref(&server_id), &url).await;
            assert!(got.ok, "fetch after rotation failed: {}", got.stderr);
            let serial = got.report["serverSerial"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (serial != first_serial).then_some(serial)
        },
    )
    .await;
    assert!(!rotated.is_empty());
}
