//! The mirror controller: one Artifact for every stock Flux source that has
//! an artifact in its status.
//!
//! The Artifact is named after the source's kind and name, controlled by the
//! source (so garbage collection removes it with the source), and written by
//! server-side apply only when it differs from what the source says.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, Patch, Preconditions};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{reflector, watcher, Controller, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

use crate::api::{
    conditions, reason, Artifact, ArtifactSpec, ArtifactStatus, StockSource, FLUX_SOURCE_GROUP,
    MANAGED_BY, MANAGED_BY_LABEL, SOURCE_KIND_LABEL, SOURCE_NAME_LABEL,
};
use crate::controller::{apply_params, hash_of, Context, Error};
use crate::naming;

/// Finds the first version of `kind` the API server serves.
pub async fn discover(client: &Client, kind: &StockSource) -> Option<ApiResource> {
    for version in kind.versions {
        let gv = format!("{FLUX_SOURCE_GROUP}/{version}");
        let Ok(list) = client.list_api_group_resources(&gv).await else {
            continue;
        };
        if list
            .resources
            .iter()
            .any(|r| r.kind == kind.kind && r.name == kind.plural)
        {
            let gvk = GroupVersionKind::gvk(FLUX_SOURCE_GROUP, version, kind.kind);
            return Some(ApiResource::from_gvk_with_plural(&gvk, kind.plural));
        }
    }
    None
}

/// What the mirror should do for one source.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Nothing: the source is openflux's own export.
    Skip,
    /// The source has no artifact: its Artifact, if any, goes.
    Remove { name: String },
    /// The source's artifact, as an Artifact.
    Mirror(Box<Artifact>),
}

/// Why a source's artifact cannot be mirrored.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{kind} {namespace}/{name}: status.artifact is malformed: {detail}")]
pub struct InvalidSource {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub detail: String,
}

/// The Artifact a stock source implies. Pure: decides from the object alone.
pub fn plan(
    stock: &StockSource,
    api_version: &str,
    source: &DynamicObject,
) -> Result<Plan, InvalidSource> {
    let kind = stock.kind;
    let name = source.name_any();
    let namespace = source.namespace().unwrap_or_default();
    if is_own_export(stock, source) {
        return Ok(Plan::Skip);
    }
    let artifact_name = naming::mirror_artifact_name(stock, &name);
    let Some(raw) = source.data.get("status").and_then(|s| s.get("artifact")) else {
        return Ok(Plan::Remove {
            name: artifact_name,
        });
    };
    if raw.is_null() {
        return Ok(Plan::Remove {
            name: artifact_name,
        });
    }
    let spec: ArtifactSpec = serde_json::from_value(raw.clone()).map_err(|e| InvalidSource {
        kind: kind.to_string(),
        namespace: namespace.clone(),
        name: name.clone(),
        detail: e.to_string(),
    })?;
    let owner = OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.clone(),
        uid: source.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let artifact = Artifact {
        metadata: ObjectMeta {
            name: Some(artifact_name),
            namespace: Some(namespace),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                (
                    SOURCE_KIND_LABEL.to_string(),
                    naming::label_value(&kind.to_ascii_lowercase()),
                ),
                (SOURCE_NAME_LABEL.to_string(), naming::label_value(&name)),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    };
    Ok(Plan::Mirror(Box::new(artifact)))
}

/// Whether `source` is an object openflux exported itself: mirroring it
/// would loop.
pub fn is_own_export(stock: &StockSource, source: &DynamicObject) -> bool {
    *stock == StockSource::EXTERNAL_ARTIFACT
        && source.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
}

/// Drops what the mirror never reads from a cached source object.
pub fn slim(source: &mut DynamicObject) {
    source.metadata.managed_fields = None;
    source.metadata.annotations = None;
    let artifact = source.data.pointer("/status/artifact").cloned();
    source.data = match artifact {
        Some(a) => serde_json::json!({ "status": { "artifact": a } }),
        None => serde_json::json!({}),
    };
}

/// Whether `current` already says everything `desired` says.
pub fn up_to_date(current: &Artifact, desired: &Artifact) -> bool {
    if current.spec != desired.spec {
        return false;
    }
    let labels = current.labels();
    let labels_ok = desired
        .labels()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    let owners = current
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let owner_ok = desired.metadata.owner_references.iter().flatten().all(|d| {
        owners
            .iter()
            .any(|o| o.uid == d.uid && o.controller == Some(true))
    });
    labels_ok && owner_ok
}

/// The status openflux keeps on a mirrored Artifact. It does not depend on
/// the revision, so a new revision costs a single write (the spec).
pub fn mirrored_status(current: &Artifact, kind: &str, source: &str) -> ArtifactStatus {
    let source = format!("{kind}/{source}");
    ArtifactStatus {
        observed_generation: None,
        exported_ref: None,
        conditions: vec![conditions::ready(
            true,
            reason::MIRRORED,
            &format!("mirrored from {source}"),
            None,
            current.ready_condition(),
            &conditions::now(),
        )],
        source: Some(source),
    }
}

/// One mirror controller for one source kind.
pub struct Mirror {
    pub source: &'static StockSource,
    pub resource: ApiResource,
}

impl Mirror {
    /// Runs until `shutdown`. `triggers` asks for a source to be reconciled
    /// again (its Artifact changed or went away). `synced` fires once the
    /// source watch listed everything.
    pub async fn run(
        self,
        ctx: Arc<Context>,
        sources: Api<DynamicObject>,
        triggers: impl futures::Stream<Item = ObjectRef<DynamicObject>> + Send + 'static,
        concurrency: u16,
        mut synced: crate::telemetry::SyncGuard,
        shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    ) {
        let stock = self.source;
        let kind = stock.kind;
        let ar = Arc::new(self.resource.clone());
        // The mirror needs a source's identity and status.artifact only;
        // keeping nothing else keeps memory flat with thousands of sources.
        let writer = reflector::store::Writer::<DynamicObject>::new(self.resource.clone());
        let reader = writer.as_reader();
        // Readiness follows the watch itself: the store's wait_until_ready
        // wakes only one waiter, and the controller is already one.
        let stream = watcher(sources, watcher::Config::default().any_semantic())
            .default_backoff()
            .inspect(move |event| {
                if let Ok(watcher::Event::InitDone) = event {
                    tracing::debug!(kind, "source watch synced");
                    synced.synced();
                }
            })
            .modify(slim)
            .reflect(writer)
            .applied_objects();
        let controller = Controller::for_stream_with(stream, reader, self.resource)
            .with_config(ControllerConfig::default().concurrency(concurrency))
            .reconcile_on(triggers)
            .graceful_shutdown_on(shutdown);
        controller
            .run(
                move |source, ctx| reconcile(source, ctx, stock, ar.clone()),
                move |source, error, _ctx| {
                    tracing::warn!(kind, name = %source.name_any(), namespace = source.namespace().unwrap_or_default(), %error, "mirror reconcile failed");
                    Action::requeue(Duration::from_secs(5))
                },
                ctx,
            )
            .for_each(|_| futures::future::ready(()))
            .await;
        tracing::info!(kind, "mirror controller stopped");
    }
}

#[tracing::instrument(skip_all, fields(kind = stock.kind, namespace = source.namespace().unwrap_or_default(), name = %source.name_any()))]
async fn reconcile(
    source: Arc<DynamicObject>,
    ctx: Arc<Context>,
    stock: &'static StockSource,
    ar: Arc<ApiResource>,
) -> Result<Action, Error> {
    let measure = ctx.metrics.reconcile("mirror");
    measure.outcome(reconcile_inner(&source, &ctx, stock, &ar).await)
}

async fn reconcile_inner(
    source: &DynamicObject,
    ctx: &Context,
    stock: &'static StockSource,
    ar: &ApiResource,
) -> Result<Action, Error> {
    let kind = stock.kind;
    let namespace = source.namespace().ok_or(Error::MissingField("namespace"))?;
    let plan = match plan(stock, &ar.api_version, source) {
        Ok(p) => p,
        Err(invalid) => {
            // Not retried: the source must change first.
            tracing::warn!(error = %invalid, "not mirroring");
            return Ok(Action::await_change());
        }
    };
    let api = ctx.artifact_api(&namespace);
    match plan {
        Plan::Skip => Ok(Action::await_change()),
        Plan::Remove { name } => {
            let current = ctx.artifacts.get(&ObjectRef::new(&name).within(&namespace));
            let source_uid = source.uid();
            if let Some(current) = current {
                let ours = current
                    .controller_owner()
                    .is_some_and(|o| Some(&o.uid) == source_uid.as_ref());
                if ours {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: current.uid(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match api.delete(&name, &dp).await {
                        Ok(_) => {
                            tracing::info!(artifact = %name, "source has no artifact any more; deleted its Artifact")
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                        Err(e) => return Err(e.into()),
                    }
                    ctx.memo.forget(&format!("artifact/{namespace}/{name}"));
                }
            }
            Ok(Action::await_change())
        }
        Plan::Mirror(desired) => {
            let name = desired.name_any();
            let current = ctx.artifacts.get(&ObjectRef::new(&name).within(&namespace));
            let key = format!("artifact/{namespace}/{name}");
            let hash = hash_of(&*desired)?;
            let rv = current.as_ref().and_then(|c| c.resource_version());
            let written = match &current {
                Some(c) if up_to_date(c, &desired) => None,
                _ if ctx.memo.already_written(&key, rv.as_deref(), hash) => None,
                _ => {
                    let applied = api
                        .patch(&name, &apply_params(), &Patch::Apply(&*desired))
                        .await?;
                    ctx.memo.record(key, rv, hash);
                    ctx.metrics
                        .mirrored
                        .get_or_create(&crate::telemetry::KindLabels {
                            kind: kind.to_string(),
                        })
                        .inc();
                    tracing::info!(artifact = %name, revision = %desired.spec.revision, "mirrored artifact");
                    Some(applied)
                }
            };
            let latest = written.as_ref().or(current.as_deref());
            if let Some(latest) = latest {
                let status = mirrored_status(latest, kind, &source.name_any());
                ctx.apply_artifact_status(latest, status).await?;
            }
            Ok(Action::await_change())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source(kind: &str, status: serde_json::Value, labels: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": kind,
            "metadata": {"name": "podinfo", "namespace": "apps", "uid": "u-1", "labels": labels},
            "spec": {},
            "status": status,
        }))
        .unwrap()
    }

    fn flux_artifact() -> serde_json::Value {
        json!({
            "digest": "sha256:aa",
            "lastUpdateTime": "2025-05-06T07:08:09Z",
            "path": "gitrepository/apps/podinfo/abc.tar.gz",
            "revision": "main@sha1:abc",
            "size": 42,
            "url": "http://source-controller.flux-system.svc/gitrepository/apps/podinfo/abc.tar.gz"
        })
    }

    #[test]
    fn mirrors_status_artifact_field_for_field() {
        let s = source(
            "GitRepository",
            json!({"artifact": flux_artifact()}),
            json!({}),
        );
        let Plan::Mirror(a) = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap() else {
            panic!("expected a mirror plan")
        };
        assert_eq!(a.name_any(), "gitrepository-podinfo");
        assert_eq!(a.namespace().as_deref(), Some("apps"));
        assert_eq!(serde_json::to_value(&a.spec).unwrap(), flux_artifact());
        let owner = a.controller_owner().unwrap();
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("GitRepository", "u-1")
        );
        assert_eq!(a.labels().get(SOURCE_KIND_LABEL).unwrap(), "gitrepository");
        assert_eq!(a.labels().get(SOURCE_NAME_LABEL).unwrap(), "podinfo");
    }

    #[test]
    fn no_artifact_means_remove() {
        let s = source("Bucket", json!({"conditions": []}), json!({}));
        assert_eq!(
            plan(&StockSource::BUCKET, "source.toolkit.fluxcd.io/v1", &s).unwrap(),
            Plan::Remove {
                name: "bucket-podinfo".into()
            }
        );
        let s = source("Bucket", json!({"artifact": null}), json!({}));
        assert!(matches!(
            plan(&StockSource::BUCKET, "v", &s).unwrap(),
            Plan::Remove { .. }
        ));
    }

    #[test]
    fn own_exports_are_never_mirrored_but_foreign_ones_are() {
        let ours = source(
            "ExternalArtifact",
            json!({"artifact": flux_artifact()}),
            json!({MANAGED_BY_LABEL: MANAGED_BY}),
        );
        assert_eq!(
            plan(
                &StockSource::EXTERNAL_ARTIFACT,
                "source.toolkit.fluxcd.io/v1",
                &ours
            )
            .unwrap(),
            Plan::Skip
        );
        let foreign = source(
            "ExternalArtifact",
            json!({"artifact": flux_artifact()}),
            json!({}),
        );
        assert!(matches!(
            plan(
                &StockSource::EXTERNAL_ARTIFACT,
                "source.toolkit.fluxcd.io/v1",
                &foreign
            )
            .unwrap(),
            Plan::Mirror(_)
        ));
    }

    #[test]
    fn malformed_artifact_is_an_error_not_a_panic() {
        let s = source("GitRepository", json!({"artifact": {"url": 5}}), json!({}));
        let err = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("GitRepository apps/podinfo"),
            "{err}"
        );
    }

    #[test]
    fn up_to_date_compares_spec_labels_and_owner() {
        let s = source(
            "GitRepository",
            json!({"artifact": flux_artifact()}),
            json!({}),
        );
        let Plan::Mirror(desired) = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap() else {
            panic!()
        };
        let mut current = (*desired).clone();
        current.metadata.resource_version = Some("7".into());
        current
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("extra".into(), "kept".into());
        assert!(up_to_date(&current, &desired));
        current.spec.revision = "main@sha1:def".into();
        assert!(!up_to_date(&current, &desired));
        let mut orphan = (*desired).clone();
        orphan.metadata.owner_references = None;
        assert!(!up_to_date(&orphan, &desired));
    }

    #[test]
    fn slimmed_sources_plan_the_same() {
        let mut s = source(
            "GitRepository",
            json!({"artifact": flux_artifact(), "conditions": []}),
            json!({"a": "b"}),
        );
        let before = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap();
        slim(&mut s);
        assert_eq!(s.data, json!({"status": {"artifact": flux_artifact()}}));
        assert_eq!(
            plan(
                &StockSource::GIT_REPOSITORY,
                "source.toolkit.fluxcd.io/v1",
                &s
            )
            .unwrap(),
            before
        );
        let mut gone = source("GitRepository", json!({}), json!({}));
        slim(&mut gone);
        assert!(matches!(
            plan(&StockSource::GIT_REPOSITORY, "v", &gone).unwrap(),
            Plan::Remove { .. }
        ));
    }

    #[test]
    fn mirrored_status_does_not_depend_on_revision() {
        let s = source(
            "GitRepository",
            json!({"artifact": flux_artifact()}),
            json!({}),
        );
        let Plan::Mirror(mut a) = plan(
            &StockSource::GIT_REPOSITORY,
            "source.toolkit.fluxcd.io/v1",
            &s,
        )
        .unwrap() else {
            panic!()
        };
        let first = mirrored_status(&a, "GitRepository", "podinfo");
        a.status = Some(first.clone());
        a.spec.revision = "main@sha1:other".into();
        a.metadata.generation = Some(2);
        assert_eq!(mirrored_status(&a, "GitRepository", "podinfo"), first);
    }
}
