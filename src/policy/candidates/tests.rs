use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;
use crate::api::{Artifact, ArtifactSpec};
use crate::index::IndexedArtifact;

fn facts() -> Facts {
    let mut facts = Facts {
        synced: true,
        ..Facts::default()
    };
    for (kind, group) in [
        ("HttpSource", "source.openflux.dev"),
        ("Widget", "zz.example.test"),
        ("Thing", "example.test"),
        ("Artifact", "openflux.dev"),
    ] {
        facts
            .kinds
            .entry(kind.to_string())
            .or_default()
            .insert(group.to_string());
    }
    facts
}

fn index() -> OwnerIndex {
    let mut a = Artifact::new(
        "w1",
        ArtifactSpec {
            url: "http://storage/a.tar.gz".into(),
            revision: "r1".into(),
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("team-b".into());
    a.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "zz.example.test/v1".into(),
        kind: "Widget".into(),
        name: "w".into(),
        uid: "uid-w".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let mut loose = a.clone();
    loose.metadata.name = Some("loose".into());
    loose.metadata.owner_references = None;
    let mut long = a.clone();
    long.metadata.name = Some("long".into());
    if let Some(owners) = long.metadata.owner_references.as_mut() {
        owners[0].name = LONG.repeat(250);
        owners[0].uid = "uid-long".into();
    }
    // A source of a kind the cluster does not serve (now).
    let mut gizmo = a.clone();
    gizmo.metadata.name = Some("g1".into());
    if let Some(owners) = gizmo.metadata.owner_references.as_mut() {
        owners[0].api_version = "e2e.example/v1".into();
        owners[0].kind = "Gizmo".into();
        owners[0].name = "gz".into();
        owners[0].uid = "uid-gz".into();
    }
    let mut idx = OwnerIndex::new();
    idx.reset(
        [a, loose, long, gizmo]
            .iter()
            .filter_map(IndexedArtifact::from_artifact),
    );
    idx
}

/// The letter a long source name is made of.
const LONG: &str = "n";

fn kinds(list: &[(&str, &str)]) -> Reading {
    Reading::Export(list.iter().map(|(g, k)| SourceKind::new(*g, *k)).collect())
}

#[test]
fn references_are_read_as_the_sources_their_names_may_stand_for() {
    let flux = Some("source.toolkit.fluxcd.io/v1");
    let long = "a".repeat(MAX_NAME);
    use crate::names::identity::{
        artifact_export_name, dotted_source_export_name, source_export_name,
    };
    let cut = source_export_name("zz.example.test", "Widget", &LONG.repeat(250));
    assert_eq!(cut.len(), MAX_NAME);
    let dotted_cut = dotted_source_export_name("zz.example.test", "Widget", &LONG.repeat(250));
    assert_eq!(dotted_cut.len(), MAX_NAME);
    let http = source_export_name("source.openflux.dev", "HttpSource", "my.web");
    let (w1, loose, nope) = (
        artifact_export_name("w1"),
        artifact_export_name("loose"),
        artifact_export_name("nope"),
    );
    let gizmo = source_export_name("e2e.example", "Gizmo", "gz");
    let unknown = source_export_name("e2e.example", "Gizmo", "other");
    let cases: Vec<(&str, Option<&str>, &str, &str, Reading)> = vec![
        (
            "a stock OCIRepository",
            flux,
            "OCIRepository",
            "podinfo",
            Reading::NotAnExport,
        ),
        (
            "two dots are no export",
            flux,
            "OCIRepository",
            "app.v1.example",
            Reading::NotAnExport,
        ),
        (
            "not an export kind",
            flux,
            "GitRepository",
            "web.httpsource.source.openflux.dev",
            Reading::NotAnExport,
        ),
        (
            "a custom kind is not an export",
            Some("source.openflux.dev/v1"),
            "ExternalArtifact",
            "web.httpsource.source.openflux.dev",
            Reading::NotAnExport,
        ),
        (
            "an HttpSource export",
            flux,
            "ExternalArtifact",
            "web.httpsource.source.openflux.dev",
            kinds(&[("source.openflux.dev", "HttpSource")]),
        ),
        (
            "a shadow, apiVersion left out",
            None,
            "OCIRepository",
            "web.httpsource.source.openflux.dev",
            kinds(&[("source.openflux.dev", "HttpSource")]),
        ),
        (
            "a dotted source name",
            flux,
            "ExternalArtifact",
            "my.web.httpsource.source.openflux.dev",
            kinds(&[("source.openflux.dev", "HttpSource")]),
        ),
        (
            "two served readings both count",
            flux,
            "ExternalArtifact",
            "x.widget.zz.example.test",
            kinds(&[("zz.example.test", "Widget")]),
        ),
        (
            "a name that reads as two served kinds",
            flux,
            "ExternalArtifact",
            "x.thing.zz.thing.example.test",
            kinds(&[("example.test", "Thing")]),
        ),
        (
            "no served kind: every reading",
            flux,
            "ExternalArtifact",
            "x.gizmo.new.example.test",
            kinds(&[("example.test", "new"), ("new.example.test", "gizmo")]),
        ),
        (
            "an Artifact's export stands for its owner",
            flux,
            "ExternalArtifact",
            "w1.artifact.openflux.dev",
            kinds(&[("zz.example.test", "Widget")]),
        ),
        (
            "an ownerless Artifact's export",
            flux,
            "ExternalArtifact",
            "loose.artifact.openflux.dev",
            kinds(&[("openflux.dev", "Artifact")]),
        ),
        (
            "an unknown Artifact's export",
            flux,
            "ExternalArtifact",
            "nope.artifact.openflux.dev",
            kinds(&[("openflux.dev", "Artifact")]),
        ),
        (
            "a name cut to the limit, no source known",
            flux,
            "ExternalArtifact",
            &long,
            kinds(&[]),
        ),
        (
            "a name cut to the limit, its source known",
            flux,
            "ExternalArtifact",
            &cut,
            kinds(&[("zz.example.test", "Widget")]),
        ),
        (
            "a dotted name cut to the limit, its source known",
            flux,
            "ExternalArtifact",
            &dotted_cut,
            kinds(&[("zz.example.test", "Widget")]),
        ),
        (
            "an HttpSource export, as openflux names it now",
            flux,
            "ExternalArtifact",
            &http,
            kinds(&[("source.openflux.dev", "HttpSource")]),
        ),
        (
            "a shadow named so",
            None,
            "OCIRepository",
            &http,
            kinds(&[("source.openflux.dev", "HttpSource")]),
        ),
        (
            "named so, not an export kind",
            flux,
            "GitRepository",
            &http,
            Reading::NotAnExport,
        ),
        (
            "an Artifact's export named so stands for its owner",
            flux,
            "ExternalArtifact",
            &w1,
            kinds(&[("zz.example.test", "Widget")]),
        ),
        (
            "an ownerless Artifact's export named so",
            flux,
            "ExternalArtifact",
            &loose,
            kinds(&[("openflux.dev", "Artifact")]),
        ),
        (
            "an unknown Artifact's export named so",
            flux,
            "ExternalArtifact",
            &nope,
            kinds(&[("openflux.dev", "Artifact")]),
        ),
        (
            "a kind not served, its source known",
            flux,
            "ExternalArtifact",
            &gizmo,
            kinds(&[("e2e.example", "Gizmo")]),
        ),
        (
            "a kind not served, no source known",
            flux,
            "ExternalArtifact",
            &unknown,
            kinds(&[]),
        ),
    ];
    let (index, facts) = (index(), facts());
    for (what, api_version, kind, name, want) in cases {
        assert_eq!(
            read(api_version, kind, name, "team-b", &index, &facts),
            want,
            "{what}"
        );
    }
}

#[test]
fn the_shape_test_matches_every_name_openflux_gives_a_source() {
    let mut sources = vec![
        (
            "source.openflux.dev".to_string(),
            "HttpSource",
            "web".to_string(),
        ),
        ("a.b".to_string(), "K", "x".to_string()),
    ];
    // Every length a name may have, against groups and kinds of several
    // lengths, so that a cut lands on each part of the name and on its dots
    // and dashes.
    for len in 1..=253 {
        for (group, kind) in [
            ("zz.example.test", "Widget"),
            ("e2e.example", "Gizmo"),
            ("a-b.c-d.io", "X"),
        ] {
            let name = match len % 3 {
                0 => "n".repeat(len),
                1 => format!("{}-n", "m".repeat(len.saturating_sub(2))),
                _ => format!("{}.n", "p".repeat(len.saturating_sub(2))),
            };
            sources.push((
                group.to_string(),
                kind,
                name.trim_start_matches(['-', '.']).to_string(),
            ));
        }
    }
    for (group, kind, name) in &sources {
        let export = crate::names::identity::source_export_name(group, kind, name);
        assert!(has_export_shape(&export), "{export} ({})", export.len());
        let export = crate::names::identity::artifact_export_name(name);
        assert!(has_export_shape(&export), "{export} ({})", export.len());
    }
    assert!(!has_export_shape("podinfo"));
    assert!(!has_export_shape("podinfo.v1.example"));
}
