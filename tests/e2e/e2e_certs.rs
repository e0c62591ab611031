//! End to end: webhook certificates with nothing prepared by hand. Three
//! `openflux run` replicas share one Secret that their elected leader makes
//! (`--webhook-cert-secret`); each replica serves it, and short validities
//! force a CA rotation while admission requests keep coming: straight to
//! each replica's port, verified with the CA bundle of its webhook
//! configuration as the API server verifies it, and real admissions
//! through the API server. None may fail.

use openflux_testkit as support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Body;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use support::openflux::{free_addr, Openflux};
use support::{wait_for, Env};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const REPLICAS: usize = 3;
const SECRET: &str = "openflux-webhook-tls";
const REPLICA_LABEL: &str = "e2e.openflux.dev/replica";
const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
/// Short enough that a CA is replaced within the test: the serving
/// certificate is renewed after 20 s, the CA after 40 s (the new one
/// signs about 3 s after it is in every configuration), and the old CA
/// leaves the bundle when it expires at 60 s.
const CERT_VALIDITY: &str = "30s";
const CA_VALIDITY: &str = "60s";
/// Bound on the whole rotation, from the first CA to the old one pruned.
const ROTATION: Duration = Duration::from_secs(150);

/// The certificates of a PEM bundle.
fn certs_of(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    openflux::certs::parse_certs(pem).unwrap_or_default()
}

/// The CA bundle of each of the test's webhook configurations, kept by a
/// watch as the API server keeps it.
#[derive(Clone, Default)]
struct Bundles(Arc<RwLock<BTreeMap<String, Vec<u8>>>>);

impl Bundles {
    fn spawn(env: &Env, names: Vec<String>) -> (Self, tokio::task::JoinHandle<()>) {
        let bundles = Bundles::default();
        let kept = bundles.clone();
        let api: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
        let task = tokio::spawn(async move {
            let events = watcher(api, watcher::Config::default()).applied_objects();
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                let Ok(config) = event else { continue };
                let name = config.metadata.name.clone().unwrap_or_default();
                if !names.contains(&name) {
                    continue;
                }
                // Every entry: what all of them trust.
                let bundle = config
                    .webhooks
                    .iter()
                    .flatten()
                    .map(|w| w.client_config.ca_bundle.clone().unwrap_or_default().0)
                    .min_by_key(Vec::len)
                    .unwrap_or_default();
                kept.0.write().unwrap().insert(name, bundle);
            }
        });
        (bundles, task)
    }

    fn get(&self, name: &str) -> Vec<u8> {
        self.0
            .read()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    }
}

/// A TLS client trusting only the certificates of `bundle`.
fn client(bundle: &[u8]) -> Option<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs_of(bundle) {
        roots.add(cert).ok()?;
    }
    if roots.is_empty() {
        return None;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(openflux::certs::provider())
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Some(Arc::new(config))
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection to `addr` (as the configuration's URL names it, by
/// address) verified with `bundle`.
async fn connect(addr: SocketAddr, bundle: &[u8]) -> Result<Tls, String> {
    let config = client(bundle).ok_or("no CA bundle")?;
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::IpAddress(addr.ip().into());
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {addr}: {e}"))
}

fn leaf(tls: &Tls) -> Option<CertificateDer<'static>> {
    tls.get_ref().1.peer_certificates()?.first().cloned()
}

fn kustomization(ns: &str, name: &str, replica: usize) -> Value {
    json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": name, "namespace": ns, "labels": {REPLICA_LABEL: replica.to_string()}},
        "spec": {"interval": "10m", "prune": true, "path": "./",
                  "sourceRef": {"apiVersion": "e2e.openflux.dev/v1", "kind": "TestSource", "name": "web"}}
    })
}

/// One AdmissionReview to `/mutate` on `sender`; `Ok` when it was answered
/// with an allowed rewrite.
async fn review(
    sender: &mut hyper::client::conn::http1::SendRequest<Body>,
    ns: &str,
    uid: &str,
) -> Result<(), String> {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "kustomize.toolkit.fluxcd.io", "version": "v1", "kind": "Kustomization"},
            "resource": {"group": "kustomize.toolkit.fluxcd.io", "version": "v1", "resource": "kustomizations"},
            "operation": "CREATE", "namespace": ns, "name": "web",
            "userInfo": {"username": "e2e"}, "dryRun": true,
            "object": kustomization(ns, "web", 0)
        }
    });
    let request = hyper::Request::post("/mutate")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20)
        .await
        .map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{status}: {e}"))?;
    let response = &answer["response"];
    if status == 200 && response["uid"] == uid && response["allowed"] == true {
        Ok(())
    } else {
        Err(format!("{status}: {answer}"))
    }
}

async fn handshake(sender: Tls) -> hyper::client::conn::http1::SendRequest<Body> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(sender))
        .await
        .expect("an HTTP/1.1 connection");
    tokio::spawn(conn);
    sender
}

/// At most one round of requests every 20 ms per client: steady load that
/// leaves the machine to the other tests.
fn pace() -> tokio::time::Interval {
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pace
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl Counts {
    fn count(&self, result: Result<(), String>, what: &str) {
        match result {
            Ok(()) => self.ok.fetch_add(1, Ordering::SeqCst),
            Err(e) => {
                eprintln!("{what} failed: {e}");
                self.failed.fetch_add(1, Ordering::SeqCst)
            }
        };
    }
}

/// The Secret's CA bundle.
async fn secret_bundle(secrets: &Api<Secret>) -> Vec<CertificateDer<'static>> {
    let secret = secrets.get_opt(SECRET).await.ok().flatten();
    let ca = secret
        .and_then(|s| s.data)
        .and_then(|d| d.get("ca.crt").cloned())
        .unwrap_or_default();
    certs_of(&ca.0)
}

fn pem(cert: &CertificateDer<'_>) -> Vec<u8> {
    openflux::certs::pem_of(cert).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_make_share_and_rotate_one_secret_without_a_failed_admission() {
    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("certs").await;
    let n = ns.name().to_string();

    // One configuration per replica, each calling its replica for the
    // objects labelled with its number.
    let addrs: Vec<SocketAddr> = (0..REPLICAS).map(|_| free_addr()).collect();
    let mut webhooks = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let selector = json!({"matchLabels": {REPLICA_LABEL: i.to_string()}});
        webhooks.push(
            support::webhook::local_webhook_selecting(
                &env,
                &format!("certs{i}"),
                &n,
                *addr,
                Some(selector),
            )
            .await,
        );
    }
    let names: Vec<String> = webhooks.iter().map(|w| w.name.clone()).collect();
    let (bundles, bundle_watch) = Bundles::spawn(&env, names.clone());
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &n);
    assert!(secrets.get_opt(SECRET).await.unwrap().is_none());

    // Nothing prepared: three replicas, started together.
    let args: Vec<Vec<String>> = addrs
        .iter()
        .map(|addr| {
            let mut args = vec![
                "--watch-all-namespaces=false".to_string(),
                format!("--namespace={n}"),
                "--enable-leader-election".to_string(),
                format!("--webhook-addr={addr}"),
                "--webhook-cert-secret".to_string(),
                format!("--webhook-cert-validity={CERT_VALIDITY}"),
                format!("--webhook-ca-validity={CA_VALIDITY}"),
            ];
            args.extend(names.iter().map(|w| format!("--webhook-configuration={w}")));
            args
        })
        .collect();
    let start = |i: usize| {
        let args: Vec<&str> = args[i].iter().map(String::as_str).collect();
        let env = &env;
        async move { Openflux::start(env, &format!("certs-{i}"), &args).await }
    };
    // Each is ready only once it serves a certificate.
    let (a, b, c) = tokio::join!(start(0), start(1), start(2));
    let replicas = [a, b, c];

    let first_ca = secret_bundle(&secrets).await;
    assert_eq!(first_ca.len(), 1, "one CA in a new Secret");
    let first_ca = first_ca[0].clone();
    let secret = secrets.get(SECRET).await.unwrap();
    assert_eq!(
        secret
            .metadata
            .labels
            .unwrap_or_default()
            .get("app.kubernetes.io/managed-by"),
        Some(&"openflux".to_string())
    );

    // All three serve the same certificate, which each one's configuration trusts.
    wait_for(
        "every replica to serve the Secret's certificate, trusted by its configuration",
        support::TIMEOUT,
        || async {
            let mut served = Vec::new();
            for (addr, name) in addrs.iter().zip(&names) {
                let tls = connect(*addr, &bundles.get(name)).await.ok()?;
                served.push(leaf(&tls)?);
            }
            served.windows(2).all(|w| w[0] == w[1]).then_some(())
        },
    )
    .await;

    // Steady load: straight to each replica (a fresh handshake each time,
    // and one connection kept open through the rotation), and through the
    // API server (dry-run creates routed to each replica by label).
    let stop = tokio_util::sync::CancellationToken::new();
    let direct = Arc::new(Counts::default());
    let kept = Arc::new(Counts::default());
    let admitted = Arc::new(Counts::default());
    let mut load = tokio::task::JoinSet::new();
    for (i, (addr, name)) in addrs.iter().zip(&names).enumerate() {
        let (addr, name, ns) = (*addr, name.clone(), n.clone());
        let (bundles, stop, direct, kept) =
            (bundles.clone(), stop.clone(), direct.clone(), kept.clone());
        let open = connect(addr, &bundles.get(&name))
            .await
            .expect("a connection");
        load.spawn(async move {
            let mut open = handshake(open).await;
            let mut k = 0u64;
            let mut pace = pace();
            while !stop.is_cancelled() {
                pace.tick().await;
                k += 1;
                let fresh = match connect(addr, &bundles.get(&name)).await {
                    Ok(tls) => review(&mut handshake(tls).await, &ns, &format!("d{i}-{k}")).await,
                    Err(e) => Err(e),
                };
                direct.count(fresh, &format!("replica {i}"));
                let result = review(&mut open, &ns, &format!("k{i}-{k}")).await;
                kept.count(result, &format!("kept connection to replica {i}"));
            }
        });
    }
    {
        let (client, stop, admitted, ns) = (
            env.client.clone(),
            stop.clone(),
            admitted.clone(),
            n.clone(),
        );
        load.spawn(async move {
            let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
                client,
                &ns,
                &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                    "kustomize.toolkit.fluxcd.io",
                    "v1",
                    "Kustomization",
                )),
            );
            let mut k = 0usize;
            let mut pace = pace();
            while !stop.is_cancelled() {
                pace.tick().await;
                k += 1;
                let object = kustomization(&ns, &format!("web{k}"), k % REPLICAS);
                let result = api
                    .patch(
                        &format!("web{k}"),
                        &PatchParams::apply(support::FIELD_MANAGER).dry_run(),
                        &Patch::Apply(&object),
                    )
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|o| {
                        let kind = o.data["spec"]["sourceRef"]["kind"].clone();
                        (kind != "TestSource")
                            .then_some(())
                            .ok_or(format!("not rewritten: {kind}"))
                    });
                admitted.count(result, "admission through the API server");
            }
        });
    }

    // The CA is replaced: a new one signs what every replica serves...
    let new_ca = wait_for(
        "a new CA to sign what every replica serves",
        ROTATION,
        || async {
            let bundle = secret_bundle(&secrets).await;
            let signer = bundle.first().filter(|ca| **ca != first_ca)?.clone();
            for addr in &addrs {
                // Verified with the new CA alone.
                connect(*addr, &pem(&signer)).await.ok()?;
            }
            Some(signer)
        },
    )
    .await;
    // ... and the old one leaves the Secret's bundle once it expired.
    wait_for("the old CA to leave the Secret", ROTATION, || async {
        (secret_bundle(&secrets).await == vec![new_ca.clone()]).then_some(())
    })
    .await;
    // Then it leaves every entry of every configuration (a tenth of the
    // serving validity later), the new one staying.
    let configs: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    wait_for(
        "the old CA to leave every webhook configuration",
        support::TIMEOUT,
        || async {
            for name in &names {
                let config = configs.get(name).await.ok()?;
                for entry in config.webhooks.iter().flatten() {
                    let bundle = certs_of(&entry.client_config.ca_bundle.clone()?.0);
                    if bundle.contains(&first_ca) || !bundle.contains(&new_ca) {
                        return None;
                    }
                }
            }
            Some(())
        },
    )
    .await;
    let before = direct.ok.load(Ordering::SeqCst);
    wait_for("requests after the rotation", support::TIMEOUT, || async {
        (direct.ok.load(Ordering::SeqCst) >= before + 3 * REPLICAS as u64).then_some(())
    })
    .await;
    stop.cancel();
    while load.join_next().await.is_some() {}

    let get = |c: &Counts| (c.ok.load(Ordering::SeqCst), c.failed.load(Ordering::SeqCst));
    let (direct, kept, admitted) = (get(&direct), get(&kept), get(&admitted));
    println!(
        "requests during the rotation (ok, failed): straight to the replicas {direct:?}, on kept connections {kept:?}, through the API server {admitted:?}"
    );
    assert_eq!(
        (direct.1, kept.1, admitted.1),
        (0, 0, 0),
        "no request may fail"
    );
    assert!(
        direct.0 >= 30 && kept.0 >= 30 && admitted.0 >= 30,
        "too little load"
    );

    // A configuration whose bundle was emptied (a re-applied manifest) gets it back.
    configs
        .patch(
            &names[0],
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(
                    json!([{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}]),
                )
                .unwrap(),
            ),
        )
        .await
        .expect("emptying a CA bundle");
    wait_for(
        "the CA bundle to be written back",
        support::TIMEOUT,
        || async {
            let config = configs.get(&names[0]).await.ok()?;
            let bundle = config.webhooks?.first()?.client_config.ca_bundle.clone()?;
            certs_of(&bundle.0).contains(&new_ca).then_some(())
        },
    )
    .await;

    // The leader said what it did, on the Secret.
    wait_for(
        "an Event on the Secret for the new CA",
        support::TIMEOUT,
        || async {
            let notes = secret_events(&env, &n, "CertificateSecretWritten").await;
            notes.iter().any(|n| n.contains("new CA")).then_some(())
        },
    )
    .await;

    bundle_watch.abort();
    drop(replicas);
    ns.delete().await;
}

/// The notes of the Events of `reason` about the Secret.
async fn secret_events(env: &Env, ns: &str, reason: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), ns);
    let list = api.list(&Default::default()).await.expect("listing Events");
    list.items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(SECRET)
        })
        .filter_map(|e| e.note)
        .collect()
}

/// A Secret of that name made by someone else (not labelled as openflux's)
/// is served as it is, never written, and the leader says so on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_openflux_did_not_make_is_served_and_never_written() {
    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("certs-own").await;
    let n = ns.name().to_string();
    let ca = openflux::certs::Authority::generate(openflux::certs::DEFAULT_CA_VALIDITY).unwrap();
    let issued = ca
        .issue(
            &["localhost".into()],
            &["127.0.0.1".parse().unwrap()],
            openflux::certs::DEFAULT_CERT_VALIDITY,
        )
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &n);
    let made = secrets
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": SECRET},
                "type": "kubernetes.io/tls",
                "stringData": {"ca.crt": ca.cert_pem, "tls.crt": issued.cert_pem, "tls.key": issued.key_pem}
            }))
            .unwrap(),
        )
        .await
        .expect("creating the Secret");
    let addr = free_addr();
    let webhook = support::webhook::local_webhook(&env, "certs-own", &n, addr).await;
    let args = [
        "--watch-all-namespaces=false".to_string(),
        format!("--namespace={n}"),
        "--enable-leader-election".to_string(),
        format!("--webhook-addr={addr}"),
        "--webhook-cert-secret".to_string(),
        format!("--webhook-configuration={}", webhook.name),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let of = Openflux::start(&env, "certs-own", &args).await;
    let tls = connect(addr, ca.cert_pem.as_bytes())
        .await
        .expect("the Secret's certificate, trusted by its CA");
    assert_eq!(
        leaf(&tls),
        openflux::certs::parse_certs(issued.cert_pem.as_bytes())
            .unwrap()
            .first()
            .cloned()
    );
    wait_for("a Warning on the Secret", support::TIMEOUT, || async {
        let notes = secret_events(&env, &n, "CertificateSecretFailed").await;
        notes
            .iter()
            .any(|n| n.contains("not labelled"))
            .then_some(())
    })
    .await;
    let now = secrets.get(SECRET).await.unwrap();
    assert_eq!(
        now.metadata.resource_version, made.metadata.resource_version,
        "openflux wrote a Secret it did not make"
    );
    drop(of);
    drop(webhook);
    ns.delete().await;
}

/// The leader killed (no shutdown, no Lease release) after it made the
/// Secret: the other replica takes the Lease and goes on from the Secret as
/// it is, renewing its serving certificate under the same CA rather than
/// starting over, and keeps serving throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_goes_on_from_the_secret_the_old_one_made() {
    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("certs-lead").await;
    let n = ns.name().to_string();
    let addrs = [free_addr(), free_addr()];
    let args: Vec<Vec<String>> = addrs
        .iter()
        .map(|addr| {
            vec![
                "--watch-all-namespaces=false".to_string(),
                format!("--namespace={n}"),
                "--enable-leader-election".to_string(),
                "--leader-election-lease-duration=4s".to_string(),
                "--leader-election-renew-deadline=3s".to_string(),
                "--leader-election-retry-period=1s".to_string(),
                format!("--webhook-addr={addr}"),
                "--webhook-cert-secret".to_string(),
                format!("--webhook-cert-validity={CERT_VALIDITY}"),
                "--webhook-ca-validity=1h".to_string(),
            ]
        })
        .collect();
    let start = |i: usize| {
        let args: Vec<&str> = args[i].iter().map(String::as_str).collect();
        let env = &env;
        async move { Openflux::start(env, &format!("certs-lead-{i}"), &args).await }
    };
    let (a, b) = tokio::join!(start(0), start(1));
    let mut replicas = [a, b];
    let leader = wait_for("a leader", support::TIMEOUT, || async {
        for (i, of) in replicas.iter().enumerate() {
            if of.metric("openflux_leader ").await == Some(1.0) {
                return Some(i);
            }
        }
        None
    })
    .await;
    let survivor = 1 - leader;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &n);
    let ca = secret_bundle(&secrets).await;
    assert_eq!(ca.len(), 1);
    let first_leaf = secrets.get(SECRET).await.unwrap().data.unwrap()["tls.crt"].clone();

    replicas[leader].kill();
    wait_for("the other replica to lead", support::TIMEOUT, || async {
        (replicas[survivor].metric("openflux_leader ").await == Some(1.0)).then_some(())
    })
    .await;
    // The serving certificate is renewed (after 20 s) by the new leader,
    // under the CA the old one made, and served.
    let renewed = wait_for("the serving certificate renewed", ROTATION, || async {
        let data = secrets.get(SECRET).await.ok()?.data?;
        let leaf = data.get("tls.crt")?.clone();
        (leaf != first_leaf).then_some(leaf)
    })
    .await;
    assert_eq!(secret_bundle(&secrets).await, ca, "the CA was kept");
    wait_for("the survivor to serve it", support::TIMEOUT, || async {
        let tls = connect(addrs[survivor], &pem(&ca[0])).await.ok()?;
        (leaf(&tls)? == certs_of(&renewed.0)[0]).then_some(())
    })
    .await;
    drop(replicas);
    ns.delete().await;
}

/// RBAC lets openflux create any Secret in its namespace (create cannot be
/// limited by name); the shipped policy narrows that to its certificate
/// Secret, so its identity cannot mint, say, a ServiceAccount token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openflux_may_create_no_secret_but_its_certificates() {
    let env = support::cluster().await;
    env.apply_yaml(include_str!("../../webhook-config/secret-policy.yaml"))
        .await
        .expect("the shipped Secret policy");
    let ns = env.namespace("certs-policy").await;
    let n = ns.name().to_string();
    support::identity::grant_runtime_namespace(&env, &n).await;
    let (sa_ns, sa) = support::identity::openflux_account();
    let secrets: Api<Secret> = Api::namespaced(support::identity::acting_as(&env, sa_ns, sa), &n);
    let create = |name: String, type_: &str| {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name,
                         "annotations": {"kubernetes.io/service-account.name": "default"}},
            "type": type_,
            "stringData": {"tls.crt": "x", "tls.key": "y"}
        }))
        .unwrap();
        let secrets = secrets.clone();
        async move { secrets.create(&Default::default(), &secret).await }
    };
    let mut k = 0;
    let refused = wait_for(
        "the policy to refuse a token Secret",
        support::TIMEOUT,
        || {
            k += 1;
            let attempt = create(format!("token{k}"), "kubernetes.io/service-account-token");
            async move { attempt.await.err().map(|e| e.to_string()) }
        },
    )
    .await;
    assert!(
        refused.contains("openflux may write only the Secret openflux-webhook-tls"),
        "{refused}"
    );
    let err = create(SECRET.into(), "Opaque")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("of type kubernetes.io/tls"), "{err}");
    create(SECRET.into(), "kubernetes.io/tls")
        .await
        .expect("its certificate Secret");
    ns.delete().await;
}

/// Sharded, the leader of the main shard alone keeps the certificate
/// Secret. A shard's leader (its API traffic seen through a proxy) serves
/// the Secret and never writes it: not while the main shard runs, not when
/// the Secret is deleted with the main shard down, and the Secret the main
/// shard makes again once it is back is served by the shard too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_main_shards_leader_writes_the_secret() {
    let env = support::cluster().await;
    support::install_artifact_crd(&env).await;
    support::wait_established(&env, &["artifacts.openflux.dev"]).await;
    let ns = env.namespace("certs-shards").await;
    let n = ns.name().to_string();
    let args = |selector: &str, addr: SocketAddr| -> Vec<String> {
        vec![
            "--watch-all-namespaces=false".to_string(),
            format!("--namespace={n}"),
            "--enable-leader-election".to_string(),
            "--leader-election-lease-duration=4s".to_string(),
            "--leader-election-renew-deadline=3s".to_string(),
            "--leader-election-retry-period=1s".to_string(),
            format!("--watch-label-selector={selector}"),
            format!("--webhook-addr={addr}"),
            "--webhook-cert-secret".to_string(),
        ]
    };
    let start_main = || {
        let main_args = args("!sharding.fluxcd.io/key", free_addr());
        let env = &env;
        async move {
            let main_args: Vec<&str> = main_args.iter().map(String::as_str).collect();
            Openflux::start(env, "certs-main", &main_args).await
        }
    };
    let main = start_main().await;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &n);
    let first = secrets.get(SECRET).await.expect("the main shard's Secret");

    let identity = support::identity::openflux_kubeconfig(&env).expect("a kubeconfig for openflux");
    let proxy = support::proxy::ApiProxy::start(&identity).await;
    let shard_addr = free_addr();
    let shard_args = args("sharding.fluxcd.io/key=shard1", shard_addr);
    let shard_args: Vec<&str> = shard_args.iter().map(String::as_str).collect();
    let shard =
        Openflux::start_as(&env, "certs-shard1", &shard_args, Some(proxy.kubeconfig())).await;
    wait_for("the shard to lead", support::TIMEOUT, || async {
        (shard.metric("openflux_leader ").await == Some(1.0)).then_some(())
    })
    .await;

    // With the main shard down, the Secret deleted: the shard's leader,
    // woken by the deletion, leaves it to the main shard.
    drop(main);
    secrets
        .delete(SECRET, &Default::default())
        .await
        .expect("deleting the Secret");
    let main = start_main().await;
    let made = wait_for("the Secret made again", support::TIMEOUT, || async {
        let secret = secrets.get_opt(SECRET).await.ok()??;
        (secret.metadata.uid != first.metadata.uid).then_some(secret)
    })
    .await;
    let ca = made.data.expect("the Secret's data")["ca.crt"].0.clone();
    wait_for(
        "the shard to serve the new Secret",
        support::TIMEOUT,
        || async { connect(shard_addr, &ca).await.ok().map(|_| ()) },
    )
    .await;
    let written: Vec<_> = proxy
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/secrets") || w.path.contains("webhookconfigurations"))
        .collect();
    assert!(
        written.is_empty(),
        "the shard's leader wrote what the main shard keeps: {written:#?}"
    );
    drop((main, shard));
    ns.delete().await;
}
