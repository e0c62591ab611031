//! End to end: openflux scaled out as Flux shards. Two `openflux run`
//! processes on the local control plane, one with
//! `--watch-label-selector=sharding.fluxcd.io/key=shard1`, the main one with
//! `--watch-label-selector=!sharding.fluxcd.io/key`, each electing its
//! leader on its own Lease and serving the webhook from one certificate
//! (as replicas behind one Service do). Stock and custom sources live in
//! both shards: each is mirrored or exported by exactly one process, a
//! source moved to the other shard is handed over, and consumers of the
//! sources of both shards are rewritten by the webhook of either process
//! and become Ready.

use std::path::Path;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::ResourceExt;
use openflux::runtime::LEADER_ELECTION_ID;
use openflux::shard::{lease_name, SHARD_LABEL};
use serde_json::{json, Value};
use support::exports::{source_revision, wait_export};
use support::openflux::{free_addr, publish, Openflux};
use support::webhook::{local_webhook, Webhook};
use support::{cluster, field, ready_condition, unique_name, wait_for, Env, TIMEOUT};

use openflux_testkit as support;

const ARTIFACT: &str = "openflux.dev/v1alpha1";
const SOURCE: &str = "source.toolkit.fluxcd.io/v1";
const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const GROUP: &str = "shards.e2e.openflux.dev";
const TEST_SOURCE: &str = "shards.e2e.openflux.dev/v1";
/// The selectors of Flux's sharding guide.
const SHARD1: &str = "sharding.fluxcd.io/key=shard1";
const MAIN: &str = "!sharding.fluxcd.io/key";
const WEBHOOK_PREFIX: &str = "openflux-e2e-shards";

/// The labels of an object in shard `shard` (`None`: the main shard).
fn shard_labels(shard: Option<&str>) -> Value {
    match shard {
        Some(s) => json!({ SHARD_LABEL: s }),
        None => json!({}),
    }
}

/// One shard's `openflux run`: leader election in `ns`, the webhook on
/// `addr` with the certificate in `certs`, keeping the CA bundle of the
/// test's webhook configuration (which calls one of them: every write of
/// an Artifact goes through it).
async fn start_shard(env: &Env, ns: &str, selector: &str, certs: &Path, addr: &str) -> Openflux {
    let file = |f: &str| certs.join(f).display().to_string();
    let args = [
        "--watch-all-namespaces=false".to_string(),
        format!("--namespace={ns}"),
        "--enable-leader-election".to_string(),
        format!("--watch-label-selector={selector}"),
        format!("--webhook-addr={addr}"),
        format!("--tls-cert-file={}", file("tls.crt")),
        format!("--tls-key-file={}", file("tls.key")),
        format!("--tls-ca-file={}", file("ca.crt")),
        format!("--webhook-configuration={WEBHOOK_PREFIX}-{ns}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let name = if selector == MAIN { "main" } else { "shard1" };
    Openflux::start(env, name, &args).await
}

/// How often `of` wrote or reconciled the Artifact `ns`/`name`: for a
/// mirrored one (which has no per-object series), its log lines saying it
/// mirrored that Artifact; for another, its per-object reconcile histogram.
async fn reconciles(of: &Openflux, ns: &str, name: &str) -> f64 {
    if name.starts_with("gitrepository-") {
        let log = std::fs::read_to_string(&of.log).unwrap_or_default();
        let artifact = format!("\"{name}\"");
        return log
            .lines()
            .filter(|l| l.contains("mirrored artifact") && l.contains(&artifact))
            .count() as f64;
    }
    let (name, ns) = (format!("name=\"{name}\""), format!("namespace=\"{ns}\""));
    of.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("gotk_reconcile_duration_seconds_count{"))
        .filter(|l| l.contains("kind=\"Artifact\"") && l.contains(&name) && l.contains(&ns))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metric(of: &Openflux, prefix: &str) -> f64 {
    of.metric(prefix).await.unwrap_or(0.0)
}

const MIRRORED: &str = "openflux_mirrored_writes_total{kind=\"GitRepository\"}";
const REWRITTEN: &str =
    "openflux_admission_requests_total{consumer=\"kustomizations\",outcome=\"rewritten\"}";

/// A ConfigMap `name` holding `value`, as a manifest in a source.
fn configmap(name: &str, value: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: {value}\n")
}

/// The custom source `name` in `shard` with its Artifact at `version`, as
/// its producer keeps them: the Artifact owned by the source and carrying
/// its shard label. Returns the Artifact's revision.
async fn custom_source(
    env: &Env,
    ns: &str,
    name: &str,
    shard: Option<&str>,
    version: &str,
) -> String {
    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": name, "namespace": ns, "labels": shard_labels(shard)},
            "spec": {"anything": "goes"}
        }))
        .await
        .expect("creating the custom source");
    let uid = source.uid().expect("uid");
    let spec = publish(
        env.fixtures(),
        ns,
        name,
        version,
        &[("cm.yaml", &configmap(name, version))],
    );
    env.apply(&json!({
        "apiVersion": ARTIFACT, "kind": "Artifact",
        "metadata": {"name": name, "namespace": ns, "labels": shard_labels(shard),
                     "ownerReferences": [{"apiVersion": TEST_SOURCE, "kind": "TestSource",
                                          "name": name, "uid": uid, "controller": true}]},
        "spec": spec,
    }))
    .await
    .expect("writing the Artifact");
    spec["revision"].as_str().expect("revision").to_string()
}

/// Creates a Kustomization in `shard` deploying custom source `source`;
/// returns the stored object (as the webhook left it).
async fn consumer(
    env: &Env,
    ns: &str,
    name: &str,
    shard: Option<&str>,
    source: &str,
) -> DynamicObject {
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": name, "namespace": ns, "labels": shard_labels(shard)},
        "spec": {"interval": "10m", "prune": true, "path": "./", "targetNamespace": ns,
                 "sourceRef": {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": source}}
    }))
    .await
    .unwrap_or_else(|e| panic!("creating Kustomization {name}: {e:#}"))
}

fn assert_rewritten(stored: &DynamicObject, source: &str) {
    let target = field(stored, "/spec/sourceRef")
        .cloned()
        .unwrap_or_default();
    assert_ne!(
        target["kind"],
        "TestSource",
        "{} not rewritten: {target}",
        stored.name_any()
    );
    assert_eq!(
        target["name"],
        openflux::names::identity::source_export_name(GROUP, "TestSource", source),
        "{target}"
    );
}

async fn wait_kustomization_ready(env: &Env, ns: &str, name: &str) {
    wait_for(
        &format!("Kustomization {name} to be Ready"),
        TIMEOUT,
        || async {
            let k = env.find(KUSTOMIZE, "Kustomization", ns, name).await?;
            (ready_condition(&k)?.0 == "True").then_some(())
        },
    )
    .await;
}

/// Waits until the Artifact mirrored from GitRepository `name` carries the
/// source's revision and `shard`'s label; returns it.
async fn wait_mirrored(env: &Env, ns: &str, name: &str, shard: Option<&str>) -> DynamicObject {
    let artifact = format!("gitrepository-{name}");
    wait_for(
        &format!("Artifact {artifact} in shard {shard:?}"),
        TIMEOUT,
        || async {
            let a = env.find(ARTIFACT, "Artifact", ns, &artifact).await?;
            let source = env.find(SOURCE, "GitRepository", ns, name).await?;
            let revision = field(&source, "/status/artifact/revision")?;
            let current = field(&a, "/spec/revision") == Some(revision);
            let labelled = a.labels().get(SHARD_LABEL).map(String::as_str) == shard;
            (current && labelled).then_some(a)
        },
    )
    .await
}

/// Points the test's webhook configuration at `addr` and waits until the
/// API server calls that process (its counter of rewritten Kustomizations
/// grows on a server-side dry run).
async fn route_webhook_to(env: &Env, ns: &str, addr: &str, to: &Openflux) -> Webhook {
    let addr = addr.parse().expect("webhook address");
    let webhook = local_webhook(env, WEBHOOK_PREFIX, ns, addr).await;
    let probe = serde_json::to_string(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "probe", "namespace": ns},
        "spec": {"interval": "10m", "prune": true, "path": "./",
                 "sourceRef": {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "probe"}}
    }))
    .expect("probe");
    let before = metric(to, REWRITTEN).await;
    wait_for(
        "the API server to call the chosen webhook",
        TIMEOUT,
        || async {
            let out = env.run_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&probe));
            (out.status.success() && metric(to, REWRITTEN).await > before).then_some(())
        },
    )
    .await;
    webhook
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_belongs_to_one_shard_and_every_webhook_answers_for_all() {
    let env = cluster().await;
    let fx = env.fixtures();
    support::install_artifact_crd(&env).await;
    support::install_test_source_crd(&env, GROUP).await;
    support::wait_established(
        &env,
        &["artifacts.openflux.dev", &format!("testsources.{GROUP}")],
    )
    .await;
    let ns = env.namespace("shards").await;
    let n = ns.name().to_string();

    // One serving certificate for both processes, as replicas mount one Secret.
    let certs = tempfile::tempdir().expect("temp dir");
    let made = std::process::Command::new(support::openflux::binary())
        .args([
            "certs",
            "--ip",
            "127.0.0.1",
            "--dns-name",
            "localhost",
            "--out-dir",
        ])
        .arg(certs.path())
        .output()
        .expect("running openflux certs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (one_addr, main_addr) = (free_addr().to_string(), free_addr().to_string());
    let webhook = local_webhook(&env, WEBHOOK_PREFIX, &n, one_addr.parse().expect("addr")).await;
    let one = start_shard(&env, &n, SHARD1, certs.path(), &one_addr).await;
    let main = start_shard(&env, &n, MAIN, certs.path(), &main_addr).await;

    // Each shard leads on a Lease of its own, named as Flux names them.
    for of in [&one, &main] {
        wait_for("both shards to lead", TIMEOUT, || async {
            (metric(of, "openflux_leader ").await == 1.0).then_some(())
        })
        .await;
    }
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &n);
    let mut holders = Vec::new();
    for selector in [SHARD1, MAIN] {
        let name = lease_name(LEADER_ELECTION_ID, selector);
        assert_ne!(name, LEADER_ELECTION_ID);
        let lease = leases.get(&name).await.expect("the shard's Lease");
        holders.push(
            lease
                .spec
                .and_then(|s| s.holder_identity)
                .expect("a holder"),
        );
    }
    assert_ne!(holders[0], holders[1], "one leader per shard");
    assert!(leases
        .get_opt(LEADER_ELECTION_ID)
        .await
        .expect("GET")
        .is_none());

    // Stock sources in both shards: each mirrored by its shard only.
    let (repo, _) = fx
        .create_repo(
            &unique_name("shards"),
            &[("cm.yaml", &configmap("git", "one"))],
        )
        .expect("creating a git repository");
    for (name, shard) in [("git-one", Some("shard1")), ("git-main", None)] {
        env.apply(&json!({
            "apiVersion": SOURCE, "kind": "GitRepository",
            "metadata": {"name": name, "namespace": n, "labels": shard_labels(shard)},
            "spec": {"url": repo.url, "interval": "10m", "ref": {"branch": "main"}}
        }))
        .await
        .expect("creating a GitRepository");
    }
    wait_mirrored(&env, &n, "git-one", Some("shard1")).await;
    wait_mirrored(&env, &n, "git-main", None).await;
    assert_eq!(
        (metric(&one, MIRRORED).await, metric(&main, MIRRORED).await),
        (1.0, 1.0)
    );

    // Custom sources in both shards: each exported by its shard only.
    let sources = [
        ("one-a", Some("shard1")),
        ("main-a", None),
        ("one-b", Some("shard1")),
        ("main-b", None),
    ];
    for (name, shard) in sources {
        custom_source(&env, &n, name, shard, "v1").await;
    }
    for (name, _) in sources {
        wait_export(&env, &n, name, |_| true).await;
    }
    for (name, shard) in sources.iter().map(|(n, s)| (*n, *s)).chain([
        ("gitrepository-git-one", Some("shard1")),
        ("gitrepository-git-main", None),
    ]) {
        // A reconcile is counted when it returns, just after its write is
        // visible: wait for the owner's count before reading both.
        let owner = if shard.is_some() { &one } else { &main };
        wait_for("the owning shard's reconcile counted", TIMEOUT, || async {
            (reconciles(owner, &n, name).await > 0.0).then_some(())
        })
        .await;
        let (by_one, by_main) = (
            reconciles(&one, &n, name).await,
            reconciles(&main, &n, name).await,
        );
        match shard {
            Some(_) => assert!(
                by_one > 0.0 && by_main == 0.0,
                "{name}: {by_one} / {by_main}"
            ),
            None => assert!(
                by_one == 0.0 && by_main > 0.0,
                "{name}: {by_one} / {by_main}"
            ),
        }
    }

    // Every process indexes the Artifacts of both shards: its webhook
    // answers for all of them.
    for of in [&one, &main] {
        wait_for("every Artifact in each owner index", TIMEOUT, || async {
            (metric(of, "openflux_indexed_artifacts ").await == 6.0).then_some(())
        })
        .await;
    }

    // The webhook of either process rewrites consumers of both shards' sources.
    let to_one = route_webhook_to(&env, &n, &one_addr, &one).await;
    let main_before = metric(&main, REWRITTEN).await;
    for (ks, shard, source) in [
        ("ks-one-a", Some("shard1"), "one-a"),
        ("ks-main-a", None, "main-a"),
    ] {
        assert_rewritten(&consumer(&env, &n, ks, shard, source).await, source);
    }
    assert_eq!(
        metric(&main, REWRITTEN).await,
        main_before,
        "the main shard's webhook was not called"
    );
    let to_main = route_webhook_to(&env, &n, &main_addr, &main).await;
    let one_before = metric(&one, REWRITTEN).await;
    for (ks, shard, source) in [
        ("ks-one-b", Some("shard1"), "one-b"),
        ("ks-main-b", None, "main-b"),
    ] {
        assert_rewritten(&consumer(&env, &n, ks, shard, source).await, source);
    }
    assert_eq!(
        metric(&one, REWRITTEN).await,
        one_before,
        "shard1's webhook was not called"
    );
    for (name, _) in sources {
        wait_kustomization_ready(&env, &n, &format!("ks-{name}")).await;
        support::configmap_holds(&env, &n, name, "v1", TIMEOUT).await;
    }

    // Moved to shard1 (its producer labels the source and the Artifact), at
    // a new revision: shard1 exports it, its consumer follows; from then on
    // the main shard never looks at it, through one more revision.
    assert_eq!(reconciles(&one, &n, "main-a").await, 0.0);
    for version in ["v2", "v3"] {
        let main_looked = reconciles(&main, &n, "main-a").await;
        let revision = custom_source(&env, &n, "main-a", Some("shard1"), version).await;
        wait_export(&env, &n, "main-a", |e| {
            source_revision(e).as_deref() == Some(&revision)
        })
        .await;
        support::configmap_holds(&env, &n, "main-a", version, TIMEOUT).await;
        assert!(reconciles(&one, &n, "main-a").await > 0.0);
        if version == "v3" {
            assert_eq!(reconciles(&main, &n, "main-a").await, main_looked);
        }
    }
    // A stock source moved: its Artifact follows, written by shard1 alone.
    let label = format!("{SHARD_LABEL}=shard1");
    let out = env.run_kubectl(
        &["label", "-n", &n, "gitrepository", "git-main", &label],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_mirrored(&env, &n, "git-main", Some("shard1")).await;
    assert_eq!(
        (metric(&one, MIRRORED).await, metric(&main, MIRRORED).await),
        (2.0, 1.0)
    );
    wait_kustomization_ready(&env, &n, "ks-main-a").await;

    drop((one, main, to_main, to_one, webhook));
    ns.delete().await;
}

/// The sharding component, from an overlay of `manifests/` as a user writes
/// it: `kubectl kustomize` renders the main Deployment and one per shard,
/// with non-overlapping selectors, one webhook Service over all of them,
/// the same pod spec but for each one's selector, and each its own Lease;
/// the API server accepts it (server-side dry run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sharding_component_deploys_a_shard_beside_the_main_one() {
    let env = cluster().await;
    let overlay = support::workspace_root()
        .join("target")
        .join(unique_name("sharding-overlay"));
    std::fs::create_dir_all(&overlay).expect("overlay dir");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources: [../../manifests]\ncomponents: [../../manifests/components/sharding]\n",
    )
    .expect("writing the overlay");
    let dir = overlay.display().to_string();
    let out = env.run_kubectl(&["kustomize", &dir], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8_lossy(&out.stdout).to_string();
    let objects: Vec<Value> = rendered
        .split("\n---\n")
        .map(|doc| serde_yaml_ng::from_str(doc).expect("a rendered object"))
        .collect();
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} not rendered"))
            .clone()
    };
    let selects = |selector: &Value, labels: &Value| {
        selector
            .as_object()
            .expect("matchLabels")
            .iter()
            .all(|(k, v)| &labels[k] == v)
    };
    let shards = [
        ("openflux", MAIN),
        ("openflux-shard1", SHARD1),
        ("openflux-shard2", "sharding.fluxcd.io/key=shard2"),
    ];
    let deployments: Vec<Value> = shards.iter().map(|(n, _)| find("Deployment", n)).collect();
    let service = find("Service", "openflux-webhook");
    let pdb = find("PodDisruptionBudget", "openflux");
    let pod_spec = |d: &Value| {
        let mut spec = d["spec"]["template"]["spec"].clone();
        spec["affinity"] = Value::Null;
        let args = spec["containers"][0]["args"].as_array_mut().expect("args");
        let selector = args.iter().position(|a| {
            a.as_str()
                .is_some_and(|a| a.starts_with("--watch-label-selector="))
        });
        let selector = selector.map(|i| args.remove(i));
        (spec, selector)
    };
    let (main_spec, _) = pod_spec(&deployments[0]);
    let mut leases = std::collections::BTreeSet::new();
    for (d, (name, selector)) in deployments.iter().zip(shards) {
        let labels = &d["spec"]["template"]["metadata"]["labels"];
        // Every replica of every shard answers the webhook.
        assert!(selects(&service["spec"]["selector"], labels), "{name}");
        assert!(
            selects(&pdb["spec"]["selector"]["matchLabels"], labels),
            "{name}"
        );
        // No Deployment's selector takes another's pods.
        for (other, (other_name, _)) in deployments.iter().zip(shards) {
            let theirs = &other["spec"]["selector"]["matchLabels"];
            assert_eq!(
                selects(theirs, labels),
                other_name == name,
                "{other_name} / {name}"
            );
        }
        let (spec, arg) = pod_spec(d);
        assert_eq!(
            arg,
            Some(json!(format!("--watch-label-selector={selector}"))),
            "{name}"
        );
        assert_eq!(
            spec, main_spec,
            "{name}'s pod spec differs from the main one's"
        );
        assert!(leases.insert(lease_name(LEADER_ELECTION_ID, selector)));
    }
    env.apply(&json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "openflux-system"}
    }))
    .await
    .expect("creating openflux-system");
    let out = env.run_kubectl(&["apply", "-k", &dir, "--dry-run=server"], None);
    let _ = std::fs::remove_dir_all(&overlay);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "kubectl apply -k --dry-run=server:\n{text}"
    );
    for expected in [
        "deployment.apps/openflux-shard1",
        "deployment.apps/openflux-shard2",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
}
