//! Keeps openflux's ValidatingWebhookConfiguration published while this
//! replica leads (`--validating-webhook-service`): created once a ready
//! endpoint of the Service serves `/validate`, written again when deleted or
//! changed ([`configuration`] says why openflux writes it). The CA
//! bundles in it are then kept by [`crate::certs::cabundle`]. Failures are logged,
//! put in an Event on the Service and retried with backoff; they never stop
//! the webhook.
//!
//! It is owned by openflux's ClusterRole ([`OWNER`]), a cluster-scoped
//! object every uninstall removes (`helm uninstall`, a Flux prune, `kubectl
//! delete -f install.yaml`) and none keeps, so the garbage collector deletes
//! the configuration with it: a fail-closed configuration calling a Service
//! that is gone would refuse every update of the consumers openflux
//! rewrote. Not the Artifact CRD, which an uninstall keeps with the users'
//! Artifacts; not a namespaced object, which the garbage collector ignores
//! as the owner of a cluster-scoped one. Without that ClusterRole nothing is
//! written: a configuration owned by nothing would outlive openflux.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Resource;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::api::runtime::retry::Backoff;
use crate::api::runtime::{EventRecorder, FluxEvent};
use crate::watch::retry::retrying;
use configuration::{Target, Write};

pub mod configuration;

const REASON_FAILED: &str = "ValidatingWebhookFailed";
const REASON_PUBLISHED: &str = "ValidatingWebhookPublished";

/// The ClusterRole that owns the configuration: openflux's own, as
/// `manifests/rbac.yaml` names it (which lets openflux `get` it, and only
/// it). The policy `openflux-webhook-configurations`
/// (`webhook-config/registration-policy.yaml`) admits no other owner.
pub const OWNER: &str = "openflux";

/// What to publish, and where the API server reaches it.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The ValidatingWebhookConfiguration's name.
    pub configuration: String,
    /// openflux's namespace, the Service's.
    pub namespace: String,
    pub service: String,
    /// The name of the Service's port that reaches `/validate`.
    pub port_name: String,
}

/// Publishes while this replica leads (every term of `terms`; always when
/// `terms` is None) until `stop` turns true or its sender goes away.
pub async fn keep(
    client: kube::Client,
    registration: Registration,
    events: Option<EventRecorder>,
    bundle: watch::Receiver<Vec<u8>>,
    mut terms: Option<watch::Receiver<Option<CancellationToken>>>,
    mut stop: watch::Receiver<bool>,
) {
    let registrar = Registrar {
        client,
        registration,
        events,
    };
    loop {
        let term = match terms.as_mut() {
            None => Some(CancellationToken::new()),
            Some(terms) => terms.borrow_and_update().clone(),
        };
        if let Some(term) = term.filter(|t| !t.is_cancelled()) {
            tokio::select! {
                () = registrar.lead(bundle.clone()) => return,
                () = term.cancelled() => {}
                _ = stop.changed() => return,
            }
            continue;
        }
        let Some(terms) = terms.as_mut() else { return };
        tokio::select! {
            changed = terms.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}

struct Registrar {
    client: kube::Client,
    registration: Registration,
    events: Option<EventRecorder>,
}

impl Registrar {
    /// Watches the Service's endpoints and the configuration, and writes the
    /// configuration whenever either changes; returns only when a watch
    /// ends (which they do not).
    async fn lead(&self, mut bundle: watch::Receiver<Vec<u8>>) {
        let p = &self.registration;
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &p.namespace);
        let (endpoints, writer) = reflector::store();
        let selector = format!("kubernetes.io/service-name={}", p.service);
        let slice_events =
            retrying(slices, watcher::Config::default().labels(&selector)).reflect(writer);
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let by_name = format!("metadata.name={}", p.configuration);
        let config_events = retrying(configs, watcher::Config::default().fields(&by_name));
        tokio::pin!(slice_events, config_events);
        let mut synced = false;
        let mut dirty = true;
        let mut backoff = Backoff::default();
        let mut retry_at = tokio::time::Instant::now();
        let mut reported: Option<String> = None;
        loop {
            let serving =
                configuration::serving(endpoints.state().iter().map(|s| &**s), &p.port_name);
            let ours = bundle.borrow().clone();
            if dirty
                && synced
                && serving
                && !ours.is_empty()
                && tokio::time::Instant::now() >= retry_at
            {
                match self.write(&ours).await {
                    Ok(wrote) => {
                        if let Some(message) = wrote {
                            tracing::info!(configuration = %p.configuration, "{message}");
                            self.event(FluxEvent::normal(REASON_PUBLISHED, message))
                                .await;
                        }
                        dirty = false;
                        backoff.succeeded();
                        reported = None;
                    }
                    Err(error) => {
                        let message = format!(
                            "cannot publish the ValidatingWebhookConfiguration {}: {error}",
                            p.configuration
                        );
                        let wait = backoff.failed();
                        tracing::warn!(retry_in = ?wait, "{message}");
                        if reported.as_ref() != Some(&message) {
                            self.event(FluxEvent::warning(REASON_FAILED, message.clone()))
                                .await;
                            reported = Some(message);
                        }
                        retry_at = tokio::time::Instant::now() + wait;
                    }
                }
            }
            tokio::select! {
                event = slice_events.next() => match event {
                    Some(Ok(watcher::Event::InitDone)) => {
                        synced = true;
                        dirty = true;
                    }
                    Some(Ok(_)) => dirty = true,
                    Some(Err(error)) => tracing::debug!(%error, service = %p.service, "watching the webhook Service's endpoints"),
                    None => return,
                },
                event = config_events.next() => match event {
                    Some(Ok(_)) => dirty = true,
                    Some(Err(error)) => tracing::debug!(%error, configuration = %p.configuration, "watching the validating webhook configuration"),
                    None => return,
                },
                changed = bundle.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    dirty = true;
                }
                () = tokio::time::sleep_until(retry_at), if dirty && tokio::time::Instant::now() < retry_at => {}
            }
        }
    }

    /// One write if one is needed: what was done, for the log and an Event.
    async fn write(&self, ours: &[u8]) -> anyhow::Result<Option<String>> {
        let p = &self.registration;
        let services: Api<Service> = Api::namespaced(self.client.clone(), &p.namespace);
        let service = services.get(&p.service).await?;
        let port = configuration::service_port(&service, &p.port_name).ok_or_else(|| {
            anyhow::anyhow!(
                "the Service {}/{} has no port named {:?} (--validating-webhook-port)",
                p.namespace,
                p.service,
                p.port_name
            )
        })?;
        let target = Target {
            namespace: p.namespace.clone(),
            service: p.service.clone(),
            port,
        };
        let desired = configuration::desired(&p.configuration, &target, Some(self.owner().await?))?;
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let current = configs.get_opt(&p.configuration).await?;
        let params = PostParams {
            field_manager: Some("openflux".into()),
            ..Default::default()
        };
        Ok(match configuration::plan(current.as_ref(), desired, ours) {
            Write::Keep => None,
            Write::Create(config) => {
                configs.create(&params, &config).await?;
                Some(format!(
                    "created the validating webhook configuration {}: /validate is served by {}/{} port {}",
                    p.configuration, p.namespace, p.service, p.port_name
                ))
            }
            Write::Replace(config) => {
                configs.replace(&p.configuration, &params, &config).await?;
                Some(format!(
                    "wrote the validating webhook configuration {} again as this version of openflux serves it",
                    p.configuration
                ))
            }
        })
    }

    /// The owner reference to openflux's ClusterRole [`OWNER`]; an error
    /// when it is gone (openflux is being uninstalled) or cannot be read.
    async fn owner(&self) -> anyhow::Result<OwnerReference> {
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let role = roles.get_opt(OWNER).await?.ok_or_else(|| {
            anyhow::anyhow!(
                "the ClusterRole {OWNER}, which owns the configuration so that it goes with openflux, is not there: not writing a configuration that would outlive openflux"
            )
        })?;
        owner_reference(&role)
            .ok_or_else(|| anyhow::anyhow!("the ClusterRole {OWNER} as read has no name or uid"))
    }

    async fn event(&self, event: FluxEvent) {
        let Some(events) = &self.events else { return };
        let p = &self.registration;
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(p.namespace.clone()),
            name: Some(p.service.clone()),
            ..Default::default()
        };
        events
            .publish_on(reference, &BTreeMap::new(), &event, None)
            .await;
    }
}

/// The owner reference that puts a configuration under `role`: neither
/// controller nor blocking the owner's deletion (that would need the
/// owner's `finalizers`, which openflux is not granted). None when `role`
/// has no name or uid (not read from the API server).
pub fn owner_reference(role: &ClusterRole) -> Option<OwnerReference> {
    role.owner_ref(&()).filter(|o| !o.uid.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn role(uid: Option<&str>) -> ClusterRole {
        ClusterRole {
            metadata: ObjectMeta {
                name: Some(OWNER.into()),
                uid: uid.map(str::to_string),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn target() -> configuration::Target {
        configuration::Target {
            namespace: "openflux-system".into(),
            service: "openflux-webhook".into(),
            port: 9444,
        }
    }

    /// The configuration registration writes is owned by openflux's
    /// ClusterRole, by uid, and by nothing else: a cluster-scoped owner,
    /// which the garbage collector honours for a cluster-scoped dependent,
    /// removed by every uninstall path.
    #[test]
    fn the_configuration_is_owned_by_openfluxs_cluster_role_alone() {
        let owner = owner_reference(&role(Some("5f0c2a7e-1d"))).expect("an owner reference");
        assert_eq!(
            owner,
            OwnerReference {
                api_version: "rbac.authorization.k8s.io/v1".into(),
                kind: "ClusterRole".into(),
                name: "openflux".into(),
                uid: "5f0c2a7e-1d".into(),
                controller: None,
                block_owner_deletion: None,
            }
        );
        let config = configuration::desired("openflux", &target(), Some(owner.clone()))
            .expect("the configuration");
        assert_eq!(config.metadata.owner_references, Some(vec![owner]));
        assert!(config.metadata.finalizers.is_none());
    }

    /// A role not read from the API server (no uid) gives no owner: the
    /// configuration is not written rather than written owned by nothing.
    #[test]
    fn a_role_without_a_uid_owns_nothing() {
        assert_eq!(owner_reference(&role(None)), None);
        assert_eq!(owner_reference(&role(Some(""))), None);
    }

    /// A configuration an earlier release wrote, owned by the Artifact CRD
    /// (which an uninstall keeps), is written over, owned by the ClusterRole,
    /// its CA bundles kept.
    #[test]
    fn a_configuration_owned_by_the_artifact_crd_is_written_over() {
        let crd_owner = OwnerReference {
            api_version: "apiextensions.k8s.io/v1".into(),
            kind: "CustomResourceDefinition".into(),
            name: "artifacts.openflux.dev".into(),
            uid: "0b6f3c1e".into(),
            ..Default::default()
        };
        let mut earlier = configuration::desired("openflux", &target(), Some(crd_owner))
            .expect("the earlier configuration");
        earlier.metadata.resource_version = Some("42".into());
        for webhook in earlier.webhooks.iter_mut().flatten() {
            webhook.client_config.ca_bundle = Some(k8s_openapi::ByteString(b"kept".to_vec()));
        }
        let owner = owner_reference(&role(Some("5f0c2a7e-1d"))).expect("an owner reference");
        let desired = configuration::desired("openflux", &target(), Some(owner.clone()))
            .expect("the configuration");
        match configuration::plan(Some(&earlier), desired.clone(), b"ours") {
            configuration::Write::Replace(config) => {
                assert_eq!(config.metadata.owner_references, Some(vec![owner]));
                assert_eq!(config.metadata.resource_version.as_deref(), Some("42"));
                for webhook in config.webhooks.iter().flatten() {
                    assert_eq!(
                        webhook.client_config.ca_bundle.as_ref().map(|b| &b.0[..]),
                        Some(&b"kept"[..])
                    );
                }
            }
            other => panic!("expected the configuration written over, got {other:?}"),
        }
        // Once written, it is kept.
        let mut written = desired.clone();
        written.metadata.resource_version = Some("43".into());
        assert_eq!(
            configuration::plan(Some(&written), desired, b"ours"),
            configuration::Write::Keep
        );
    }
}
