//! End to end: the systems openflux exists to serve, unchanged, on the local
//! control plane with stock Flux at its default flags: Open Flux producers'
//! Artifacts, Pulumi Stacks, exports of an earlier openflux release, and the
//! flux CLI's view of a custom source.

use openflux_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kube::ResourceExt;
use serde_json::{json, Value};
use support::exports::{reference_to, source_revision, wait_export};
use support::identity::acting_as;
use support::openflux::publish;
use support::webhook::openflux_with_webhook;
use support::writers::{self, Written};
use support::{cluster, field, ready_condition, wait_for, Env, TIMEOUT};

const ARTIFACT: &str = "openflux.dev/v1alpha1";
const KUSTOMIZE: &str = "kustomize.toolkit.fluxcd.io/v1";
const TEST_GROUP: &str = "compat.e2e.openflux.dev";
const TEST_SOURCE: &str = "compat.e2e.openflux.dev/v1";

fn crd_file(name: &str) -> String {
    let path = support::workspace_root().join("e2e/crds").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn install(env: &Env, extra: &[(&str, &str)]) {
    support::install_artifact_crd(env).await;
    support::install_test_source_crd(env, TEST_GROUP).await;
    let mut names = vec![
        "artifacts.openflux.dev".to_string(),
        format!("testsources.{TEST_GROUP}"),
    ];
    for (file, crd) in extra {
        env.apply_yaml(&crd_file(file))
            .await
            .unwrap_or_else(|e| panic!("installing {file}: {e:#}"));
        names.push(crd.to_string());
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    support::wait_established(env, &names).await;
}

fn kustomization(ns: &str, name: &str, source_ref: Value) -> Value {
    json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"interval": "10m", "prune": true, "path": "./", "targetNamespace": ns,
                 "sourceRef": source_ref}
    })
}

async fn wait_ready(
    env: &Env,
    api_version: &str,
    kind: &str,
    ns: &str,
    name: &str,
) -> kube::core::DynamicObject {
    wait_for(
        &format!("{kind} {ns}/{name} to be Ready"),
        TIMEOUT,
        || async {
            let o = env.find(api_version, kind, ns, name).await?;
            (ready_condition(&o)?.0 == "True").then_some(o)
        },
    )
    .await
}

/// TestSource `web` in `n`, its Artifact written by its producer with a
/// ConfigMap whose message is `message`; the Artifact as applied.
async fn web_with_artifact(env: &Env, n: &str, message: &str) -> kube::core::DynamicObject {
    let uid = writers::test_source(env, TEST_GROUP, n, "web").await;
    let spec = publish(
        env.fixtures(),
        n,
        "web",
        "v1",
        &[("configmap.yaml", &support::configmap_yaml(message))],
    );
    env.apply(&writers::owned_artifact(
        TEST_GROUP, n, "web", "web", &uid, &spec,
    ))
    .await
    .expect("writing the Artifact")
}

/// Kustomization `name` in `n` as an earlier release rewrote a reference
/// to TestSource `web`: pointed at the `testsource-web` ExternalArtifact,
/// the reference as written recorded in its annotation.
fn rewritten_earlier(n: &str, name: &str) -> Value {
    let mut old = kustomization(
        n,
        name,
        json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "ExternalArtifact", "name": "testsource-web"}),
    );
    old["metadata"]["annotations"] = json!({
        "openflux.dev/source-ref": format!(r#"{{"apiVersion":"{TEST_SOURCE}","kind":"TestSource","name":"web"}}"#)
    });
    old
}

/// The admission policy that holds openflux's identity to creating exports
/// under the names it gives them now (webhook-config/registration-policy.yaml).
const EXPORT_OWNERS: &str = "openflux-export-owners";

/// Creates `export` as openflux's identity the way a release before
/// openflux-export-owners did, under the name that release gave it: the
/// policy's binding is taken away for the create and put back from the
/// shipped file, and the policy is seen refusing again before this
/// returns, whether the create worked or not. No other module's tests run
/// beside these (`openflux_testkit::turns`), and none of this module's
/// relies on that policy.
async fn earlier_export(env: &Env, export: &Value) {
    let binding = support::operator::yaml_documents(
        &support::workspace_root().join("webhook-config/registration-policy.yaml"),
    )
    .into_iter()
    .find(|d| {
        d["kind"] == "ValidatingAdmissionPolicyBinding" && d["metadata"]["name"] == EXPORT_OWNERS
    })
    .expect("the shipped binding of openflux-export-owners");
    let bindings = kube::Api::<kube::api::DynamicObject>::all_with(
        env.client.clone(),
        &kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
        )),
    );
    bindings
        .delete(EXPORT_OWNERS, &Default::default())
        .await
        .expect("taking the binding of openflux-export-owners away");
    let openflux = acting_as(env, "openflux-system", "openflux");
    // The API server drops the policy once its informer sees the delete.
    let created = tokio::time::timeout(TIMEOUT, async {
        loop {
            match support::apply(&openflux, export).await {
                Ok(_) => return,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
    })
    .await;
    env.apply(&binding)
        .await
        .expect("putting the binding of openflux-export-owners back");
    let mut probe = export.clone();
    probe["metadata"]["name"] = json!("earlier-export-probe");
    let (api, _) = support::dynamic_api(
        &openflux,
        "source.toolkit.fluxcd.io/v1",
        "ExternalArtifact",
        export["metadata"]["namespace"].as_str(),
    )
    .await
    .expect("discovery");
    let dry = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe: kube::api::DynamicObject = serde_json::from_value(probe).expect("an object");
    wait_for(
        "openflux-export-owners to refuse again",
        TIMEOUT,
        || async {
            match api.create(&dry, &probe).await {
                Err(kube::Error::Api(e)) if e.message.contains(&format!("'{EXPORT_OWNERS}'")) => {
                    Some(())
                }
                _ => None,
            }
        },
    )
    .await;
    created.unwrap_or_else(|_| {
        panic!("openflux creating the earlier export {export} without the policy")
    });
}

/// An Open Flux producer writes its own Artifact kind, owned by its source;
/// an unchanged Kustomization referencing that source deploys it. Both API
/// groups Open Flux has used, with and without the controller flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_flux_artifacts_reach_an_unchanged_kustomization() {
    let env = cluster().await;
    install(
        &env,
        &[
            (
                "openfluxcd-artifact.yaml",
                "artifacts.openfluxcd.ocm.software",
            ),
            (
                "openfluxcd-mandelsoft-artifact.yaml",
                "artifacts.openfluxcd.mandelsoft.org",
            ),
        ],
    )
    .await;
    let ns = env.namespace("openfluxcd").await;
    let n = ns.name().to_string();
    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    for (group, source, controller) in [
        ("openfluxcd.ocm.software", "web", Some(true)),
        ("openfluxcd.mandelsoft.org", "old", None),
    ] {
        let uid = writers::test_source(&env, TEST_GROUP, &n, source).await;
        let mut spec = publish(
            env.fixtures(),
            &n,
            source,
            "v1",
            &[("configmap.yaml", &support::configmap_yaml(group))],
        );
        spec["lastUpdateTime"] = json!("2026-01-01T00:00:00Z");
        env.apply(&json!({
            "apiVersion": format!("{group}/v1alpha1"), "kind": "Artifact",
            "metadata": {"name": format!("testsource-{n}-{source}"), "namespace": n,
                         "ownerReferences": [{"apiVersion": TEST_SOURCE, "kind": "TestSource",
                                              "name": source, "uid": uid, "controller": controller}]},
            "spec": spec,
        }))
        .await
        .expect("writing the Open Flux Artifact");
        let ks = format!("ks-{source}");
        env.apply(&kustomization(
            &n,
            &ks,
            json!({"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": source}),
        ))
        .await
        .expect("creating the Kustomization");
        wait_ready(&env, KUSTOMIZE, "Kustomization", &n, &ks).await;
        support::configmap_holds(&env, &n, "app-config", group, TIMEOUT).await;
        // Deleting theirs deletes the Artifact standing for it.
        let ours = format!("testsource-{n}-{source}.artifact.{group}");
        assert!(env.find(ARTIFACT, "Artifact", &n, &ours).await.is_some());
        env.delete_object(
            &format!("{group}/v1alpha1"),
            "Artifact",
            &n,
            &format!("testsource-{n}-{source}"),
        )
        .await;
        wait_for("the adopted Artifact to go", TIMEOUT, || async {
            env.find(ARTIFACT, "Artifact", &n, &ours)
                .await
                .is_none()
                .then_some(())
        })
        .await;
        env.delete_object(KUSTOMIZE, "Kustomization", &n, &ks).await;
    }
    ns.delete().await;
}

/// The pulumi-fetch program (e2e/go/pulumi-fetch): fluxcd/pkg/http/fetch
/// v0.11.0's ArchiveFetcher called as the Pulumi Kubernetes Operator's
/// agent calls it. `e2e/cluster up` builds it and `e2e/cluster env` names it.
fn pulumi_fetch(env: &Env) -> PathBuf {
    let path = env
        .vars
        .get("OPENFLUX_E2E_PULUMI_FETCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "no OPENFLUX_E2E_PULUMI_FETCH: run `e2e/cluster up` (it builds e2e/go/pulumi-fetch, \
                 also beside a control plane already running), then `eval \"$(e2e/cluster env)\"`"
            )
        });
    assert!(
        path.is_file(),
        "{} is missing: run `e2e/cluster up` to build it",
        path.display()
    );
    path
}

/// What a fetch by the operator's agent left behind.
struct Fetched {
    /// The program's exit status and what it printed, when it failed.
    refused: Option<String>,
    /// The files in the directory it fetched into, by path, with their content.
    files: BTreeMap<String, String>,
}

/// Fetches `url` with `digest` into a fresh directory, as the agent does
/// with the `status.artifact` of the object a Stack's fluxSource names:
/// a GET, the digest verified, the tarball untarred.
async fn fetch_as_the_agent(program: &Path, url: &str, digest: &str) -> Fetched {
    let (program, url, digest) = (program.to_path_buf(), url.to_string(), digest.to_string());
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = Command::new(&program)
            .args([&url, &digest])
            .arg(dir.path())
            .env_remove("SOURCE_HOST")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
        let refused = (!out.status.success()).then(|| {
            format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        });
        let mut files = BTreeMap::new();
        files_under(dir.path(), dir.path(), &mut files);
        Fetched { refused, files }
    })
    .await
    .expect("the fetch task")
}

fn files_under(root: &Path, dir: &Path, files: &mut BTreeMap<String, String>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files_under(root, &path, files);
        } else {
            let name = path.strip_prefix(root).expect("under the root");
            let content = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            files.insert(name.to_string_lossy().into_owned(), content);
        }
    }
}

fn file_map(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(path, content)| (path.to_string(), content.to_string()))
        .collect()
}

/// The object a Stack's `spec.fluxSource.sourceRef` names, in the Stack's
/// namespace, once its `status.artifact` has `digest`: what the operator
/// reads, whatever the kind.
async fn stack_source(
    env: &Env,
    ns: &str,
    source_ref: &Value,
    digest: &str,
) -> kube::core::DynamicObject {
    let (api_version, kind, name) = (
        source_ref["apiVersion"].as_str().expect("apiVersion"),
        source_ref["kind"].as_str().expect("kind"),
        source_ref["name"].as_str().expect("name"),
    );
    wait_for(
        &format!("{kind} {ns}/{name} to carry the artifact {digest}"),
        TIMEOUT,
        || async {
            let o = env.find(api_version, kind, ns, name).await?;
            (field(&o, "/status/artifact/digest")?.as_str()? == digest).then_some(o)
        },
    )
    .await
}

/// A Pulumi Stack's fluxSource naming a custom kind is rewritten to an
/// object the operator can read, whose status.artifact carries the custom
/// source's URL, revision and digest. What the operator's agent then does
/// is done: the object the rewritten sourceRef names is read, its artifact
/// fetched with the agent's fetcher (digest verified, untarred) and the
/// files compared with what was published, for v1 and then for v2; a wrong
/// digest is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulumi_stack_is_pointed_at_what_the_operator_reads() {
    let env = cluster().await;
    let fetch = pulumi_fetch(&env);
    install(&env, &[("pulumi-stack.yaml", "stacks.pulumi.com")]).await;
    let ns = env.namespace("pulumi").await;
    let n = ns.name().to_string();
    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    let uid = writers::test_source(&env, TEST_GROUP, &n, "infra").await;
    let v1_files = [("Pulumi.yaml", "name: infra\n")];
    let spec = publish(env.fixtures(), &n, "infra", "v7", &v1_files);
    env.apply(&writers::owned_artifact(
        TEST_GROUP, &n, "infra", "infra", &uid, &spec,
    ))
    .await
    .expect("writing the Artifact");
    let stack = json!({
        "apiVersion": "pulumi.com/v1", "kind": "Stack",
        "metadata": {"name": "infra", "namespace": n},
        "spec": {"stack": "dev", "fluxSource": {
            "sourceRef": {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "infra"}, "dir": "."}}
    });
    // The webhook learns of the Stack CRD from its survey: retry until admitted.
    let stored = wait_for("the Stack to be admitted", TIMEOUT, || async {
        env.apply(&stack).await.ok()
    })
    .await;
    let target = field(&stored, "/spec/fluxSource/sourceRef")
        .cloned()
        .expect("sourceRef");
    assert_eq!(target["kind"], "OCIRepository", "{target}");
    let (artifact, export) = wait_export(&env, &n, "infra", |_| true).await;
    assert_eq!(reference_to(&export), target);
    // The webhook recorded who wrote the Artifact.
    let writer = artifact
        .annotations()
        .get("openflux.dev/written-by")
        .cloned();
    assert!(
        writer
            .as_deref()
            .is_some_and(|w| w.contains("\"username\"")),
        "{writer:?}"
    );

    // The operator's agent reads the object the sourceRef names and
    // fetches its artifact.
    let digest = spec["digest"].as_str().expect("digest");
    let source = stack_source(&env, &n, &target, digest).await;
    let read = field(&source, "/status/artifact")
        .cloned()
        .expect("status.artifact");
    assert_eq!(read["url"], spec["url"]);
    assert_eq!(
        source_revision(&source).as_deref(),
        spec["revision"].as_str()
    );
    let v1_revision = read["revision"].clone();
    assert!(v1_revision.is_string(), "{read}");
    let v1_url = read["url"].as_str().expect("url").to_string();
    let fetched = fetch_as_the_agent(&fetch, &v1_url, digest).await;
    assert_eq!(fetched.refused, None, "fetching v1 from {v1_url}");
    assert_eq!(fetched.files, file_map(&v1_files));

    // v2: a new revision with other content reaches the Stack's source.
    let v2_files = [
        ("Pulumi.yaml", "name: infra\nruntime: yaml\n"),
        ("resources/bucket.yaml", "kind: Bucket\n"),
    ];
    let v2 = publish(env.fixtures(), &n, "infra", "v8", &v2_files);
    env.apply(&writers::owned_artifact(
        TEST_GROUP, &n, "infra", "infra", &uid, &v2,
    ))
    .await
    .expect("writing v2 of the Artifact");
    let v2_digest = v2["digest"].as_str().expect("digest");
    let stack_now = env
        .find("pulumi.com/v1", "Stack", &n, "infra")
        .await
        .expect("the Stack");
    assert_eq!(
        field(&stack_now, "/spec/fluxSource/sourceRef"),
        Some(&target)
    );
    let source = stack_source(&env, &n, &target, v2_digest).await;
    let read = field(&source, "/status/artifact")
        .cloned()
        .expect("status.artifact");
    assert_eq!(read["url"], v2["url"]);
    assert_eq!(source_revision(&source).as_deref(), v2["revision"].as_str());
    assert_ne!(read["revision"], v1_revision, "{read}");
    let v2_url = read["url"].as_str().expect("url").to_string();
    let fetched = fetch_as_the_agent(&fetch, &v2_url, v2_digest).await;
    assert_eq!(fetched.refused, None, "fetching v2 from {v2_url}");
    assert_eq!(fetched.files, file_map(&v2_files));

    // The fetch verifies what it got: v2's tarball under v1's digest is
    // refused and nothing is untarred.
    let wrong = fetch_as_the_agent(&fetch, &v2_url, digest).await;
    let refused = wrong
        .refused
        .expect("a fetch with another artifact's digest to fail");
    assert!(
        refused.contains("computed digest doesn't match"),
        "{refused}"
    );
    assert!(wrong.files.is_empty(), "{:?}", wrong.files);
    ns.delete().await;
}

/// Consumers rewritten by an earlier release point at `<kind>-<name>`
/// ExternalArtifacts, which a default Flux refuses. openflux moves them to
/// the current export with no user action, and deletes the old export once
/// the consumer has reconciled the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_of_earlier_exports_are_moved_and_the_old_export_goes() {
    let env = cluster().await;
    install(&env, &[]).await;
    let ns = env.namespace("migrate").await;
    let n = ns.name().to_string();
    let uid = writers::test_source(&env, TEST_GROUP, &n, "web").await;
    let spec = publish(
        env.fixtures(),
        &n,
        "web",
        "v1",
        &[("configmap.yaml", &support::configmap_yaml("migrated"))],
    );
    let artifact = env
        .apply(&writers::owned_artifact(
            TEST_GROUP, &n, "web", "web", &uid, &spec,
        ))
        .await
        .expect("writing the Artifact");
    // What an earlier release left: its export (which only openflux may
    // write) and a rewritten consumer.
    earlier_export(&env, &json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "ExternalArtifact",
        "metadata": {"name": "testsource-web", "namespace": n,
                     "labels": {"app.kubernetes.io/managed-by": "openflux"},
                     "ownerReferences": [{"apiVersion": ARTIFACT, "kind": "Artifact", "name": "web",
                                          "uid": artifact.uid().unwrap(), "controller": true}]},
        "spec": {"sourceRef": {"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web"}},
    }))
    .await;
    env.apply(&rewritten_earlier(&n, "web"))
        .await
        .expect("the consumer an earlier release rewrote");

    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    // Written before openflux's webhook for Artifacts: no writer recorded,
    // so not trusted until its producer writes it again.
    let refused = wait_for("the unstamped Artifact to be refused", TIMEOUT, || async {
        let a = env.find(ARTIFACT, "Artifact", &n, "web").await?;
        let (status, reason, message) = ready_condition(&a)?;
        (status == "False" && reason == "Untrusted").then_some(message)
    })
    .await;
    assert!(refused.contains("write the Artifact again"), "{refused}");
    // The producer's next revision (a label alone would not record a
    // writer: it does not change what is exported).
    let mut again = writers::owned_artifact(TEST_GROUP, &n, "web", "web", &uid, &spec);
    again["spec"]["lastUpdateTime"] = json!("2026-01-02T00:00:00Z");
    again["metadata"]["labels"] = json!({"e2e.openflux.dev/written": "again"});
    env.apply(&again).await.expect("the producer's next write");
    let (_, export) = wait_export(&env, &n, "web", |_| true).await;
    let expected = reference_to(&export);
    let moved = wait_for("the consumer to be moved", TIMEOUT, || async {
        let ks = env.find(KUSTOMIZE, "Kustomization", &n, "web").await?;
        (field(&ks, "/spec/sourceRef") == Some(&expected)).then_some(ks)
    })
    .await;
    assert!(moved.annotations().contains_key("openflux.dev/moved-from"));
    support::configmap_holds(&env, &n, "app-config", "migrated", TIMEOUT).await;
    wait_for("the earlier export to be deleted", TIMEOUT, || async {
        env.find(
            "source.toolkit.fluxcd.io/v1",
            "ExternalArtifact",
            &n,
            "testsource-web",
        )
        .await
        .is_none()
        .then_some(())
    })
    .await;
    ns.delete().await;
}

/// `flux trace` on an object deployed from a custom source names the custom
/// source as its origin; `flux reconcile` works on the consumer, and its
/// `--with-source` is refused by the CLI as the docs say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flux_trace_names_the_custom_source() {
    let env = cluster().await;
    let flux = env.vars.get("OPENFLUX_E2E_FLUX_CLI").cloned().expect(
        "OPENFLUX_E2E_FLUX_CLI: the flux CLI of the local control plane (e2e/cluster up builds it)",
    );
    install(&env, &[]).await;
    let ns = env.namespace("trace").await;
    let n = ns.name().to_string();
    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    let uid = writers::test_source(&env, TEST_GROUP, &n, "web").await;
    let spec = publish(
        env.fixtures(),
        &n,
        "web",
        "v3",
        &[("configmap.yaml", &support::configmap_yaml("traced"))],
    );
    env.apply(&writers::owned_artifact(
        TEST_GROUP, &n, "web", "web", &uid, &spec,
    ))
    .await
    .expect("writing the Artifact");
    env.apply(&kustomization(
        &n,
        "web",
        json!({"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web"}),
    ))
    .await
    .expect("creating the Kustomization");
    support::configmap_holds(&env, &n, "app-config", "traced", TIMEOUT).await;
    let kubeconfig = env.kubeconfig.clone().expect("a kubeconfig file");
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new(&flux)
            .args(["trace", "configmap", "app-config", "-n", &n])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .output()
            .expect("running flux trace")
    });
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("flux trace configmap app-config:\n{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("TestSource.{TEST_GROUP}/{n}/web"))
            || text.contains(&format!("TestSource/{n}/web")),
        "flux trace does not name the custom source:\n{text}"
    );
    assert!(
        text.contains("v3@sha256:"),
        "flux trace does not show the custom source's revision:\n{text}"
    );
    // What docs/troubleshooting.md says of `flux reconcile`: the consumer
    // reconciles; `--with-source` is refused by the CLI itself (it reconciles
    // no ExternalArtifact and no suspended source), whichever export it is.
    let flux_run = |args: &[&str]| {
        let out = tokio::task::block_in_place(|| {
            std::process::Command::new(&flux)
                .args(args)
                .args(["-n", &n, "--timeout=2m"])
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .output()
                .expect("running flux")
        });
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = flux_run(&["reconcile", "kustomization", "web"]);
    assert!(ok, "flux reconcile kustomization web:\n{text}");
    let (ok, text) = flux_run(&["reconcile", "kustomization", "web", "--with-source"]);
    assert!(
        !ok && (text.contains("cannot reconcile source of kind ExternalArtifact")
            || text.contains("resource is suspended")),
        "flux reconcile kustomization web --with-source:\n{text}"
    );
    // The views docs/troubleshooting.md shows, each run here: the doc's
    // examples are this test's output (namespace renamed), so their
    // columns and rows are what the CLI prints on openflux's objects.
    let views: [(&str, &[&str]); 4] = [
        ("flux get sources all -A", &["get", "sources", "all", "-A"]),
        (
            "flux get kustomizations -n apps",
            &["get", "kustomizations"],
        ),
        (
            "flux tree kustomization web -n apps",
            &["tree", "kustomization", "web"],
        ),
        (
            "flux events --for Kustomization/web -n apps",
            &["events", "--for", "Kustomization/web"],
        ),
    ];
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/troubleshooting.md"
    ))
    .expect("docs/troubleshooting.md");
    for (shown, args) in views {
        let (ok, text) = flux_run(args);
        // Another module's objects are not this test's: only the header
        // and the rows of this namespace of an all-namespaces listing.
        let text: String = text
            .lines()
            .filter(|l| !args.contains(&"-A") || l.starts_with("NAMESPACE") || l.contains(&n))
            .map(|l| format!("{}\n", l.replace(&n, "apps")))
            .collect();
        println!("$ {shown}\n{text}");
        assert!(ok, "{shown}:\n{text}");
        let expected: &[&str] = match args[0] {
            "get" => &["sha256:", "True"],
            "tree" => &["Kustomization/apps/web", "ConfigMap/apps/app-config"],
            _ => &["Kustomization/web"],
        };
        for e in expected {
            assert!(text.contains(e), "{shown} does not show {e}:\n{text}");
        }
        let example = doc_example(&doc, shown).unwrap_or_else(|| {
            panic!("docs/troubleshooting.md has no example of `{shown}`; it prints:\n{text}")
        });
        // Ages (`12s`, `3m4s`) differ from run to run.
        let words = |l: &str| {
            l.split_whitespace()
                .map(|w| match is_age(w) {
                    true => "<age>".to_string(),
                    false => w.to_string(),
                })
                .collect::<Vec<_>>()
        };
        let printed: Vec<Vec<String>> = text.lines().map(words).collect();
        assert_eq!(
            example.first().map(|l| words(l)),
            printed.first().cloned(),
            "the first line of the doc's `{shown}` is not the CLI's:\n{text}"
        );
        for line in &example {
            let first = words(line).into_iter().next().unwrap_or_default();
            assert!(
                printed.iter().any(|p| p.first() == Some(&first)),
                "the doc's `{shown}` shows a row {first:?} the CLI does not print:\n{text}"
            );
        }
    }
    ns.delete().await;
}

/// Whether `word` is an age as kubectl prints one: `45s`, `3m4s`, `2d`.
fn is_age(word: &str) -> bool {
    let mut digits = false;
    let mut parts = 0;
    for c in word.chars() {
        match c {
            '0'..='9' => digits = true,
            's' | 'm' | 'h' | 'd' if digits => {
                digits = false;
                parts += 1;
            }
            _ => return false,
        }
    }
    parts > 0 && !digits
}

/// The output docs/troubleshooting.md shows for `$ command`: the lines
/// after it in its `console` block.
fn doc_example(doc: &str, command: &str) -> Option<Vec<String>> {
    let start = doc.find(&format!("$ {command}\n"))?;
    let rest = &doc[start..];
    let block = &rest[..rest.find("```")?];
    Some(
        block
            .lines()
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// An Artifact counts for a source only when its writer may update that
/// source's status: one written by an identity that may write Artifacts but
/// not speak for the source is not exported, and says why; the source's own
/// controller identity is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_from_a_writer_that_may_not_speak_for_the_source_is_not_deployed() {
    let env = cluster().await;
    install(&env, &[]).await;
    let ns = env.namespace("trust").await;
    let n = ns.name().to_string();
    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    writers::intruder_and_producer(&env, TEST_GROUP, &n).await;
    for (who, source) in [("intruder", "victim"), ("producer", "own")] {
        let uid = writers::test_source(&env, TEST_GROUP, &n, source).await;
        writers::write_as(
            &env,
            &n,
            who,
            Written {
                group: TEST_GROUP,
                name: source,
                source,
                uid: &uid,
                labels: None,
            },
        )
        .await;
    }
    let untrusted = wait_for("the intruder's Artifact to be refused", TIMEOUT, || async {
        let a = env.find(ARTIFACT, "Artifact", &n, "victim").await?;
        let (status, reason, message) = ready_condition(&a)?;
        (status == "False" && reason == "Untrusted").then_some(message)
    })
    .await;
    assert!(
        untrusted.contains(&format!("system:serviceaccount:{n}:intruder")),
        "{untrusted}"
    );
    assert!(
        untrusted.contains("may not update the status"),
        "{untrusted}"
    );
    for kind in ["ExternalArtifact", "OCIRepository"] {
        let name =
            openflux::names::identity::source_export_name(TEST_GROUP, "TestSource", "victim");
        assert!(
            env.find("source.toolkit.fluxcd.io/v1", kind, &n, &name)
                .await
                .is_none(),
            "{kind} {name} exported"
        );
    }
    let (artifact, _) = wait_export(&env, &n, "own", |_| true).await;
    let writer = artifact
        .annotations()
        .get("openflux.dev/written-by")
        .cloned()
        .unwrap_or_default();
    assert!(
        writer.contains(&format!("system:serviceaccount:{n}:producer")),
        "{writer}"
    );
    ns.delete().await;
}

/// `spec.exportedInputs` is part of what is exported (an ExternalArtifact's
/// `status.exportedInputs`): an identity that may patch Artifacts but not
/// update the source's status, patching only those inputs of the
/// producer's exported Artifact, becomes its recorded writer and the
/// Artifact is refused. Inputs nested deeper than openflux's controllers
/// decode are refused at admission, whoever writes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patching_only_the_exported_inputs_makes_the_patcher_the_writer() {
    use kube::api::{Patch, PatchParams};

    let env = cluster().await;
    install(&env, &[]).await;
    let ns = env.namespace("trust-inputs").await;
    let n = ns.name().to_string();
    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    writers::intruder_and_producer(&env, TEST_GROUP, &n).await;
    let uid = writers::test_source(&env, TEST_GROUP, &n, "inputs").await;
    writers::write_as(
        &env,
        &n,
        "producer",
        Written {
            group: TEST_GROUP,
            name: "inputs",
            source: "inputs",
            uid: &uid,
            labels: None,
        },
    )
    .await;
    wait_export(&env, &n, "inputs", |_| true).await;

    let patch_as = |who: &'static str, inputs: Value| {
        let client = acting_as(&env, &n, who);
        let n = n.clone();
        async move {
            let (artifacts, _) = support::dynamic_api(&client, ARTIFACT, "Artifact", Some(&n))
                .await
                .map_err(|e| e.to_string())?;
            artifacts
                .patch(
                    "inputs",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"exportedInputs": inputs}})),
                )
                .await
                .map_err(|e| e.to_string())
        }
    };
    let intruder = format!("system:serviceaccount:{n}:intruder");
    // RBAC bindings take a moment to apply: retry until patched.
    let patched = wait_for("the intruder's patch of the inputs", TIMEOUT, || async {
        patch_as("intruder", json!({"env": "prod"})).await.ok()
    })
    .await;
    let writer = patched
        .annotations()
        .get("openflux.dev/written-by")
        .cloned()
        .unwrap_or_default();
    assert!(writer.contains(&intruder), "{writer}");
    let refused = wait_for("the patched Artifact to be refused", TIMEOUT, || async {
        let a = env.find(ARTIFACT, "Artifact", &n, "inputs").await?;
        let (status, reason, message) = ready_condition(&a)?;
        (status == "False" && reason == "Untrusted").then_some(message)
    })
    .await;
    assert!(refused.contains(&intruder), "{refused}");
    let export = openflux::names::identity::source_export_name(TEST_GROUP, "TestSource", "inputs");
    if let Some(exported) = env
        .find(
            "source.toolkit.fluxcd.io/v1",
            "ExternalArtifact",
            &n,
            &export,
        )
        .await
    {
        assert_ne!(
            field(&exported, "/status/exportedInputs/env"),
            Some(&json!("prod")),
            "the intruder's inputs were exported"
        );
    }

    // Nested past what the controllers decode: refused, saying why.
    let deep = (0..130).fold(json!("leaf"), |inner, _| json!({ "l": inner }));
    let error = patch_as("producer", deep)
        .await
        .expect_err("inputs 130 levels deep were admitted");
    assert!(
        error.contains("spec.exportedInputs is nested deeper than")
            && error.contains("the controllers cannot decode it"),
        "{error}"
    );
    ns.delete().await;
}

/// The number of export reconciles of Artifact `name` in `ns` so far.
async fn reconciles(of: &support::openflux::Openflux, ns: &str, name: &str) -> f64 {
    let series = format!(
        "gotk_reconcile_duration_seconds_count{{kind=\"Artifact\",name=\"{name}\",namespace=\"{ns}\"}}"
    );
    of.metric(&series).await.unwrap_or(0.0)
}

/// An administrator labelling an Artifact its writer may not publish does
/// not vouch for its content: the writer of what is exported stays the
/// tenant, and the Artifact stays refused after openflux judged it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelling_a_refused_artifact_does_not_make_it_the_labellers() {
    let env = cluster().await;
    install(&env, &[]).await;
    let ns = env.namespace("trust-label").await;
    let n = ns.name().to_string();
    let (of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    writers::intruder_and_producer(&env, TEST_GROUP, &n).await;
    let uid = writers::test_source(&env, TEST_GROUP, &n, "victim").await;
    writers::write_as(
        &env,
        &n,
        "intruder",
        Written {
            group: TEST_GROUP,
            name: "victim",
            source: "victim",
            uid: &uid,
            labels: None,
        },
    )
    .await;
    let intruder = format!("system:serviceaccount:{n}:intruder");
    wait_for("the tenant's Artifact to be refused", TIMEOUT, || async {
        let a = env.find(ARTIFACT, "Artifact", &n, "victim").await?;
        (ready_condition(&a)?.1 == "Untrusted").then_some(())
    })
    .await;
    // Judged twice: on its arrival, and again when its refused status came
    // back through the watch. A refused Artifact is checked again only
    // minutes later, so the next reconcile is the label's.
    wait_for(
        "openflux to judge the Artifact and the echo of its refusal",
        TIMEOUT,
        || async { (reconciles(&of, &n, "victim").await >= 2.0).then_some(()) },
    )
    .await;
    let before = reconciles(&of, &n, "victim").await;
    // The administrator (the test's own client) adds a label.
    let (artifacts, _) = support::dynamic_api(&env.client, ARTIFACT, "Artifact", Some(&n))
        .await
        .expect("discovery");
    let labelled = artifacts
        .patch(
            "victim",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"reviewed": "yes"}}})),
        )
        .await
        .expect("labelling the Artifact");
    let writer = labelled
        .annotations()
        .get("openflux.dev/written-by")
        .cloned()
        .unwrap_or_default();
    assert!(
        writer.contains(&intruder),
        "the label re-stamped the writer: {writer}"
    );
    // openflux judges the labelled Artifact again; it stays refused and is
    // not exported.
    let export = openflux::names::identity::source_export_name(TEST_GROUP, "TestSource", "victim");
    wait_for(
        "openflux to judge the labelled Artifact",
        TIMEOUT,
        || async {
            let judged = reconciles(&of, &n, "victim").await >= before + 1.0;
            let exported = env
                .find(
                    "source.toolkit.fluxcd.io/v1",
                    "ExternalArtifact",
                    &n,
                    &export,
                )
                .await
                .is_some();
            (judged || exported).then_some(())
        },
    )
    .await;
    let artifact = env
        .find(ARTIFACT, "Artifact", &n, "victim")
        .await
        .expect("the Artifact");
    let (status, reason, message) = ready_condition(&artifact).expect("a Ready condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "Untrusted"),
        "{message}"
    );
    assert!(message.contains(&intruder), "{message}");
    for kind in ["ExternalArtifact", "OCIRepository"] {
        assert!(
            env.find("source.toolkit.fluxcd.io/v1", kind, &n, &export)
                .await
                .is_none(),
            "{kind} {export} exported after the label"
        );
    }
    ns.delete().await;
}

/// A forged Artifact for someone else's source, older than the genuine one
/// and labelled the source's default, neither takes the source's export nor
/// keeps the source's own Artifact from it: a consumer of the source
/// deploys the producer's content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_default_artifact_does_not_block_the_sources_own() {
    let env = cluster().await;
    install(&env, &[]).await;
    let ns = env.namespace("forged-default").await;
    let n = ns.name().to_string();
    let (_of, _webhook) = openflux_with_webhook(&env, &n, &[]).await;
    writers::intruder_and_producer(&env, TEST_GROUP, &n).await;
    let uid = writers::test_source(&env, TEST_GROUP, &n, "app").await;
    let default = json!({"openflux.dev/default-artifact": "true"});
    writers::write_as(
        &env,
        &n,
        "intruder",
        Written {
            group: TEST_GROUP,
            name: "forged",
            source: "app",
            uid: &uid,
            labels: Some(default),
        },
    )
    .await;
    wait_for("the forged Artifact to be refused", TIMEOUT, || async {
        let a = env.find(ARTIFACT, "Artifact", &n, "forged").await?;
        (ready_condition(&a)?.1 == "Untrusted").then_some(())
    })
    .await;
    writers::write_as(
        &env,
        &n,
        "producer",
        Written {
            group: TEST_GROUP,
            name: "app",
            source: "app",
            uid: &uid,
            labels: None,
        },
    )
    .await;
    let source_export =
        openflux::names::identity::source_export_name(TEST_GROUP, "TestSource", "app");
    let (_, export) = wait_export(&env, &n, "app", |e| e.name_any() == source_export).await;
    env.apply(&kustomization(
        &n,
        "app",
        json!({"apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "app"}),
    ))
    .await
    .expect("creating the Kustomization");
    support::configmap_holds(&env, &n, "app-config", "producer", TIMEOUT).await;
    let ks = env
        .find(KUSTOMIZE, "Kustomization", &n, "app")
        .await
        .expect("the Kustomization");
    assert_eq!(field(&ks, "/spec/sourceRef"), Some(&reference_to(&export)));
    let forged = env
        .find(ARTIFACT, "Artifact", &n, "forged")
        .await
        .expect("the forged Artifact");
    assert_eq!(
        ready_condition(&forged).map(|c| c.1).as_deref(),
        Some("Untrusted")
    );
    ns.delete().await;
}

/// Re-pointing never overwrites a person's edit: openflux's patch of a
/// consumer carries the resourceVersion it was decided on. A proxy in front
/// of openflux holds its re-point patch after openflux read the consumer;
/// meanwhile a person edits the consumer; the held patch then reaches the
/// API server, which refuses it (409), and openflux decides again on the
/// new version. A person who pointed the consumer elsewhere keeps that
/// reference; a person who changed something else keeps the change, and
/// the reference ends re-pointed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_made_while_a_consumer_is_re_pointed_survives() {
    use kube::api::{Patch, PatchParams};
    use support::openflux::Openflux;
    use support::proxy::ApiProxy;

    let env = cluster().await;
    install(&env, &[]).await;
    let ns = env.namespace("repoint-race").await;
    let n = ns.name().to_string();
    web_with_artifact(&env, &n, "raced").await;
    // Consumers an earlier release rewrote to `<kind>-<name>`: openflux
    // re-points them to the current export.
    let earlier = |name: &str| rewritten_earlier(&n, name);
    let identity = support::identity::openflux_kubeconfig(&env).expect("a kubeconfig for openflux");
    let proxy = ApiProxy::start(&identity).await;
    let _of = Openflux::start_as(
        &env,
        &n,
        &["--watch-all-namespaces=false", &format!("--namespace={n}")],
        Some(proxy.kubeconfig()),
    )
    .await;
    let (kustomizations, _) =
        support::dynamic_api(&env.client, KUSTOMIZE, "Kustomization", Some(&n))
            .await
            .expect("the Kustomization API");
    let patches_of = |name: &str| -> Vec<support::proxy::Write> {
        let path = format!("/kustomizations/{name}?");
        proxy
            .writes()
            .into_iter()
            .filter(|w| w.method == "PATCH" && w.path.contains(&path))
            .collect()
    };

    // 1. The person points the consumer elsewhere while openflux's patch
    // is held.
    proxy.hold_writes_to("/kustomizations/");
    env.apply(&earlier("taken")).await.expect("the consumer");
    wait_for("openflux's re-point patch of taken", TIMEOUT, || async {
        (proxy.held() >= 1).then_some(())
    })
    .await;
    let theirs = json!({"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "taken"});
    kustomizations
        .patch(
            "taken",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"sourceRef": theirs}})),
        )
        .await
        .expect("the person's edit of taken");
    proxy.release();
    wait_for(
        "the held patch of taken to be answered",
        TIMEOUT,
        || async {
            patches_of("taken")
                .iter()
                .any(|w| w.status.is_some())
                .then_some(())
        },
    )
    .await;

    // 2. The person changes something else while openflux's patch is held.
    // Created after taken's edit, in the same watch: openflux looks at
    // `web` only after it looked at taken's new version.
    proxy.hold_writes_to("/kustomizations/");
    env.apply(&earlier("web")).await.expect("the consumer");
    wait_for("openflux's re-point patch of web", TIMEOUT, || async {
        (proxy.held() >= 2).then_some(())
    })
    .await;
    let edit = json!({"metadata": {"labels": {"edited-by": "person"}}, "spec": {"interval": "7m"}});
    kustomizations
        .patch("web", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("the person's edit of web");
    proxy.release();

    let (_, export) = wait_export(&env, &n, "web", |_| true).await;
    let expected = reference_to(&export);
    let moved = wait_for("web to be re-pointed", TIMEOUT, || async {
        let ks = env.find(KUSTOMIZE, "Kustomization", &n, "web").await?;
        (field(&ks, "/spec/sourceRef") == Some(&expected)).then_some(ks)
    })
    .await;
    assert_eq!(
        moved.labels().get("edited-by").map(String::as_str),
        Some("person"),
        "the person's label was overwritten"
    );
    assert_eq!(
        field(&moved, "/spec/interval"),
        Some(&json!("7m")),
        "the person's interval was overwritten"
    );
    let taken = env
        .find(KUSTOMIZE, "Kustomization", &n, "taken")
        .await
        .expect("taken");
    assert_eq!(
        field(&taken, "/spec/sourceRef"),
        Some(&theirs),
        "the person's reference was overwritten"
    );
    // The API server applies a patch before the proxy has read its answer:
    // the move can show before the proxy records the patch that made it.
    let web = wait_for(
        "the proxy to record the answers to web's patches",
        TIMEOUT,
        || async {
            let web = patches_of("web");
            web.iter().all(|w| w.status.is_some()).then_some(web)
        },
    )
    .await;
    assert_eq!(
        web.first().and_then(|w| w.status),
        Some(409),
        "the held patch of web was not refused: {web:#?}"
    );
    assert!(
        web.iter().any(|w| w.status == Some(200)),
        "web was not re-pointed after the refusal: {web:#?}"
    );

    let taken_patches = patches_of("taken");
    assert_eq!(
        taken_patches.iter().map(|w| w.status).collect::<Vec<_>>(),
        [Some(409)],
        "{taken_patches:#?}"
    );
    ns.delete().await;
}

/// A consumer is moved to its new export only once that export holds its
/// Artifact. Moved earlier, Flux finds no source to fetch and, the export
/// carrying the revision the consumer already applied, is not woken when
/// the Artifact comes: the consumer would wait for its interval. A proxy in
/// front of openflux holds its writes of exports; the consumer of an
/// earlier export is left where it is meanwhile, and moved (and applied)
/// once the export is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_is_moved_only_to_an_export_that_holds_its_artifact() {
    use support::openflux::Openflux;
    use support::proxy::ApiProxy;

    let env = cluster().await;
    install(&env, &[]).await;
    let ns = env.namespace("repoint-wait").await;
    let n = ns.name().to_string();
    web_with_artifact(&env, &n, "waited").await;
    let earlier = rewritten_earlier(&n, "web");
    env.apply(&earlier).await.expect("the consumer");

    let identity = support::identity::openflux_kubeconfig(&env).expect("a kubeconfig for openflux");
    let proxy = ApiProxy::start(&identity).await;
    let exports = [
        format!("/namespaces/{n}/externalartifacts"),
        format!("/namespaces/{n}/ocirepositories"),
    ];
    proxy.hold_writes_to_any(&[&exports[0], &exports[1]]);
    let of = Openflux::start_as(
        &env,
        &n,
        &["--watch-all-namespaces=false", &format!("--namespace={n}")],
        Some(proxy.kubeconfig()),
    )
    .await;
    let moves = || -> Vec<support::proxy::Write> {
        proxy
            .writes()
            .into_iter()
            .filter(|w| w.method == "PATCH" && w.path.contains("/kustomizations/web?"))
            .collect()
    };
    wait_for(
        "openflux to look at web while its export is held",
        TIMEOUT,
        || async {
            let waiting = of.log_tail(400).contains("not re-pointed yet");
            (proxy.held() >= 1 && (waiting || !moves().is_empty())).then_some(())
        },
    )
    .await;
    assert!(
        moves().is_empty(),
        "web was moved before its export was written: {:#?}",
        moves()
    );

    proxy.release();
    let (_, export) = wait_export(&env, &n, "web", |_| true).await;
    let expected = reference_to(&export);
    wait_for("web to be moved", TIMEOUT, || async {
        let ks = env.find(KUSTOMIZE, "Kustomization", &n, "web").await?;
        (field(&ks, "/spec/sourceRef") == Some(&expected)).then_some(())
    })
    .await;
    support::configmap_holds(&env, &n, "app-config", "waited", TIMEOUT).await;
    // The move can show before the proxy records the answer to its patch.
    let writes = wait_for(
        "the proxy to record the patch that moved web",
        TIMEOUT,
        || async {
            let writes = proxy.writes();
            let recorded = writes.iter().any(|w| {
                w.method == "PATCH"
                    && w.path.contains("/kustomizations/web?")
                    && w.status == Some(200)
            });
            recorded.then_some(writes)
        },
    )
    .await;
    let artifact_written = writes
        .iter()
        .filter(|w| w.path.contains(&format!("/{}/status", export.name_any())))
        .filter(|w| w.status.is_some_and(|s| s < 300))
        .filter_map(|w| w.answered)
        .min()
        .expect("openflux wrote the export's status");
    let moved = writes
        .iter()
        .find(|w| {
            w.method == "PATCH" && w.path.contains("/kustomizations/web?") && w.status == Some(200)
        })
        .expect("openflux's patch that moved web");
    assert!(
        moved.sent > artifact_written,
        "web was moved before its export held its Artifact: {writes:#?}"
    );
    ns.delete().await;
}
