//! The router as a table: one row an event, with the index change and the
//! wakes it must produce.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;

use super::*;
use crate::api::{ArtifactSpec, MANAGED_BY, MANAGED_BY_LABEL};
use crate::vocabulary::marks::DEFAULT_ARTIFACT_LABEL;

const HTTP: &str = "sources.openflux.dev/v1alpha1";
const FLUX: &str = "source.toolkit.fluxcd.io/v1";
const GIT: &StockSource = &StockSource::GIT_REPOSITORY;
const EA: &StockSource = &StockSource::EXTERNAL_ARTIFACT;

fn artifact(name: &str, owner: Option<(&str, &str, &str)>) -> Artifact {
    let mut a = Artifact::new(
        name,
        ArtifactSpec {
            url: "http://storage/a.tar.gz".into(),
            revision: "r1".into(),
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("apps".into());
    a.metadata.uid = Some(format!("uid-{name}"));
    a.metadata.owner_references = owner.map(|(api_version, kind, oname)| {
        vec![OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: oname.into(),
            uid: format!("uid-{kind}-{oname}"),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    a
}

fn source(kind: &str, name: &str, ours: bool) -> Source {
    let labels = if ours {
        json!({ MANAGED_BY_LABEL: MANAGED_BY })
    } else {
        json!({})
    };
    let object: crate::mirror::FluxSource = serde_json::from_value(json!({
        "apiVersion": FLUX, "kind": kind,
        "metadata": {"name": name, "namespace": "apps", "labels": labels},
    }))
    .unwrap();
    Source::from(&object)
}

fn exported(name: &str, owners: &[(&str, &str, &str)]) -> DynamicObject {
    let refs: Vec<_> = owners
        .iter()
        .map(|(api_version, kind, owner)| {
            json!({"apiVersion": api_version, "kind": kind, "name": owner, "uid": "u", "controller": true})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": FLUX, "kind": "ExternalArtifact",
        "metadata": {"name": name, "namespace": "apps", "ownerReferences": refs},
    }))
    .unwrap()
}

/// The cluster every row starts from: a source with one Artifact, a source
/// with two, a mirrored GitRepository and a standalone Artifact.
fn index() -> OwnerIndex {
    let mut index = OwnerIndex::new();
    index.reset(
        [
            artifact("web-latest", Some((HTTP, "HttpSource", "web"))),
            artifact("m1", Some((HTTP, "HttpSource", "multi"))),
            artifact("m2", Some((HTTP, "HttpSource", "multi"))),
            artifact(
                "gitrepository-podinfo",
                Some((FLUX, "GitRepository", "podinfo")),
            ),
            artifact("loose", None),
        ]
        .iter()
        .filter_map(IndexedArtifact::from_artifact),
    );
    index
}

/// The routed result in words: the index change, and the sorted wakes.
fn describe(routed: &Routed) -> (String, Vec<String>) {
    let keys = |entries: &[IndexedArtifact]| {
        let keys: Vec<String> = entries.iter().map(|e| e.key.to_string()).collect();
        keys.join(",")
    };
    let index = match &routed.index {
        None => "-".to_string(),
        Some(IndexChange::Apply(entry)) => format!("apply {}", entry.key),
        Some(IndexChange::Delete(key)) => format!("delete {key}"),
        Some(IndexChange::Reset(entries)) => format!("reset {}", keys(entries)),
        Some(IndexChange::Listing) => "listing".to_string(),
        Some(IndexChange::Listed(entry)) => format!("set aside {}", entry.key),
    };
    let wake = routed
        .wake
        .iter()
        .map(|w| match w {
            Wake::Export(key) => format!("export {key}"),
            Wake::Mirror {
                source,
                namespace,
                name,
                echo,
            } => {
                let echo = if echo.is_some() { " (echo?)" } else { "" };
                format!("mirror {source} {namespace}/{name}{echo}")
            }
            Wake::Release {
                kind,
                namespace,
                name,
            } => format!("release {kind} {namespace}/{name}"),
        })
        .collect();
    (index, wake)
}

#[test]
fn routes_every_kind_of_event() {
    let web = artifact("web-latest", Some((HTTP, "HttpSource", "web")));
    let m1 = artifact("m1", Some((HTTP, "HttpSource", "multi")));
    let m3 = artifact("m3", Some((HTTP, "HttpSource", "multi")));
    let git = artifact(
        "gitrepository-podinfo",
        Some((FLUX, "GitRepository", "podinfo")),
    );
    let ea_owned = artifact(
        "externalartifact-foreign",
        Some((FLUX, "ExternalArtifact", "foreign")),
    );
    let lookalike = artifact(
        "gitrepository-x",
        Some(("example.com/v1", "GitRepository", "x")),
    );
    let loose = artifact("loose", None);
    let blocking = artifact("gitrepository-blocked", None);
    let mut no_namespace = artifact("nowhere", None);
    no_namespace.metadata.namespace = None;
    let listed: Vec<Arc<Artifact>> = [&web, &m1, &git, &loose]
        .into_iter()
        .map(|a| Arc::new(a.clone()))
        .collect();

    let siblings = vec![
        Arc::new(m1.clone()),
        Arc::new(artifact("m2", Some((HTTP, "HttpSource", "multi")))),
    ];
    let podinfo = source("GitRepository", "podinfo", false);
    let labelled_git = source("GitRepository", "labelled", true);
    let sources = vec![
        Arc::new(source("GitRepository", "a", false)),
        Arc::new(source("GitRepository", "b", false)),
    ];
    let own_export = source("ExternalArtifact", "httpsource-web", true);
    let foreign_ea = source("ExternalArtifact", "foreign", false);
    let external_artifacts = vec![Arc::new(own_export.clone()), Arc::new(foreign_ea.clone())];

    let export_web = exported("httpsource-web", &[(API_VERSION, KIND, "web-latest")]);
    let export_foreign = exported(
        "x",
        &[
            ("other.example.com/v1", KIND, "a"),
            (API_VERSION, "Bucket", "b"),
        ],
    );
    let export_shared = exported(
        "shared",
        &[(API_VERSION, KIND, "m1"), (API_VERSION, KIND, "m2")],
    );
    let exports = vec![
        Arc::new(export_web.clone()),
        Arc::new(exported("artifact-m1", &[(API_VERSION, KIND, "m1")])),
    ];
    let terminating = {
        let mut shadow = exported("web.httpsource", &[(API_VERSION, KIND, "web-latest")]);
        shadow.types.as_mut().unwrap().kind = "OCIRepository".into();
        shadow.metadata.labels = Some([(SHADOW_LABEL.to_string(), "true".to_string())].into());
        shadow.metadata.finalizers = Some(vec!["finalizers.fluxcd.io".into()]);
        shadow.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
        );
        shadow
    };
    let terminating_listed = vec![Arc::new(terminating.clone())];

    use Change::{Applied, Deleted, Listed, Listing, Relisted};
    // (what happens, the event, the index change, the wakes, sorted)
    #[rustfmt::skip]
    let rows: Vec<(&str, Event<'_>, &str, &str)> = vec![
        // Artifacts of custom sources: the export controller.
        ("custom Artifact, the only one of its source", Event::Artifact(Applied(&web)), "apply apps/web-latest", "export apps/web-latest"),
        ("custom Artifact with a sibling, still its source's default: the sibling keeps its export name", Event::Artifact(Applied(&m1)), "apply apps/m1", "export apps/m1"),
        ("a third Artifact of a source: only the default's export name could move", Event::Artifact(Applied(&m3)), "apply apps/m3", "export apps/m1, export apps/m3"),
        // A deleted Artifact's own wake finds it gone: its series go at
        // once, exported or not.
        ("custom Artifact deleted: its export goes with it, the sibling is renamed", Event::Artifact(Deleted(&m1)), "delete apps/m1", "export apps/m1, export apps/m2"),
        ("custom Artifact deleted, no sibling", Event::Artifact(Deleted(&web)), "delete apps/web-latest", "export apps/web-latest"),
        ("standalone Artifact", Event::Artifact(Applied(&loose)), "apply apps/loose", "export apps/loose"),
        ("standalone Artifact deleted", Event::Artifact(Deleted(&loose)), "delete apps/loose", "export apps/loose"),
        // An Artifact of someone else's under a mirror's name stood in the
        // mirror's way: once it goes, the mirror may write its own.
        ("an Artifact under a mirror's name deleted", Event::Artifact(Deleted(&blocking)), "delete apps/gitrepository-blocked", "export apps/gitrepository-blocked, mirror GitRepository apps/blocked"),
        ("a stock kind's name in another API group is a custom source", Event::Artifact(Applied(&lookalike)), "apply apps/gitrepository-x", "export apps/gitrepository-x"),
        // Artifacts of stock sources: the mirror that keeps them.
        ("mirrored Artifact changed: by someone else, or the echo of the mirror's write", Event::Artifact(Applied(&git)), "apply apps/gitrepository-podinfo", "mirror GitRepository apps/podinfo (echo?)"),
        ("mirrored Artifact deleted: the mirror writes it again", Event::Artifact(Deleted(&git)), "delete apps/gitrepository-podinfo", "export apps/gitrepository-podinfo, mirror GitRepository apps/podinfo"),
        ("Artifact of a foreign ExternalArtifact", Event::Artifact(Applied(&ea_owned)), "apply apps/externalartifact-foreign", "mirror ExternalArtifact apps/foreign (echo?)"),
        ("an Artifact without namespace is not indexed", Event::Artifact(Applied(&no_namespace)), "-", ""),
        // The Artifact watch (re)started: the index is replaced.
        ("relist after a restart", Event::Artifact(Relisted(&listed)), "reset apps/web-latest,apps/m1,apps/gitrepository-podinfo,apps/loose", "export apps/loose, export apps/m1, export apps/web-latest, mirror GitRepository apps/podinfo"),
        ("relist of both Artifacts of a source", Event::Artifact(Relisted(&siblings)), "reset apps/m1,apps/m2", "export apps/m1, export apps/m2"),
        ("relist of nothing", Event::Artifact(Relisted(&[])), "reset ", ""),
        // Artifacts the watch does not keep arrive one by one while it
        // lists; they wake nobody until the list ends.
        ("a list begins", Event::Artifact(Listing), "listing", ""),
        ("a mirrored Artifact listed", Event::Artifact(Listed(&git)), "set aside apps/gitrepository-podinfo", ""),
        ("a listed Artifact without namespace", Event::Artifact(Listed(&no_namespace)), "-", ""),
        // Stock sources: their mirror.
        ("stock source changed", Event::Source(GIT, Applied(&podinfo)), "-", "mirror GitRepository apps/podinfo"),
        ("stock source deleted: garbage collection takes its Artifact", Event::Source(GIT, Deleted(&podinfo)), "-", ""),
        ("stock sources listed", Event::Source(GIT, Relisted(&sources)), "-", "mirror GitRepository apps/a, mirror GitRepository apps/b"),
        ("a stock source listed alone wakes at once", Event::Source(GIT, Listed(&podinfo)), "-", "mirror GitRepository apps/podinfo"),
        ("a list of stock sources begins", Event::Source(GIT, Listing), "-", ""),
        ("the managed-by label alone does not stop mirroring", Event::Source(GIT, Applied(&labelled_git)), "-", "mirror GitRepository apps/labelled"),
        ("own exports are never mirrored", Event::Source(EA, Applied(&own_export)), "-", ""),
        ("foreign ExternalArtifacts are", Event::Source(EA, Applied(&foreign_ea)), "-", "mirror ExternalArtifact apps/foreign"),
        ("own exports are left out of a relist too", Event::Source(EA, Relisted(&external_artifacts)), "-", "mirror ExternalArtifact apps/foreign"),
        // Exported objects: the export controller, for their Artifact.
        ("exported object changed (drift)", Event::Exported(Applied(&export_web)), "-", "export apps/web-latest"),
        ("exported object deleted", Event::Exported(Deleted(&export_web)), "-", "export apps/web-latest"),
        ("owners that are not Artifacts of openflux.dev", Event::Exported(Applied(&export_foreign)), "-", ""),
        ("an object two Artifacts own wakes both", Event::Exported(Applied(&export_shared)), "-", "export apps/m1, export apps/m2"),
        ("exported objects listed", Event::Exported(Relisted(&exports)), "-", "export apps/m1, export apps/web-latest"),
        ("an exported object listed alone", Event::Exported(Listed(&terminating)), "-", "export apps/web-latest, release OCIRepository apps/web.httpsource"),
        // A shadow being deleted is released from source-controller's
        // finalizer, whether its deletion is seen as a change or in a list.
        ("a shadow being deleted", Event::Exported(Applied(&terminating)), "-", "export apps/web-latest, release OCIRepository apps/web.httpsource"),
        ("a shadow being deleted, listed", Event::Exported(Relisted(&terminating_listed)), "-", "export apps/web-latest, release OCIRepository apps/web.httpsource"),
    ];
    assert!(rows.len() >= 25, "{} rows", rows.len());
    let index = index();
    for (name, event, want_index, want_wake) in rows {
        let (index_change, wake) = describe(&route(&event, &index));
        assert_eq!(index_change, want_index, "{name}: index change");
        assert_eq!(wake.join(", "), want_wake, "{name}: wakes");
    }
}

#[test]
fn routing_applied_changes_keeps_the_index_in_step() {
    let mut index = index();
    let m3 = artifact("m3", Some((HTTP, "HttpSource", "multi")));
    let routed = route(&Event::Artifact(Change::Applied(&m3)), &index);
    index.change(routed.index.unwrap());
    assert_eq!(index.len(), 6);
    // m3 goes, m1 stays its source's default: m2 keeps its export name.
    let routed = route(&Event::Artifact(Change::Deleted(&m3)), &index);
    assert_eq!(describe(&routed).1, ["export apps/m1", "export apps/m3"]);
    index.change(routed.index.unwrap());
    assert_eq!(index.len(), 5);
    assert!(index.artifact("apps", "m3").is_none());
    let routed = route(&Event::Artifact(Change::Relisted(&[])), &index);
    index.change(routed.index.unwrap());
    assert!(index.is_empty() && index.is_synced());
}

#[test]
fn a_list_in_parts_replaces_the_index_only_when_it_ends() {
    let mut index = index();
    let take = |index: &mut OwnerIndex, change: Change<'_, Artifact>| {
        let routed = route(&Event::Artifact(change), index);
        if let Some(change) = routed.index.clone() {
            index.change(change);
        }
        describe(&routed).1
    };
    let git = artifact(
        "gitrepository-podinfo",
        Some((FLUX, "GitRepository", "podinfo")),
    );
    let other = artifact(
        "gitrepository-other",
        Some((FLUX, "GitRepository", "other")),
    );
    let web = artifact("web-latest", Some((HTTP, "HttpSource", "web")));

    // A list that broke off: what it set aside is dropped by the next.
    take(&mut index, Change::Listing);
    take(&mut index, Change::Listed(&other));
    take(&mut index, Change::Listing);
    assert_eq!(index.listed().len(), 0);

    take(&mut index, Change::Listed(&git));
    // Readers still see the whole index as it was, not the list so far.
    assert_eq!(index.len(), 5);
    assert!(index.artifact("apps", "m1").is_some());
    let wakes = take(&mut index, Change::Relisted(&[Arc::new(web)]));
    assert_eq!(
        wakes,
        [
            "export apps/web-latest",
            "mirror GitRepository apps/podinfo"
        ],
        "the list's end wakes for the kept and the set-aside Artifacts alike"
    );
    let mut names: Vec<String> = [
        "web-latest",
        "gitrepository-podinfo",
        "gitrepository-other",
        "m1",
    ]
    .into_iter()
    .filter(|n| index.artifact("apps", n).is_some())
    .map(String::from)
    .collect();
    names.sort();
    assert_eq!(names, ["gitrepository-podinfo", "web-latest"]);
    assert_eq!(index.len(), 2);
    assert!(index.listed().len() == 0 && index.is_synced());
}

#[test]
fn the_first_list_wakes_no_mirror_and_a_later_one_does() {
    let mut index = OwnerIndex::new();
    let git = artifact(
        "gitrepository-podinfo",
        Some((FLUX, "GitRepository", "podinfo")),
    );
    let web = Arc::new(artifact("web-latest", Some((HTTP, "HttpSource", "web"))));
    let list = |index: &mut OwnerIndex| {
        let mut wakes = Vec::new();
        for change in [
            Change::Listing,
            Change::Listed(&git),
            Change::Relisted(std::slice::from_ref(&web)),
        ] {
            let routed = route(&Event::Artifact(change), index);
            wakes.extend(describe(&routed).1);
            if let Some(change) = routed.index {
                index.change(change);
            }
        }
        wakes
    };
    assert_eq!(
        list(&mut index),
        ["export apps/web-latest"],
        "the mirrors look at their sources when they list them"
    );
    assert!(index.artifact("apps", "gitrepository-podinfo").is_some());
    assert_eq!(
        list(&mut index),
        [
            "export apps/web-latest",
            "mirror GitRepository apps/podinfo"
        ],
        "a relist while running: a mirrored Artifact may have changed unseen"
    );
}

#[test]
fn only_a_change_of_a_mirrored_artifact_may_be_an_echo() {
    let mirrored = artifact(
        "gitrepository-podinfo",
        Some((FLUX, "GitRepository", "podinfo")),
    );
    let echo = |event: Event<'_>| -> Vec<Option<Echo>> {
        route(&event, &index())
            .wake
            .into_iter()
            .filter_map(|w| match w {
                Wake::Mirror { echo, .. } => Some(echo),
                _ => None,
            })
            .collect()
    };
    let seen = Echo {
        artifact: "gitrepository-podinfo".into(),
        fingerprint: crate::mirror::fingerprint(&mirrored),
    };
    assert_eq!(
        echo(Event::Artifact(Change::Applied(&mirrored))),
        [Some(seen)]
    );
    // Gone, or listed again: the mirror must look.
    assert_eq!(echo(Event::Artifact(Change::Deleted(&mirrored))), [None]);
    let listed = [Arc::new(mirrored.clone())];
    assert_eq!(echo(Event::Artifact(Change::Relisted(&listed))), [None]);
    // A change of the source itself is never an echo.
    let git = source("GitRepository", "podinfo", false);
    assert_eq!(echo(Event::Source(GIT, Change::Applied(&git))), [None]);
}

/// Whatever one Artifact of a source with many does (arrives, is labelled
/// the default or not, gets another creation time, is refused by the trust
/// check, goes), every Artifact whose export name moves is woken, and of
/// its siblings at most two are: a change costs the same however many
/// Artifacts the source has.
#[test]
fn a_change_wakes_every_artifact_whose_export_name_moves_and_at_most_two_siblings() {
    use std::collections::BTreeMap;
    let make = |name: &str, x: u64| -> Artifact {
        let mut a = artifact(name, Some((HTTP, "HttpSource", "many")));
        if x.is_multiple_of(7) {
            a.metadata.labels = Some([(DEFAULT_ARTIFACT_LABEL.to_string(), "true".into())].into());
        }
        a.metadata.creation_timestamp = match (x >> 8) % 4 {
            0 => None,
            n => Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                format!("2026-01-0{n}T00:00:00Z").parse().unwrap(),
            )),
        };
        if x.is_multiple_of(11) {
            a.status = Some(
                serde_json::from_value(json!({"conditions": [{
                    "type": "Ready", "status": "False", "reason": crate::api::reason::UNTRUSTED,
                    "message": "refused", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
                .unwrap(),
            );
        }
        a
    };
    let export_names = |index: &OwnerIndex, present: &BTreeMap<String, Artifact>| {
        present
            .keys()
            .filter_map(|n| index.artifact("apps", n))
            .map(|a| (a.key.name.to_string(), index.export_name(a)))
            .collect::<BTreeMap<String, String>>()
    };
    let mut index = OwnerIndex::new();
    let mut present: BTreeMap<String, Artifact> = BTreeMap::new();
    let mut x: u64 = 11;
    let mut most = 0;
    for _ in 0..1000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let name = format!("a{:03}", (x >> 33) % 80);
        let gone = present.contains_key(&name) && (x >> 20).is_multiple_of(5);
        let changed = make(&name, x >> 40);
        let event = match gone {
            true => Change::Deleted(&present[&name]),
            false => Change::Applied(&changed),
        };
        let routed = route(&Event::Artifact(event), &index);
        let before = export_names(&index, &present);
        index.change(routed.index.clone().expect("an index change"));
        match gone {
            true => present.remove(&name),
            false => present.insert(name.clone(), changed.clone()),
        };
        let after = export_names(&index, &present);
        let woken: Vec<String> = routed
            .wake
            .iter()
            .filter_map(Wake::export_key)
            .map(|key| key.name.to_string())
            .collect();
        for (artifact, name_now) in &after {
            if before.get(artifact).is_some_and(|was| was != name_now) {
                assert!(
                    woken.contains(artifact),
                    "{artifact}'s export name moved from {} to {name_now} when {name} changed, unwoken: {woken:?}",
                    before[artifact]
                );
            }
        }
        let siblings = woken.iter().filter(|w| **w != name).count();
        assert!(siblings <= 2, "{name} changed, {siblings} siblings woken");
        most = most.max(present.len());
    }
    assert!(most >= 60, "the source had at most {most} Artifacts");
}
