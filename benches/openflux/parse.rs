//! The admission parser on the webhook's hot path, against kube's
//! `AdmissionReview` types, on the same bodies; no cluster. Figures in ns
//! per request:
//!
//! - one pass: `review::parse`, what the webhook runs: typed, and of the
//!   objects only what the decision reads;
//! - tree: the whole body read as a JSON tree (what the webhook ran for
//!   bodies that were not well-formed before it stopped building trees);
//! - the baseline: kube's `AdmissionReview<DynamicObject>` read from the
//!   body and turned into its `AdmissionRequest`, plus the object as JSON,
//!   which is what the decision reads.

use std::hint::black_box;
use std::time::{Duration, Instant};

use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;
use openflux::webhook::review;
use serde_json::{json, Value};

use crate::report::{Figure, Report};

const SECTION: &str = "admission parse";

/// A review of `kind` (`resource` in `group`) carrying `object`, and the
/// same as `oldObject` when `update`.
fn review_body(group: &str, kind: &str, resource: &str, object: &Value, update: bool) -> Vec<u8> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "requestKind": {"group": group, "version": "v1", "kind": kind},
            "requestResource": {"group": group, "version": "v1", "resource": resource},
            "name": "app", "namespace": "apps",
            "operation": if update { "UPDATE" } else { "CREATE" },
            "userInfo": {"username": "system:serviceaccount:flux-system:kustomize-controller",
                         "uid": "u", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": object,
            "oldObject": if update { object.clone() } else { Value::Null },
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "kubectl"},
        }
    });
    serde_json::to_vec(&review).expect("a review serializes")
}

/// The bodies measured: a Kustomization as people write it, a HelmRelease
/// update with a large values block, and a near-limit object.
fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let kustomization = json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": "app", "namespace": "apps", "labels": {"team": "a"}},
        "spec": {"interval": "10m", "path": "./deploy", "prune": true,
                 "sourceRef": {"apiVersion": "sources.openflux.dev/v1alpha1", "kind": "HttpSource", "name": "web"}},
    });
    let values: serde_json::Map<String, Value> = (0..600)
        .map(|i| (format!("key{i:04}"), json!({"enabled": i % 2 == 0, "replicas": i, "image": format!("registry.example/app-{i}:1.2.{i}")})))
        .collect();
    let helmrelease = json!({
        "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
        "metadata": {"name": "app", "namespace": "apps"},
        "spec": {"interval": "10m", "chartRef": {"kind": "HttpSource", "name": "chart"}, "values": values},
    });
    let big: Vec<Value> = (0..9000)
        .map(|i| json!({"name": format!("patch-{i}"), "target": {"kind": "Deployment", "name": format!("app-{i}")}, "patch": "- op: add\n  path: /metadata/labels/x\n  value: y\n"}))
        .collect();
    let large = json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": {"name": "app", "namespace": "apps"},
        "spec": {"interval": "10m", "sourceRef": {"kind": "HttpSource", "name": "web"}, "patches": big},
    });
    vec![
        (
            "Kustomization create",
            review_body(
                "kustomize.toolkit.fluxcd.io",
                "Kustomization",
                "kustomizations",
                &kustomization,
                false,
            ),
        ),
        (
            "HelmRelease update",
            review_body(
                "helm.toolkit.fluxcd.io",
                "HelmRelease",
                "helmreleases",
                &helmrelease,
                true,
            ),
        ),
        (
            "large Kustomization create",
            review_body(
                "kustomize.toolkit.fluxcd.io",
                "Kustomization",
                "kustomizations",
                &large,
                false,
            ),
        ),
    ]
}

/// Nanoseconds per call of `f`, the best of several rounds of `budget` each.
fn ns_per_call(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let started = Instant::now();
        let mut calls = 0u32;
        while started.elapsed() < budget {
            f();
            calls += 1;
        }
        best = best.min(started.elapsed().as_nanos() as f64 / f64::from(calls));
    }
    best
}

/// kube's types, as far as the decision's input: the request, and its
/// object as JSON.
fn kube_parse(body: &[u8]) -> Option<Value> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).ok()?;
    let request: AdmissionRequest<DynamicObject> = review.try_into().ok()?;
    serde_json::to_value(request.object?).ok()
}

pub fn run(quick: bool, report: &mut Report) -> anyhow::Result<()> {
    let budget = if quick {
        Duration::from_millis(10)
    } else {
        Duration::from_millis(300)
    };
    for (name, body) in bodies() {
        let ours = review::parse(&body).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        let kept = kube_parse(&body).map(|object| {
            use serde::de::DeserializeSeed;
            openflux::rewrite::admission::prune::Pruned(
                openflux::rewrite::admission::prune::object_keep(),
            )
            .deserialize(object)
        });
        if ours.object != kept.transpose().ok().flatten() {
            report.note(format!(
                "{SECTION}: {name}: kube's types do not give the object back as sent"
            ));
        }
        let one_pass = ns_per_call(budget, || drop(black_box(review::parse(black_box(&body)))));
        let tree = ns_per_call(budget, || {
            drop(black_box(serde_json::from_slice::<Value>(black_box(&body))))
        });
        let kube = ns_per_call(budget, || drop(black_box(kube_parse(black_box(&body)))));
        let size = format!("{name}, {} KiB", body.len() / 1024);
        eprintln!(
            "{SECTION}: {size}: one pass {one_pass:.0} ns, tree {tree:.0} ns, kube {kube:.0} ns"
        );
        report.push(
            Figure::new(
                SECTION,
                &format!("{size}: one pass vs kube"),
                "ns",
                one_pass,
            )
            .baseline(kube),
        );
        report.push(
            Figure::new(SECTION, &format!("{size}: tree vs kube"), "ns", tree).baseline(kube),
        );
    }
    Ok(())
}
