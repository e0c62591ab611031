//! openflux as users run it: installed by the "Install from a clone" block
//! of CONTRIBUTING.md on the nodes cell (two real nodes: kubelet, containerd,
//! runc; Flux as Pods), two replicas under the memory limit of
//! `manifests/deployment.yaml`. N suspended GitRepositories with an artifact
//! are created while it runs, and the leader mirrors them; then the
//! Deployment is restarted with the N Artifacts present.
//!
//! Memory is read where the kubelet accounts it: the memory cgroup it made
//! for each container (its charge, peak and limit), beside the process's
//! own peak resident set. The baseline of each container figure is the
//! container's limit, read from the same cgroup.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use openflux_api::runtime::panics;
use serde_json::json;

use crate::cluster;
use crate::mirror::setup;
use crate::observe::{string_at, Observer};
use crate::process;
use crate::report::{Figure, Report};
use crate::support::pods::{leader_pod, openflux_pods, MemoryCgroup, OpenfluxPod, SYSTEM};
use crate::support::{self, Cell, Env};

/// Bound of the rollouts: images are pulled and Pods started on two small
/// nodes.
const ROLLOUT: Duration = Duration::from_secs(300);
/// The container's metrics port (`manifests/deployment.yaml`).
const METRICS_PORT: u16 = 8080;

const MIB: f64 = 1048576.0;

pub async fn run(
    sizes: &[usize],
    setup_concurrency: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let env = support::cell(Cell::Nodes).await;
    blocking("uninstalling an earlier openflux", || {
        support::nodes::uninstall(&env);
    })?;
    blocking("installing openflux as the guide says", || {
        support::nodes::install_as_the_guide_says(&env);
    })?;
    report.param("pods.sizes", sizes);
    let mut result = Ok(());
    for &n in sizes {
        let ns = env.namespace("bench-pods").await;
        let name = ns.name().to_string();
        let measured = one_size(&env, n, &name, setup_concurrency, report).await;
        let bound = Duration::from_secs(120 + n as u64 / 20);
        if let Some(took) = cluster::delete_namespace(&env, ns, Some(bound)).await {
            eprintln!(
                "pods N={n}: namespace deleted in {:.1}s",
                took.as_secs_f64()
            );
        }
        result = measured.with_context(|| format!("pods benchmark with N={n}"));
        if result.is_err() {
            break;
        }
    }
    // The cell is left as it was found, without openflux: the nodes cell's
    // tests, which `make test` runs in a process beside this one, install
    // it again when they see it gone.
    blocking("uninstalling openflux", || support::nodes::uninstall(&env))?;
    result
}

async fn one_size(
    env: &Env,
    n: usize,
    ns: &str,
    setup_concurrency: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let section = format!("pods N={n}");
    let replicas = settled(env).await?;
    let (leader, cgroups) = leader_and_cgroups(env, &replicas).await?;
    for c in &cgroups {
        // The peak from here on.
        c.cgroup.reset_peak();
    }
    let artifacts = Observer::start(
        "Artifacts",
        cluster::api(&env.client, ns, &cluster::artifacts()),
        |o| string_at(o, "/spec/revision"),
    );
    artifacts.synced(Duration::from_secs(60)).await?;
    let repos = cluster::api(&env.client, ns, &cluster::git_repositories());
    let started = Instant::now();
    setup::create_sources(&repos, ns, n, setup_concurrency).await?;
    let created = started.elapsed();
    let bound = Duration::from_secs(120) + Duration::from_millis(20 * n as u64);
    artifacts.until_count(n, false, bound, || Ok(())).await?;
    let synced = started.elapsed();
    eprintln!(
        "{section}: {n} sources created in {:.1}s, all their Artifacts seen after {:.1}s",
        created.as_secs_f64(),
        synced.as_secs_f64()
    );
    let sync = Memory::read(&cgroups, &leader);
    // The replica that only answers the webhook: its peak over the same time.
    let other = cgroups
        .iter()
        .find(|c| c.pod.name != leader)
        .map(|c| (c.cgroup.peak() as f64 / MIB, c.cgroup.limit() as f64 / MIB));
    unchanged(env, &replicas, "the sync").await?;

    // A restart with the N Artifacts present: every new container lists
    // them all, and the new leader reconciles every source.
    let before: Vec<String> = replicas.iter().map(|p| p.name.clone()).collect();
    restart(env).await?;
    let replicas = within("two new openflux Pods", ROLLOUT, || async {
        let live = two_live(env).await?;
        live.iter()
            .all(|p| !before.contains(&p.name))
            .then_some(live)
    })
    .await?;
    let (new_leader, new_cgroups) = leader_and_cgroups(env, &replicas).await?;
    let leader_ip = replicas
        .iter()
        .find(|p| p.name == new_leader)
        .map(|p| p.ip.clone())
        .context("the new leader's address")?;
    let metrics: std::net::SocketAddr = format!("{leader_ip}:{METRICS_PORT}").parse()?;
    // Every GitRepository of the cluster, the benchmark's N among them.
    let all: Api<DynamicObject> = Api::all_with(env.client.clone(), &cluster::git_repositories());
    let sources = all.list_metadata(&ListParams::default()).await?.items.len();
    within(
        &format!("the new leader {new_leader} to reconcile the cluster's {sources} sources"),
        bound,
        || async {
            let (status, body) = support::openflux::http_get(metrics, "/metrics").await?;
            (status == 200 && process::mirror_reconciles(&body) >= sources as f64).then_some(())
        },
    )
    .await?;
    let restarted = Memory::read(&new_cgroups, &new_leader);
    unchanged(env, &replicas, "the restart").await?;

    let limit = sync.limit;
    let under = |peak: f64| peak < limit;
    report.push(
        Figure::new(
            &section,
            "leader container memory peak, sync of N sources, vs. its limit",
            "MiB",
            sync.peak,
        )
        .baseline(limit)
        .target("under the container's limit", under(sync.peak)),
    );
    report.push(
        Figure::new(
            &section,
            "leader container working set after the sync, vs. its limit",
            "MiB",
            sync.working_set,
        )
        .baseline(limit),
    );
    if let Some(rss) = sync.process_peak_rss {
        report.push(
            Figure::new(
                &section,
                "leader process peak RSS (VmHWM) vs. its container's peak",
                "MiB",
                rss,
            )
            .baseline(sync.peak),
        );
    }
    if let Some(anonymous) = sync.process_anonymous_rss {
        report.push(
            Figure::new(
                &section,
                "leader process anonymous RSS (RssAnon) vs. its container's working set, after the sync",
                "MiB",
                anonymous,
            )
            .baseline(sync.working_set),
        );
    }
    if let Some((peak, limit)) = other {
        report.push(
            Figure::new(
                &section,
                "other replica's container memory peak (webhook only), vs. its limit",
                "MiB",
                peak,
            )
            .baseline(limit),
        );
    }
    report.push(
        Figure::new(
            &section,
            "restart with N Artifacts: new leader container memory peak, vs. its limit",
            "MiB",
            restarted.peak,
        )
        .baseline(restarted.limit)
        .target(
            "under the container's limit",
            restarted.peak < restarted.limit,
        ),
    );
    report.push(
        Figure::new(
            &section,
            "restart peak vs. the sync's peak",
            "MiB",
            restarted.peak,
        )
        .baseline(sync.peak),
    );
    Ok(())
}

/// Memory figures of the leader's container, in MiB.
struct Memory {
    peak: f64,
    limit: f64,
    working_set: f64,
    process_peak_rss: Option<f64>,
    process_anonymous_rss: Option<f64>,
}

impl Memory {
    fn read(cgroups: &[Container], leader: &str) -> Memory {
        let c = cgroups
            .iter()
            .find(|c| c.pod.name == leader)
            .map(|c| &c.cgroup)
            .expect("the leader's container is among those found");
        Memory {
            peak: c.peak() as f64 / MIB,
            limit: c.limit() as f64 / MIB,
            working_set: c.working_set() as f64 / MIB,
            process_peak_rss: c.process_peak_rss().map(|b| b as f64 / MIB),
            process_anonymous_rss: c.process_anonymous_rss().map(|b| b as f64 / MIB),
        }
    }
}

/// An openflux container: its Pod and its memory cgroup.
struct Container {
    pod: OpenfluxPod,
    cgroup: MemoryCgroup,
}

/// openflux's Deployment Available with its two replicas' Pods live.
async fn settled(env: &Env) -> anyhow::Result<Vec<OpenfluxPod>> {
    within(
        "openflux's Deployment Available with two Pods",
        ROLLOUT,
        || two_live(env),
    )
    .await
}

/// openflux's two live Pods, if its Deployment is Available and has two.
async fn two_live(env: &Env) -> Option<Vec<OpenfluxPod>> {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), SYSTEM);
    let available = support::is_available(&deployments.get("openflux").await.ok()?);
    let pods = openflux_pods(env).await;
    (available && pods.len() == 2).then_some(pods)
}

/// Polls `check` every half second until it gives a value, for at most
/// `bound`.
async fn within<T, F: Future<Output = Option<T>>>(
    what: &str,
    bound: Duration,
    mut check: impl FnMut() -> F,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(found) = check().await {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            bail!("waited {bound:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The leader's Pod name and the containers of `replicas`, each with the
/// memory cgroup the kubelet made for it.
async fn leader_and_cgroups(
    env: &Env,
    replicas: &[OpenfluxPod],
) -> anyhow::Result<(String, Vec<Container>)> {
    let leader = within(&format!("a leader among {replicas:?}"), ROLLOUT, || async {
        leader_pod(env)
            .await
            .filter(|leader| replicas.iter().any(|p| p.name == *leader))
    })
    .await?;
    let containers: Vec<Container> = MemoryCgroup::of_containers("openflux")
        .into_iter()
        .filter_map(|cgroup| {
            let uid = cgroup.pod_uid()?;
            let pod = replicas.iter().find(|p| p.uid == uid)?.clone();
            Some(Container { pod, cgroup })
        })
        .collect();
    if containers.len() != replicas.len() {
        bail!(
            "found the memory cgroups of {} of openflux's {} containers on the nodes",
            containers.len(),
            replicas.len()
        );
    }
    Ok((leader, containers))
}

/// Fails if a container of `replicas` restarted, was killed for memory, or
/// its Pod went away during `phase`.
async fn unchanged(env: &Env, replicas: &[OpenfluxPod], phase: &str) -> anyhow::Result<()> {
    let now = openflux_pods(env).await;
    for pod in replicas {
        let Some(live) = now.iter().find(|p| p.name == pod.name) else {
            bail!("openflux's Pod {} went away during {phase}", pod.name);
        };
        if live.oom_killed || live.restarts != pod.restarts {
            bail!(
                "openflux's Pod {} restarted during {phase} (killed for memory: {})",
                pod.name,
                live.oom_killed
            );
        }
    }
    Ok(())
}

/// Restarts openflux's Deployment as `kubectl rollout restart` does: a new
/// Pod template annotation.
async fn restart(env: &Env) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), SYSTEM);
    let at = crate::report::date();
    deployments
        .patch(
            "openflux",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "spec": {"template": {"metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt": at,
                }}}},
            })),
        )
        .await
        .context("restarting openflux's Deployment")?;
    Ok(())
}

/// Runs `f`, which panics on failure (the test kit's installers do), on
/// this worker thread, and turns its panic into an error.
fn blocking(what: &str, f: impl FnOnce()) -> anyhow::Result<()> {
    tokio::task::block_in_place(|| std::panic::catch_unwind(AssertUnwindSafe(f)))
        .map_err(|panic| anyhow!("{what}: {}", panics::message(&*panic)))
}
