//! Proves the local control plane and the e2e support module: stock Flux
//! fetches from the loopback Git and Helm fixtures and applies to the API
//! server, and the controller manager's garbage collector runs.

use openflux_testkit as support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::{cluster, field, is_ready, ready_condition, request_reconcile, wait_for, TIMEOUT};

fn configmap_yaml(message: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  message: {message}\n")
}

async fn configmap_message(api: &Api<ConfigMap>, name: &str) -> Option<String> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|cm| cm.data)
        .and_then(|d| d.get("message").cloned())
}

#[tokio::test]
async fn git_repository_and_kustomization_roll_out_commits() {
    let env = cluster().await;
    let fx = env.fixtures();
    let ns = env.namespace("harness-git").await;
    let (repo, first) = fx
        .create_repo(
            ns.name(),
            &[("deploy/configmap.yaml", &configmap_yaml("one"))],
        )
        .expect("create git repository");

    env.apply(&json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "GitRepository",
        "metadata": { "name": "app", "namespace": ns.name() },
        "spec": { "url": repo.url, "ref": { "branch": "main" }, "interval": "10m", "timeout": "30s" },
    }))
    .await
    .expect("apply GitRepository");

    let want = repo.flux_revision(&first);
    let git_repo = wait_for(
        &format!("GitRepository Ready at {want}"),
        TIMEOUT,
        || async {
            let obj = env
                .get(
                    "source.toolkit.fluxcd.io/v1",
                    "GitRepository",
                    Some(ns.name()),
                    "app",
                )
                .await
                .ok()??;
            let revision = field(&obj, "/status/artifact/revision")?.as_str()?;
            (is_ready(&obj) && revision == want).then_some(obj)
        },
    )
    .await;
    let url = field(&git_repo, "/status/artifact/url")
        .and_then(|u| u.as_str())
        .unwrap_or_default();
    let addr = &fx.source_storage_addr;
    assert!(
        url.contains(addr.as_str()),
        "artifact url {url} is not served by {addr}"
    );

    env.apply(&json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
        "kind": "Kustomization",
        "metadata": { "name": "app", "namespace": ns.name() },
        "spec": {
            "interval": "30s",
            "retryInterval": "5s",
            "path": "./deploy",
            "prune": true,
            "targetNamespace": ns.name(),
            "sourceRef": { "kind": "GitRepository", "name": "app" },
        },
    }))
    .await
    .expect("apply Kustomization");

    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns.name());
    wait_for("ConfigMap app-config with message one", TIMEOUT, || async {
        (configmap_message(&configmaps, "app-config").await? == "one").then_some(())
    })
    .await;

    // A new commit rolls out; ask for a reconciliation instead of waiting
    // for the (long) interval.
    let second = repo
        .commit(
            &[("deploy/configmap.yaml", &configmap_yaml("two"))],
            &[],
            "Change the message",
        )
        .expect("push second commit");
    assert_ne!(first, second);
    request_reconcile(
        &env.client,
        "source.toolkit.fluxcd.io/v1",
        "GitRepository",
        ns.name(),
        "app",
    )
    .await
    .expect("request reconcile");
    let want = repo.flux_revision(&second);
    wait_for(
        &format!("Kustomization applied {want}"),
        TIMEOUT,
        || async {
            let obj = env
                .get(
                    "kustomize.toolkit.fluxcd.io/v1",
                    "Kustomization",
                    Some(ns.name()),
                    "app",
                )
                .await
                .ok()??;
            let applied = field(&obj, "/status/lastAppliedRevision")?.as_str()?;
            (is_ready(&obj) && applied == want).then_some(())
        },
    )
    .await;
    assert_eq!(
        configmap_message(&configmaps, "app-config")
            .await
            .as_deref(),
        Some("two")
    );

    ns.delete().await;
}

#[tokio::test]
async fn garbage_collector_deletes_dependents_of_deleted_owners() {
    let env = cluster().await;
    let ns = env.namespace("harness-gc").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns.name());
    let pp = PostParams::default();

    let configmap = |name: &str, owner: Option<(&str, &str)>| -> ConfigMap {
        let mut value = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": name },
            "data": { "role": name },
        });
        if let Some((owner_name, uid)) = owner {
            value["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": uid,
            }]);
        }
        serde_json::from_value(value).expect("configmap")
    };

    // 1. The owner is deleted while the dependent exists.
    let owner = configmaps
        .create(&pp, &configmap("owner", None))
        .await
        .expect("create owner");
    let uid = owner.metadata.uid.clone().expect("owner uid");
    configmaps
        .create(&pp, &configmap("dependent", Some(("owner", &uid))))
        .await
        .expect("create dependent");
    configmaps
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");

    // 2. A dependent that points at an owner that is already gone.
    let gone = configmaps
        .create(&pp, &configmap("gone-owner", None))
        .await
        .expect("create owner");
    let gone_uid = gone.metadata.uid.clone().expect("owner uid");
    configmaps
        .delete("gone-owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    wait_for("owner gone-owner deleted", TIMEOUT, || async {
        configmaps
            .get_opt("gone-owner")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    configmaps
        .create(&pp, &configmap("orphan", Some(("gone-owner", &gone_uid))))
        .await
        .expect("create orphan");

    for name in ["dependent", "orphan"] {
        wait_for(
            &format!("garbage collection of ConfigMap {name}"),
            TIMEOUT,
            || async { configmaps.get_opt(name).await.ok()?.is_none().then_some(()) },
        )
        .await;
    }
    ns.delete().await;
}

#[tokio::test]
async fn helm_repository_and_release_from_static_server() {
    let env = cluster().await;
    let helm_url = env.fixtures().helm_repo_url.clone();
    let ns = env.namespace("harness-helm").await;
    env.apply(&json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "HelmRepository",
        "metadata": { "name": "fixtures", "namespace": ns.name() },
        "spec": { "url": helm_url, "interval": "10m" },
    }))
    .await
    .expect("apply HelmRepository");
    wait_for("HelmRepository Ready with an artifact", TIMEOUT, || async {
        let obj = env
            .get(
                "source.toolkit.fluxcd.io/v1",
                "HelmRepository",
                Some(ns.name()),
                "fixtures",
            )
            .await
            .ok()??;
        field(&obj, "/status/artifact/revision")?;
        is_ready(&obj).then_some(())
    })
    .await;

    env.apply(&json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "metadata": { "name": "greeting", "namespace": ns.name() },
        "spec": {
            "interval": "10m",
            "chart": { "spec": {
                "chart": "hello",
                "version": "0.1.0",
                "sourceRef": { "kind": "HelmRepository", "name": "fixtures" },
            } },
            "values": { "message": "hello from a HelmRelease" },
        },
    }))
    .await
    .expect("apply HelmRelease");
    let release = wait_for("HelmRelease Ready", TIMEOUT, || async {
        let obj = env
            .get(
                "helm.toolkit.fluxcd.io/v2",
                "HelmRelease",
                Some(ns.name()),
                "greeting",
            )
            .await
            .ok()??;
        is_ready(&obj).then_some(obj)
    })
    .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), ns.name());
    assert_eq!(
        configmap_message(&configmaps, "greeting-hello")
            .await
            .as_deref(),
        Some("hello from a HelmRelease"),
        "release {:?}",
        ready_condition(&release)
    );
    ns.delete().await;
}

#[test]
fn env_lines_are_parsed() {
    let vars = support::parse_env("export A='x y'\nexport B='it'\\''s'\nnoise\nexport C=plain\n");
    assert_eq!(vars["A"], "x y");
    assert_eq!(vars["B"], "it's");
    assert_eq!(vars["C"], "plain");
    let name = support::unique_name("Some_Test.Name");
    assert!(
        name.len() <= 63 && name.starts_with("some-test-name-"),
        "{name}"
    );
}

/// `curl` GET of `url` with `headers`: the status code, the response
/// headers (lower-case names) and the body.
fn get(url: &str, headers: &[String]) -> (u16, Vec<(String, String)>, String) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "-D", "-", url]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.output().expect("running curl");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("an HTTP status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A file rewritten within the second it was fetched is fetched again: the
/// fixtures' file server gives each file an ETag of its content, so a
/// conditional GET (as HttpSource and Flux's sources send) is not answered
/// 304 by a modification time that did not move.
#[tokio::test]
async fn a_file_rewritten_within_a_second_is_not_answered_not_modified() {
    let env = cluster().await;
    let fx = env.fixtures();
    let path = format!("harness-etag-{}/app.yaml", std::process::id());
    let url = fx.put_file(&path, b"one\n").expect("serving the file");
    let (status, first, body) = get(&url, &[]);
    assert_eq!((status, body.as_str()), (200, "one\n"));
    let etag = header(&first, "etag")
        .expect("an ETag on a served file")
        .to_string();
    let last_modified = header(&first, "last-modified")
        .expect("a Last-Modified on a served file")
        .to_string();

    // New content, the modification time unchanged (as within one second).
    let file = fx.http_root.join(&path);
    let mtime = std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .expect("the file's mtime");
    fx.put_file(&path, b"two\n").expect("serving new content");
    std::fs::File::options()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_modified(mtime))
        .expect("keeping the file's mtime");

    let conditional = [
        format!("If-None-Match: {etag}"),
        format!("If-Modified-Since: {last_modified}"),
    ];
    let (status, second, body) = get(&url, &conditional);
    assert_eq!(
        (status, body.as_str()),
        (200, "two\n"),
        "new content under an unchanged modification time"
    );
    let new_etag = header(&second, "etag").expect("an ETag").to_string();
    assert_ne!(new_etag, etag, "the ETag follows the content");
    let (status, _, _) = get(&url, &[format!("If-None-Match: {new_etag}")]);
    assert_eq!(status, 304, "unchanged content is not sent again");
}
