//! End to end on the local control plane: from a changed artifact to the
//! stock kustomize-controller reporting the new revision as applied
//! (`Kustomization.status.lastAppliedRevision`).
//!
//! - custom source (openflux): a new tarball on the fixtures' static file
//!   server, then the Artifact (owned by a `TestSource`) updated; openflux
//!   exports it as a shadow OCIRepository the Kustomization references;
//! - baseline (stock Flux): a new commit pushed to the fixtures' Git server,
//!   then a reconcile requested on the GitRepository the Kustomization
//!   references.
//!
//! The clock starts when the change is published to the cluster (the
//! Artifact write, the reconcile request): making the tarball and pushing the
//! commit are the producer's work and stay outside both.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kube::api::{Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::cluster::{self, ARTIFACT, KUSTOMIZE, MANAGER, SOURCE, TEST_SOURCE};
use crate::observe::{string_at, Observer};
use crate::process::Openflux;
use crate::report::{Figure, Report};
use crate::stats::{median, ms};
use crate::support::openflux::publish;
use crate::support::{unique_name, Env, Fixtures, GitRepo};

/// Bound on one change reaching the Kustomization.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(120);

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: \"{value}\"\n"
    )
}

/// Puts a tarball with one ConfigMap on the static server, as a producer
/// would; returns the Artifact spec pointing at it.
fn publish_value(fx: &Fixtures, ns: &str, value: &str) -> Value {
    let manifest = configmap("bench-custom", value);
    publish(fx, ns, "bench", value, &[("configmap.yaml", &manifest)])
}

pub async fn run(
    env: &Env,
    samples: usize,
    wait_cleanup: bool,
    report: &mut Report,
) -> anyhow::Result<()> {
    let fx = env
        .try_fixtures()
        .map_err(|why| anyhow::anyhow!("the end-to-end benchmark cannot run: {why}"))?
        .clone();
    cluster::install_crds(env).await?;
    report.param("e2e.samples", samples);
    let ns = env.namespace("bench-e2e").await;
    let name = ns.name().to_string();
    let repo_name = unique_name("bench-e2e");
    let result = measure(env, &fx, &name, &repo_name, samples, report).await;
    cluster::delete_namespace(env, ns, wait_cleanup.then(|| Duration::from_secs(120))).await;
    let _ = std::fs::remove_dir_all(fx.repo(&repo_name).path);
    let _ = std::fs::remove_dir_all(fx.http_root.join("artifacts").join(&name));
    result.context("end-to-end benchmark")
}

/// The shadow openflux exports the bench's TestSource `web` as.
fn export_name() -> String {
    openflux::names::identity::source_export_name("bench.openflux.dev", "TestSource", "web")
}

async fn measure(
    env: &Env,
    fx: &Fixtures,
    ns: &str,
    repo_name: &str,
    samples: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let client = &env.client;
    // Shadow OCIRepositories: read by every Flux, whatever its feature
    // gates, so the figures compare on any cluster.
    let args = vec![
        "--watch-all-namespaces=false".to_string(),
        format!("--namespace={ns}"),
        "--export=shadow".to_string(),
        // No webhook here, so no Artifact has a recorded writer.
        "--verify-artifact-writers=false".to_string(),
    ];
    let mut of = Openflux::spawn(env, "bench-e2e", &args)?;
    of.wait_serving(Duration::from_secs(60)).await?;

    let kustomizations = Observer::start(
        "Kustomization",
        cluster::api(client, ns, &cluster::kustomizations()),
        |o| string_at(o, "/status/lastAppliedRevision"),
    );
    let exports = Observer::start(
        "OCIRepository",
        cluster::api(client, ns, &cluster::oci_repositories()),
        |o| string_at(o, "/status/artifact/revision"),
    );
    kustomizations.synced(Duration::from_secs(30)).await?;
    exports.synced(Duration::from_secs(30)).await?;

    // Stock path: GitRepository -> Kustomization.
    let (fx2, rn) = (fx.clone(), repo_name.to_string());
    let (repo, first) = tokio::task::spawn_blocking(move || {
        fx2.create_repo(
            &rn,
            &[("deploy/configmap.yaml", &configmap("bench-git", "0"))],
        )
    })
    .await??;
    let git_ready = kustomizations.expect("git", &repo.flux_revision(&first));
    env.apply(&json!({
        "apiVersion": SOURCE, "kind": "GitRepository",
        "metadata": {"name": "app", "namespace": ns},
        "spec": {"url": repo.url, "ref": {"branch": "main"}, "interval": "10m", "timeout": "30s"},
    }))
    .await?;
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "git", "namespace": ns},
        "spec": {"interval": "10m", "prune": true, "path": "./deploy", "targetNamespace": ns,
                 "sourceRef": {"kind": "GitRepository", "name": "app"}},
    }))
    .await?;

    // openflux path: TestSource -> Artifact -> shadow OCIRepository -> Kustomization.
    let source = env
        .apply(&json!({
            "apiVersion": TEST_SOURCE, "kind": "TestSource",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"producer": "openflux-bench"},
        }))
        .await?;
    let owner = json!([{
        "apiVersion": TEST_SOURCE, "kind": "TestSource", "name": "web",
        "uid": source.uid().context("TestSource without uid")?, "controller": true,
    }]);
    let artifacts = cluster::api(client, ns, &cluster::artifacts());
    let write_artifact = |spec: Value| {
        let artifacts = artifacts.clone();
        let body = json!({
            "apiVersion": ARTIFACT, "kind": "Artifact",
            "metadata": {"name": "web", "ownerReferences": owner},
            "spec": spec,
        });
        async move {
            artifacts
                .patch(
                    "web",
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .context("writing the Artifact")
        }
    };
    let spec = publish_value(fx, ns, "custom-0");
    // A shadow carries the digest as its revision where the source's
    // revision (`custom-<k>@sha256:...`) is not one helm-controller reads.
    let custom_ready = kustomizations.expect("custom", spec["digest"].as_str().unwrap_or_default());
    write_artifact(spec).await?;
    env.apply(&json!({
        "apiVersion": KUSTOMIZE, "kind": "Kustomization",
        "metadata": {"name": "custom", "namespace": ns},
        "spec": {"interval": "10m", "prune": true, "path": "./", "targetNamespace": ns,
                 "sourceRef": {"kind": "OCIRepository", "name": export_name()}},
    }))
    .await?;
    git_ready.wait(SAMPLE_TIMEOUT).await?;
    custom_ready.wait(SAMPLE_TIMEOUT).await?;
    eprintln!("end to end: both Kustomizations applied their first revision");

    let repos = cluster::api(client, ns, &cluster::git_repositories());
    let mut git = Vec::new();
    let mut custom = Vec::new();
    let mut export_hop = Vec::new();
    for k in 1..=samples {
        // Alternate which path goes first, so neither always runs warm.
        for path in if k % 2 == 1 { [0, 1] } else { [1, 0] } {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if path == 0 {
                git.push(git_sample(&repo, &repos, &kustomizations, k).await?);
            } else {
                let spec = publish_value(fx, ns, &format!("custom-{k}"));
                let rev = spec["digest"].as_str().unwrap_or_default().to_string();
                let applied = kustomizations.expect("custom", &rev);
                let exported = exports.expect(&export_name(), &rev);
                let t0 = Instant::now();
                write_artifact(spec).await?;
                let t_exported = exported.wait(SAMPLE_TIMEOUT).await?;
                let t_applied = applied.wait(SAMPLE_TIMEOUT).await?;
                export_hop.push(ms(t_exported.duration_since(t0)));
                custom.push(ms(t_applied.duration_since(t0)));
            }
        }
        of.check_alive()?;
        eprintln!(
            "end to end: sample {k}: git {:.0} ms, custom {:.0} ms",
            git.last().copied().unwrap_or_default(),
            custom.last().copied().unwrap_or_default()
        );
    }
    of.stop();

    let section = "end to end";
    let (c, g) = (median(&custom), median(&git));
    report.push(
        Figure::new(section, "changed artifact to applied, median", "ms", c)
            .baseline(g)
            .target("ratio <= 1.2", c / g <= 1.2),
    );
    report.push(Figure::new(
        section,
        "custom: Artifact write to shadow OCIRepository updated, median",
        "ms",
        median(&export_hop),
    ));
    report.samples("end to end custom source to applied (ms)", &custom);
    report.samples("end to end GitRepository to applied (ms)", &git);
    report.samples(
        "end to end Artifact to shadow OCIRepository (ms)",
        &export_hop,
    );
    Ok(())
}

/// One stock sample: push a commit, request a reconcile, wait for the apply.
async fn git_sample(
    repo: &GitRepo,
    repos: &kube::Api<kube::api::DynamicObject>,
    kustomizations: &Observer,
    k: usize,
) -> anyhow::Result<f64> {
    let r = repo.clone();
    let value = format!("git-{k}");
    let sha = tokio::task::spawn_blocking(move || {
        r.commit(
            &[("deploy/configmap.yaml", &configmap("bench-git", &value))],
            &[],
            &format!("Bench change {k}"),
        )
    })
    .await??;
    let applied = kustomizations.expect("git", &repo.flux_revision(&sha));
    let requested = format!("bench-{k}-{}", crate::report::date());
    let patch =
        json!({"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": requested}}});
    let t0 = Instant::now();
    repos
        .patch("app", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("requesting a reconcile of the GitRepository")?;
    let t_applied = applied.wait(SAMPLE_TIMEOUT).await?;
    Ok(ms(t_applied.duration_since(t0)))
}
