//! Keeps openflux's ValidatingWebhookConfiguration published while this
//! replica leads (`--validating-webhook-service`): created once a ready
//! endpoint of the Service serves `/validate`, written again when deleted or
//! changed, owned by openflux's Artifact CRD so it goes with openflux
//! ([`super::configuration`] says why openflux writes it). The CA bundles
//! in it are then kept by [`super::cabundle`]. Failures are logged, put in
//! an Event on the Service and retried with backoff; they never stop the
//! webhook.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{CustomResourceExt, Resource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::configuration::{self, Target, Write};
use crate::api::runtime::{EventRecorder, FluxEvent};
use crate::watch::retry::retrying;

const MAX_BACKOFF: Duration = Duration::from_secs(60);
const REASON_FAILED: &str = "ValidatingWebhookFailed";
const REASON_PUBLISHED: &str = "ValidatingWebhookPublished";

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
        let mut backoff = Duration::from_secs(1);
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
                        backoff = Duration::from_secs(1);
                        reported = None;
                    }
                    Err(error) => {
                        let message = format!(
                            "cannot publish the ValidatingWebhookConfiguration {}: {error}",
                            p.configuration
                        );
                        tracing::warn!(retry_in = ?backoff, "{message}");
                        if reported.as_ref() != Some(&message) {
                            self.event(FluxEvent::warning(REASON_FAILED, message.clone()))
                                .await;
                            reported = Some(message);
                        }
                        retry_at = tokio::time::Instant::now() + backoff;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
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
        let desired = configuration::desired(&p.configuration, &target, self.owner().await?)?;
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

    /// openflux's Artifact CRD as the owner, so the configuration goes when
    /// openflux is uninstalled; none when the CRD is not installed.
    async fn owner(&self) -> Result<Option<OwnerReference>, kube::Error> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let crd = crds.get_opt(crate::api::Artifact::crd_name()).await?;
        Ok(crd.and_then(|crd| {
            crd.controller_owner_ref(&()).map(|mut o| {
                o.controller = None;
                o.block_owner_deletion = None;
                o
            })
        }))
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
