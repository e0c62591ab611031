//! The ValidatingWebhookConfiguration openflux publishes for itself when it
//! runs behind a Service (`--validating-webhook-service`). Pure.
//!
//! Its entries come from `validating.yaml` (one per consumer
//! kind, kept in step with the consumer table by a test), pointed at the
//! Service's port named by `--validating-webhook-port`. That port targets,
//! by name, a container port only Pods that serve `/validate` declare, so
//! the Service never sends a validating call to a Pod of an earlier release
//! during an upgrade. openflux writes the configuration rather than the
//! manifests because a configuration applied before any Pod serves it, or
//! without its CA bundle, fails every admission it matches: it is created
//! only once a ready endpoint serves the port, with the CA bundle in it.

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::ByteString;
use serde_json::Value;

const TEMPLATE: &str = include_str!("validating.yaml");

/// Where the API server calls openflux's `/validate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// openflux's namespace (the Service's).
    pub namespace: String,
    pub service: String,
    /// The Service's port number (the port named `--validating-webhook-port`).
    pub port: i32,
}

/// The configuration named `name` calling `target`, owned by `owner` (the
/// ClusterRole `openflux`, so it goes at an uninstall), without CA bundles.
pub fn desired(
    name: &str,
    target: &Target,
    owner: Option<OwnerReference>,
) -> Result<ValidatingWebhookConfiguration, serde_yaml_ng::Error> {
    let mut config: ValidatingWebhookConfiguration = serde_yaml_ng::from_str(TEMPLATE)?;
    config.metadata.name = Some(name.to_string());
    config
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("app.kubernetes.io/managed-by".into(), "openflux".into());
    config.metadata.owner_references = owner.map(|o| vec![o]);
    for webhook in config.webhooks.iter_mut().flatten() {
        if let Some(service) = webhook.client_config.service.as_mut() {
            service.namespace = target.namespace.clone();
            service.name = target.service.clone();
            service.port = Some(target.port);
        }
        // The template leaves out kube-system and openflux's own namespace
        // as it is named in the manifests: leave out the one it runs in.
        let expressions = webhook
            .namespace_selector
            .as_mut()
            .and_then(|s| s.match_expressions.as_mut());
        for expression in expressions.into_iter().flatten() {
            if expression.key == "kubernetes.io/metadata.name" && expression.operator == "NotIn" {
                expression.values = Some(vec!["kube-system".into(), target.namespace.clone()]);
            }
        }
    }
    Ok(config)
}

/// The number of the Service's port named `port_name`.
pub fn service_port(service: &Service, port_name: &str) -> Option<i32> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    ports
        .iter()
        .find(|p| p.name.as_deref() == Some(port_name))
        .map(|p| p.port)
}

/// Whether some ready endpoint of the Service serves its port `port_name`.
/// The EndpointSlice controller lists a port in a slice only for the Pods
/// that declare the container port it targets. An unknown readiness counts
/// as ready, as the EndpointSlice API says it should.
pub fn serving<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>, port_name: &str) -> bool {
    slices.into_iter().any(|slice| {
        let has_port = slice
            .ports
            .iter()
            .flatten()
            .any(|p| p.name.as_deref() == Some(port_name));
        has_port
            && slice
                .endpoints
                .iter()
                .any(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
    })
}

/// What to write to bring the configuration to `desired`.
#[derive(Debug, PartialEq)]
pub enum Write {
    /// Nothing: it holds every field of `desired` (CA bundles aside).
    Keep,
    Create(Box<ValidatingWebhookConfiguration>),
    /// Replace the configuration of this resourceVersion.
    Replace(Box<ValidatingWebhookConfiguration>),
}

/// The write that makes `current` hold `desired`. CA bundles are the CA
/// bundle keeper's ([`crate::certs::cabundle`]): a new configuration starts with
/// `ours`, a replaced entry keeps the bundle it had.
pub fn plan(
    current: Option<&ValidatingWebhookConfiguration>,
    mut desired: ValidatingWebhookConfiguration,
    ours: &[u8],
) -> Write {
    let Some(current) = current else {
        for webhook in desired.webhooks.iter_mut().flatten() {
            webhook.client_config.ca_bundle = Some(ByteString(ours.to_vec()));
        }
        return Write::Create(Box::new(desired));
    };
    if holds(current, &desired) {
        return Write::Keep;
    }
    let bundle_of = |name: &str| {
        let entries = current.webhooks.iter().flatten();
        entries
            .filter(|w| w.name == name)
            .find_map(|w| w.client_config.ca_bundle.clone())
            .filter(|b| !b.0.is_empty())
    };
    for webhook in desired.webhooks.iter_mut().flatten() {
        webhook.client_config.ca_bundle =
            Some(bundle_of(&webhook.name).unwrap_or_else(|| ByteString(ours.to_vec())));
    }
    desired.metadata.resource_version = current.metadata.resource_version.clone();
    Write::Replace(Box::new(desired))
}

/// Whether `current` holds every field `desired` sets (the API server adds
/// defaults; CA bundles are not compared).
fn holds(
    current: &ValidatingWebhookConfiguration,
    desired: &ValidatingWebhookConfiguration,
) -> bool {
    let without_bundles = |c: &ValidatingWebhookConfiguration| {
        let mut c = c.clone();
        for webhook in c.webhooks.iter_mut().flatten() {
            webhook.client_config.ca_bundle = None;
        }
        serde_json::to_value(c).unwrap_or(Value::Null)
    };
    let current = without_bundles(current);
    let desired = without_bundles(desired);
    contains(&current["webhooks"], &desired["webhooks"])
        && contains(
            &current["metadata"]["labels"],
            &desired["metadata"]["labels"],
        )
        && contains(
            &current["metadata"]["ownerReferences"],
            &desired["metadata"]["ownerReferences"],
        )
}

/// Whether `big` has every field of `small` with the same value (lists of
/// the same length, compared item by item).
fn contains(big: &Value, small: &Value) -> bool {
    match (big, small) {
        (_, Value::Null) => true,
        (Value::Object(big), Value::Object(small)) => small
            .iter()
            .all(|(key, value)| big.get(key).is_some_and(|b| contains(b, value))),
        (Value::Array(big), Value::Array(small)) => {
            big.len() == small.len() && big.iter().zip(small).all(|(b, s)| contains(b, s))
        }
        (big, small) => big == small,
    }
}

#[cfg(test)]
mod tests;
