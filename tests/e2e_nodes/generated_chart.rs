//! A Helm chart laid out by an unchanged ArtifactGenerator from custom
//! sources, installed by an unchanged HelmRelease whose `chartRef` names the
//! generated ExternalArtifact.
//!
//! helm-controller reads a chartRef of kind ExternalArtifact only with its
//! `ExternalArtifact` feature gate on (`flux install
//! --components-extra=source-watcher` sets it) and loads the artifact as a
//! packaged chart: every file under one top-level directory, `Chart.yaml`
//! in it. An HttpSource publishes one file a URL, so two of them serve the
//! chart's `Chart.yaml` and its template, and the generator copies both
//! into one chart directory. With a digest in the artifact's revision (as
//! source-watcher writes it) helm-controller appends it to the chart's
//! version, so new content alone upgrades the release.

use openflux_testkit as support;
use serde_json::{json, Value};
use support::{field, Env};

use super::helm::HELM;
use super::{GENERATOR, HTTP_SOURCE, ROLLOUT};

/// The chart's name, and the top-level directory of the generated artifact.
const CHART: &str = "hello";
const CHART_YAML: &str = "apiVersion: v2\nname: hello\nversion: 0.1.0\n";

/// The chart's one template: a ConfigMap holding `value`. Quoted, so that it
/// is also a YAML object (what an HttpSource serving one file accepts).
fn template(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: \"{{{{ .Release.Name }}}}-config\"\ndata:\n  value: \"{value}\"\n"
    )
}

/// Two HttpSources (the chart's `Chart.yaml`, its template) named by kind in
/// an ArtifactGenerator that copies them under `hello/`; a HelmRelease with
/// `chartRef: {kind: ExternalArtifact, name: generated-chart}` installs
/// what source-watcher generated. A new template under the HttpSource
/// reaches the release through a new generated revision.
pub(super) async fn custom_sources_feed_a_generated_chart(env: &Env, prefix: &str) {
    let ns = env.namespace(prefix).await;
    let n = ns.name().to_string();
    let serve = |file: &str, contents: &str| {
        env.fixtures()
            .put_file(&format!("{n}/{file}"), contents.as_bytes())
            .unwrap_or_else(|e| panic!("serving {file}: {e:#}"))
    };
    let meta_url = serve("Chart.yaml", CHART_YAML);
    let template_url = serve("configmap.yaml", &template("from the first template"));
    for (name, url) in [("chart-meta", &meta_url), ("chart-template", &template_url)] {
        env.apply(&json!({
            "apiVersion": HTTP_SOURCE, "kind": "HttpSource",
            "metadata": {"name": name, "namespace": n},
            "spec": {"url": url, "interval": "10m"}
        }))
        .await
        .unwrap_or_else(|e| panic!("applying the HttpSource {name}: {e:#}"));
    }
    env.apply(&json!({
        "apiVersion": GENERATOR, "kind": "ArtifactGenerator",
        "metadata": {"name": "chart", "namespace": n},
        "spec": {
            "sources": [
                {"alias": "meta", "kind": "HttpSource", "name": "chart-meta"},
                {"alias": "template", "kind": "HttpSource", "name": "chart-template"}
            ],
            "artifacts": [{"name": "generated-chart", "copy": [
                {"from": "@meta/Chart.yaml", "to": format!("@artifact/{CHART}/")},
                {"from": "@template/configmap.yaml", "to": format!("@artifact/{CHART}/templates/")}
            ]}]
        }
    }))
    .await
    .expect(
        "applying the ArtifactGenerator (through openflux's webhook, then source-watcher's schema)",
    );
    let generator = env
        .find(GENERATOR, "ArtifactGenerator", &n, "chart")
        .await
        .expect("the ArtifactGenerator");
    let entries = field(&generator, "/spec/sources")
        .cloned()
        .unwrap_or_default();
    let export = |name: &str| {
        openflux::names::identity::source_export_name("sources.openflux.dev", "HttpSource", name)
    };
    assert_eq!(
        entries,
        json!([
            {"alias": "meta", "kind": "ExternalArtifact", "name": export("chart-meta")},
            {"alias": "template", "kind": "ExternalArtifact", "name": export("chart-template")}
        ]),
        "each entry points at its HttpSource's export"
    );
    env.apply(&json!({
        "apiVersion": HELM, "kind": "HelmRelease",
        "metadata": {"name": "web", "namespace": n},
        "spec": {
            "interval": "10m",
            "chartRef": {"kind": "ExternalArtifact", "name": "generated-chart"}
        }
    }))
    .await
    .expect("applying the HelmRelease of the generated chart");
    // Installed by helm-controller from the chart source-watcher generated.
    let installed = |value| support::configmap_holds(env, &n, "web-config", value, ROLLOUT);
    installed("from the first template").await;
    let first = released_version(env, &n).await;
    serve("configmap.yaml", &template("from the new template"));
    support::request_reconcile(&env.client, HTTP_SOURCE, "HttpSource", &n, "chart-template")
        .await
        .expect("asking the template's HttpSource to fetch again");
    installed("from the new template").await;
    let upgraded = released_version(env, &n).await;
    assert_ne!(
        first, upgraded,
        "the new generated revision is a new chart version (its digest appended)"
    );
    println!(
        "{n}: a chart generated from two HttpSources installed by a HelmRelease ({first}), new template upgraded it ({upgraded})"
    );
    ns.delete().await;
}

/// The chart version of the HelmRelease's latest release, once it is the
/// one made from the generated artifact's current revision: helm-controller
/// appends the first 12 hex digits of the revision's digest to the version
/// in Chart.yaml.
async fn released_version(env: &Env, n: &str) -> String {
    support::wait_for(
        "the HelmRelease's latest release made from the generated artifact's revision",
        ROLLOUT,
        || async move {
            let artifact = env
                .find(
                    "source.toolkit.fluxcd.io/v1",
                    "ExternalArtifact",
                    n,
                    "generated-chart",
                )
                .await?;
            let revision = field(&artifact, "/status/artifact/revision")?.as_str()?;
            let digest = revision.rsplit_once(':')?.1.get(..12)?;
            let expected = format!("0.1.0+{digest}");
            let release = env.find(HELM, "HelmRelease", n, "web").await?;
            let version =
                field(&release, "/status/history/0/chartVersion").and_then(Value::as_str)?;
            (version == expected).then_some(expected)
        },
    )
    .await
}
