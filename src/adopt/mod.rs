//! Adopting Open Flux Artifacts: a watch of each Open Flux Artifact API the
//! cluster serves, and a worker that keeps one openflux.dev Artifact per
//! Open Flux Artifact ([`crate::adopt::plan::adopt`]), deleting it when theirs goes. The
//! export controller then exports it like any producer's Artifact. Runs on
//! the leader.

pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::{unbounded, UnboundedSender};
use kube::api::{DeleteParams, Patch};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::adopt::plan::{adopt, adopted_name, up_to_date, OPEN_FLUX_GROUPS, OPEN_FLUX_VERSION};
use crate::cluster::facts::Facts;
use crate::control::looks::{self, Looks};
use crate::control::{apply_params, Context, Error, Reconciler, Requeue};
use crate::telemetry::SyncGuard;
use crate::vocabulary::marks::ADOPTED_FROM_LABEL;
use crate::watch::change::Change;
use crate::watch::run::Watch;
use crate::watch::{keep_all, without_managed_fields, Scope};

/// The Open Flux Artifact API groups the cluster serves.
pub fn served_groups(facts: &Facts) -> Vec<&'static str> {
    OPEN_FLUX_GROUPS
        .into_iter()
        .filter(|g| {
            facts
                .groups_of("Artifact")
                .is_some_and(|groups| groups.contains(*g))
        })
        .collect()
}

/// One Open Flux Artifact to look at: namespace and name.
type Key = (String, String);

/// Runs the adopter of Open Flux Artifacts of `group` until `shutdown`.
pub async fn run(
    ctx: Arc<Context>,
    group: &'static str,
    scope: Scope,
    synced: SyncGuard,
    shutdown: CancellationToken,
) {
    let gvk = GroupVersionKind::gvk(group, OPEN_FLUX_VERSION, "Artifact");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "artifacts");
    let writer = Writer::<DynamicObject>::new(resource.clone());
    let theirs = writer.as_reader();
    let (look, asked) = unbounded::<Key>();
    let watch = Watch {
        api: scope.dynamic_api(&ctx.client, &resource),
        config: scope.config(),
        slim: without_managed_fields,
        keep: keep_all,
        what: format!("Open Flux Artifacts ({group})"),
        hint: "can openflux list and watch this Artifact API? see its ClusterRole",
        turns: ctx.list_turns.clone(),
        rejects: ctx.rejects.clone(),
    };
    let sink_look = look.clone();
    let sink_ctx = ctx.clone();
    // Owned by this task: aborted with it, never left running on their own.
    let mut watching = AbortOnDropHandle::new(tokio::spawn(watch.run(
        Some(writer),
        synced,
        move |change| observe(&sink_ctx, group, change, &sink_look),
        shutdown.clone(),
    )));
    tracing::info!(group, "adopting Open Flux Artifacts");
    let retry = ctx.retry;
    let adopter = Adopter {
        ctx,
        group,
        resource,
        theirs,
    };
    looks::serve(Looks { asked, again: look }, retry, shutdown, &adopter).await;
    let _ = (&mut watching).await;
}

/// Asks for a look at what changed; after a relist also at every adopted
/// Artifact whose Open Flux Artifact may be gone.
fn observe(
    ctx: &Context,
    group: &str,
    change: Change<'_, DynamicObject>,
    look: &UnboundedSender<Key>,
) {
    let key = |o: &DynamicObject| (o.namespace().unwrap_or_default(), o.name_any());
    match change {
        Change::Applied(o) | Change::Deleted(o) | Change::Listed(o) => {
            let _ = look.unbounded_send(key(o));
        }
        Change::Listing => {}
        Change::Relisted(all) => {
            for o in all {
                let _ = look.unbounded_send(key(o));
            }
            let suffix = format!(".artifact.{group}");
            for ours in ctx.artifacts.state() {
                let adopted = ours.labels().get(ADOPTED_FROM_LABEL).map(String::as_str)
                    == Some(&crate::names::label_value(group))
                    && ctx.shard.owns(ours.labels());
                if let (true, Some(name)) = (adopted, ours.name_any().strip_suffix(&suffix)) {
                    let _ =
                        look.unbounded_send((ours.namespace().unwrap_or_default(), name.into()));
                }
            }
        }
    }
}

/// The adopter of one Open Flux Artifact API group: keeps an Artifact for
/// each of theirs its watch holds.
struct Adopter {
    ctx: Arc<Context>,
    group: &'static str,
    resource: ApiResource,
    /// What the watch of their Artifacts holds.
    theirs: Store<DynamicObject>,
}

impl Reconciler for Adopter {
    type Object = Key;

    async fn reconcile(&self, (namespace, name): &Key) -> Result<Requeue, Error> {
        let Self {
            ctx,
            group,
            resource,
            theirs,
        } = self;
        let group: &str = group;
        let ours_name = adopted_name(group, name);
        let ours = ctx
            .artifacts
            .get(&ObjectRef::new(&ours_name).within(namespace));
        let found = theirs.get(&ObjectRef::new_with(name, resource.clone()).within(namespace));
        let Some(found) = found else {
            // Not in this shard's watch: gone, or moved to another shard (whose
            // adopter keeps ours). Only the API server can tell.
            if ours.is_some() && !still_there(ctx, resource, namespace, name).await? {
                match ctx
                    .artifact_api(namespace)
                    .delete(&ours_name, &DeleteParams::default())
                    .await
                {
                    Ok(_) => {
                        tracing::info!(%namespace, artifact = %ours_name, "the Open Flux Artifact is gone; deleted the Artifact standing for it")
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(None);
        };
        let desired = match adopt(group, &found) {
            Ok(d) => d,
            Err(why) => {
                tracing::warn!(group, %namespace, %name, %why, "not adopting an Open Flux Artifact");
                return Ok(None);
            }
        };
        if ours.as_deref().is_some_and(|o| up_to_date(o, &desired)) {
            return Ok(None);
        }
        ctx.artifact_api(namespace)
            .patch(&ours_name, &apply_params(), &Patch::Apply(&desired))
            .await?;
        tracing::info!(group, %namespace, %name, artifact = %ours_name, revision = %desired.spec.revision, "adopted an Open Flux Artifact");
        Ok(None)
    }

    fn failed(&self, (namespace, name): &Key, error: &Error, retry_in: Duration) {
        let group = self.group;
        tracing::warn!(group, %namespace, %name, %error, ?retry_in, "cannot adopt an Open Flux Artifact; retrying");
    }
}

/// Whether the Open Flux Artifact `namespace`/`name` exists, in any shard.
async fn still_there(
    ctx: &Context,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
) -> Result<bool, Error> {
    let api = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), namespace, resource);
    Ok(api.get_metadata_opt(name).await?.is_some())
}
