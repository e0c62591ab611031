//! The writes that keep one exported object: its metadata and spec, its
//! status, and its deletion.

use kube::api::Patch;
use std::collections::BTreeMap;

use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::plan::{desired_status, object_up_to_date, status_up_to_date, ExportPlan};
use crate::cluster::target::Target;
use crate::control::{apply_params, hash_of, Context, Error};

/// One kind Artifacts can be exported as, served by the cluster: the
/// resource, and the objects of that kind openflux exported (labelled as
/// managed by it), as watched.
#[derive(Clone)]
pub struct ServedTarget {
    pub resource: ApiResource,
    pub exports: Store<DynamicObject>,
}

/// The export targets the cluster serves, by target.
pub type ServedTargets = BTreeMap<Target, ServedTarget>;

/// The exported object of one Artifact, and the writes that keep it.
pub struct Export<'a> {
    ctx: &'a Context,
    target: &'a ServedTarget,
    api: Api<DynamicObject>,
    namespace: &'a str,
    name: &'a str,
}

impl<'a> Export<'a> {
    pub(super) fn new(
        ctx: &'a Context,
        target: &'a ServedTarget,
        namespace: &'a str,
        name: &'a str,
    ) -> Self {
        let api = Api::namespaced_with(ctx.client.clone(), namespace, &target.resource);
        Self {
            ctx,
            target,
            api,
            namespace,
            name,
        }
    }

    /// The object as it is now: from the watch of exported objects, or, for
    /// an object openflux did not create (not in that labelled cache), asked.
    pub(super) async fn current(&self) -> Result<Option<DynamicObject>, Error> {
        let key =
            ObjectRef::new_with(self.name, self.target.resource.clone()).within(self.namespace);
        match self.target.exports.get(&key) {
            Some(cached) => Ok(Some((*cached).clone())),
            None => Ok(self.api.get_opt(self.name).await?),
        }
    }

    /// Deletes the object (gone already is fine).
    pub(super) async fn delete(&self) -> Result<(), Error> {
        match self.api.delete(self.name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Applies the object's metadata and spec unless they are already so;
    /// returns the object as it is after that.
    pub(super) async fn write_object(
        &self,
        plan: &ExportPlan,
        current: Option<DynamicObject>,
    ) -> Result<Option<DynamicObject>, Error> {
        let key = format!("export/{}/{}", self.namespace, self.name);
        let rv = current.as_ref().and_then(|c| c.resource_version());
        let hash = hash_of(&plan.object)?;
        let up_to_date = current
            .as_ref()
            .is_some_and(|c| object_up_to_date(c, &plan.object));
        if up_to_date || self.ctx.memo.already_written(&key, rv.as_deref(), hash) {
            return Ok(current);
        }
        let applied = self
            .api
            .patch(self.name, &apply_params(), &Patch::Apply(&plan.object))
            .await?;
        self.ctx.memo.record(key, rv, hash);
        self.ctx.metrics.exported.inc();
        Ok(Some(applied))
    }

    /// Applies the object's status unless it already is so; returns whether
    /// it wrote.
    pub(super) async fn write_status(
        &self,
        plan: &ExportPlan,
        latest: Option<&DynamicObject>,
    ) -> Result<bool, Error> {
        let generation = latest.and_then(|l| l.metadata.generation);
        let desired = desired_status(latest, plan, generation);
        let key = format!("export-status/{}/{}", self.namespace, self.name);
        let rv = latest.and_then(|l| l.resource_version());
        let hash = hash_of(&desired)?;
        let up_to_date = latest.is_some_and(|l| status_up_to_date(l, &desired));
        if up_to_date || self.ctx.memo.already_written(&key, rv.as_deref(), hash) {
            return Ok(false);
        }
        let body = json!({
            "apiVersion": self.target.resource.api_version,
            "kind": self.target.resource.kind,
            "status": desired,
        });
        self.api
            .patch_status(self.name, &apply_params(), &Patch::Apply(&body))
            .await?;
        self.ctx.memo.record(key, rv, hash);
        self.ctx.metrics.exported.inc();
        Ok(true)
    }
}
