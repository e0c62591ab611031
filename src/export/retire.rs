//! Retiring what an Artifact was exported as before.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::core::DynamicObject;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;

use super::write::Export;
use super::{former_export_names, plan, Exporter};
use crate::api::Artifact;
use crate::cluster::target::Target;
use crate::control::Error;
use crate::locks;

impl Exporter {
    /// Objects this Artifact was exported as before, under another name or
    /// target: kept up to date while a consumer still refers to one (until
    /// openflux has moved it), deleted once none does.
    pub(super) async fn retire(
        &self,
        artifact: &Artifact,
        uid: &str,
        namespace: &str,
        name: &str,
        wanted: &BTreeSet<Target>,
    ) -> Result<(), Error> {
        // Looked up by the names it may have had, not by a scan of every
        // export: a resync reconciles every Artifact.
        let names = former_export_names(artifact);
        for (target, served) in &self.targets {
            let old: Vec<Arc<DynamicObject>> = names
                .iter()
                .filter(|n| !(wanted.contains(target) && n.as_str() == name))
                .filter_map(|n| {
                    let key = ObjectRef::new_with(n, served.resource.clone()).within(namespace);
                    served.exports.get(&key)
                })
                .filter(|o| o.owner_references().iter().any(|r| r.uid == uid))
                .collect();
            for object in old {
                let old_name = object.name_any();
                let export = Export::new(&self.ctx, served, namespace, &old_name);
                let kind = served.resource.kind.as_str();
                if self.kept.referrals.refers_to(namespace, kind, &old_name) {
                    let inputs = locks::read(&self.ctx.facts).cluster.exported_inputs;
                    if let Ok(plan) = plan(artifact, &old_name, *target, &served.resource, inputs) {
                        let latest = export.write_object(&plan, Some((*object).clone())).await?;
                        export.write_status(&plan, latest.as_ref()).await?;
                    }
                    continue;
                }
                tracing::info!(kind, name = %old_name, namespace, "deleting an export no consumer refers to any more");
                export.delete().await?;
            }
        }
        Ok(())
    }
}
