//! One source owning many Artifacts, one of them changing: the work a
//! change costs the leader, which exports for every namespace, so a tenant
//! who writes n Artifacts under one source of theirs must not make it
//! quadratic. No cluster. For n = 10, 100 and 1,000 Artifacts of one
//! source, each change (every Artifact in turn gets a new revision) is
//! routed against the owner index ([`route`]: the index change and the
//! reconciles it wakes), each woken export reconcile takes its decision
//! (the export name, [`OwnerIndex::export_name`], which weighs the
//! source's default), and the index takes the change. Figures per change:
//! wakes, and the time of all of it.
//!
//! The baseline, in the same run on the same index: the rule openflux had
//! before, which woke every sibling of a changed Artifact, each of them
//! then taking the same decision.

use std::hint::black_box;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use openflux::api::{Artifact, ArtifactSpec};
use openflux::index::{IndexedArtifact, OwnerIndex};
use openflux::runtime::router::{route, Event, Wake};
use openflux::watch::change::Change;

use crate::report::{Figure, Report};

const SECTION: &str = "Artifacts per source";

fn artifact(i: usize, revision: u64) -> Artifact {
    let mut a = Artifact::new(
        &format!("a{i:05}"),
        ArtifactSpec {
            url: format!("http://storage/a{i}.tar.gz"),
            revision: format!("r{revision}"),
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("tenant".into());
    a.metadata.uid = Some(format!("uid-{i}"));
    a.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "sources.openflux.dev/v1alpha1".into(),
        kind: "HttpSource".into(),
        name: "many".into(),
        uid: "uid-source".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    a
}

/// Per change: (wakes, ns) of `changes` changes to an index of `n`
/// Artifacts of one source; `every_sibling` wakes them all, as before.
fn measure(n: usize, changes: usize, every_sibling: bool) -> (f64, f64) {
    let mut index = OwnerIndex::new();
    index.reset((0..n).filter_map(|i| IndexedArtifact::from_artifact(&artifact(i, 0))));
    let mut wakes = 0usize;
    let started = Instant::now();
    for c in 0..changes {
        let changed = artifact(c % n, c as u64 + 1);
        let routed = route(&Event::Artifact(Change::Applied(&changed)), &index);
        let mut woken: Vec<_> = routed
            .wake
            .iter()
            .filter_map(Wake::export_key)
            .map(|key| key.name.to_string())
            .collect();
        if every_sibling {
            woken = (0..n).map(|i| format!("a{i:05}")).collect();
        }
        wakes += woken.len();
        index.change(routed.index.expect("an index change"));
        for name in &woken {
            if let Some(entry) = index.artifact("tenant", name) {
                black_box(index.export_name(entry));
            }
        }
    }
    let elapsed = started.elapsed().as_nanos() as f64;
    (wakes as f64 / changes as f64, elapsed / changes as f64)
}

pub fn run(quick: bool, report: &mut Report) -> anyhow::Result<()> {
    let sizes: &[usize] = if quick { &[10, 100] } else { &[10, 100, 1000] };
    let mut smallest: Option<(usize, f64)> = None;
    for &n in sizes {
        let changes = if quick { n.max(50) } else { n.max(1000) };
        // The faster of three runs of each.
        let best = |every| {
            (0..3)
                .map(|_| measure(n, changes, every))
                .fold((0.0, f64::INFINITY), |(_, t), (w, u)| (w, t.min(u)))
        };
        let (wakes, ns) = best(false);
        let (old_wakes, old_ns) = best(true);
        eprintln!(
            "{SECTION}: n={n}: {wakes:.2} wakes, {ns:.0} ns per change; waking every sibling {old_wakes:.0} wakes, {old_ns:.0} ns"
        );
        report.push(
            Figure::new(SECTION, &format!("n={n}: wakes per change"), "wakes", wakes)
                .baseline(old_wakes)
                .target("at most 3 whatever n", wakes <= 3.0),
        );
        let mut time =
            Figure::new(SECTION, &format!("n={n}: time per change"), "ns", ns).baseline(old_ns);
        match smallest {
            None => smallest = Some((n, ns)),
            Some((n0, ns0)) => {
                let growth = ns / ns0;
                let allowed = 2.0 * n as f64 / n0 as f64;
                time = time.target(
                    format!(
                        "grows at most linearly from n={n0} (x{growth:.1}, at most x{allowed:.0})"
                    ),
                    growth <= allowed,
                );
            }
        }
        report.push(time);
    }
    Ok(())
}
