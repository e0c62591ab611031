//! Keeps the CA bundle of the served certificate in the webhook
//! configurations (the mutating one and the validating one of one name).
//!
//! Each webhook entry's `clientConfig.caBundle` must contain the CA of what
//! openflux serves. When it does not, openflux puts its CA first and keeps
//! the certificates that were there after it (up to [`MAX_BUNDLE_CERTS`] in
//! all), so replicas that have not yet seen a rotated Secret stay trusted and
//! replicas never undo each other's writes. The configuration is watched, so a
//! bundle wiped by a re-applied manifest is written again; failures are
//! retried with backoff and never stop the webhook.

use futures::StreamExt;
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, TestOperation};
use kube::api::{Api, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::watch;

use crate::api::runtime::retry::Backoff;
use crate::certs::{parse_certs, pem_of};
use crate::watch::retry::retrying;

/// Most certificates openflux leaves in a bundle.
pub const MAX_BUNDLE_CERTS: usize = 4;

/// The bundle to write when `current` lacks a certificate of `ours`: ours
/// first, then the certificates of `current` that are not ours. `None` when
/// `current` already contains all of ours (or `ours` holds no certificate).
pub fn merged_bundle(current: &[u8], ours: &[u8]) -> Option<Vec<u8>> {
    let ours = parse_certs(ours).ok().filter(|c| !c.is_empty())?;
    let current = parse_certs(current).unwrap_or_default();
    if ours.iter().all(|c| current.contains(c)) {
        return None;
    }
    let mut merged = ours.clone();
    for cert in current {
        if merged.len() >= MAX_BUNDLE_CERTS.max(ours.len()) {
            break;
        }
        if !merged.contains(&cert) {
            merged.push(cert);
        }
    }
    Some(merged.iter().map(pem_of).collect::<String>().into_bytes())
}

pub use crate::certs::retire::Configuration;

/// The JSON patch that puts `ours` into every webhook entry of `config`
/// lacking it; each change guarded by a test of the entry's name, so a
/// concurrent reorder fails the patch instead of writing the wrong entry.
pub fn ca_bundle_patch(config: &impl Configuration, ours: &[u8]) -> Option<Patch> {
    let mut ops = Vec::new();
    for (i, (name, current)) in config.bundles().into_iter().enumerate() {
        let Some(bundle) = merged_bundle(current, ours) else {
            continue;
        };
        let index = i.to_string();
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["webhooks", index.as_str(), "name"]),
            value: serde_json::Value::String(name.to_string()),
        }));
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["webhooks", index.as_str(), "clientConfig", "caBundle"]),
            value: serde_json::json!(k8s_openapi::ByteString(bundle)),
        }));
    }
    (!ops.is_empty()).then_some(Patch(ops))
}

/// Patches the configuration if needed; `Ok(true)` when it was changed.
/// A configuration that is not installed is left to the watch, which sees
/// it when it is.
async fn ensure<C: Configuration>(
    api: &Api<C>,
    name: &str,
    ours: &[u8],
) -> Result<bool, kube::Error> {
    let Some(config) = api.get_opt(name).await? else {
        tracing::debug!(configuration = %name, kind = %C::kind(&()), "webhook configuration not installed");
        return Ok(false);
    };
    let Some(patch) = ca_bundle_patch(&config, ours) else {
        return Ok(false);
    };
    api.patch(
        name,
        &PatchParams::default(),
        &kube::api::Patch::Json::<()>(patch),
    )
    .await?;
    Ok(true)
}

/// Keeps `ours` in the configuration `name` of kind `C` until `stop` turns
/// true or its sender goes away.
pub async fn keep_injected<C: Configuration>(
    client: kube::Client,
    name: String,
    mut ours: watch::Receiver<Vec<u8>>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<C> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = retrying(api.clone(), config).applied_objects();
    tokio::pin!(events);
    let mut bundle = ours.borrow_and_update().clone();
    let mut dirty = true;
    let mut backoff = Backoff::default();
    let mut retry_at = tokio::time::Instant::now();
    loop {
        if dirty && tokio::time::Instant::now() >= retry_at {
            match ensure(&api, &name, &bundle).await {
                Ok(changed) => {
                    if changed {
                        tracing::info!(configuration = %name, "wrote the webhook CA bundle");
                    }
                    dirty = false;
                    backoff.succeeded();
                }
                Err(error) => {
                    let wait = backoff.failed();
                    tracing::warn!(configuration = %name, %error, retry_in = ?wait, "cannot write the webhook CA bundle");
                    retry_at = tokio::time::Instant::now() + wait;
                }
            }
        }
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
            }
            changed = ours.changed() => {
                if changed.is_err() {
                    return;
                }
                bundle = ours.borrow_and_update().clone();
                dirty = true;
                retry_at = tokio::time::Instant::now();
            }
            event = events.next() => match event {
                Some(Ok(config)) => {
                    if ca_bundle_patch(&config, &bundle).is_some() {
                        dirty = true;
                    }
                }
                Some(Err(error)) => {
                    tracing::debug!(configuration = %name, %error, "watching the webhook configuration");
                }
                None => {
                    // The watcher does not end; if it did, fall back to retries.
                    tokio::time::sleep(backoff.max()).await;
                }
            },
            () = tokio::time::sleep_until(retry_at), if dirty => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{Authority, DEFAULT_CA_VALIDITY};
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, WebhookClientConfig};

    fn ca() -> Vec<u8> {
        Authority::generate(DEFAULT_CA_VALIDITY)
            .unwrap()
            .cert_pem
            .into_bytes()
    }

    fn config(bundles: &[Option<&[u8]>]) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            webhooks: Some(
                bundles
                    .iter()
                    .enumerate()
                    .map(|(i, b)| MutatingWebhook {
                        name: format!("w{i}.openflux.dev"),
                        client_config: WebhookClientConfig {
                            ca_bundle: b.map(|b| k8s_openapi::ByteString(b.to_vec())),
                            ..Default::default()
                        },
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn merges_ours_first_and_is_stable() {
        let (a, b) = (ca(), ca());
        assert_eq!(merged_bundle(&a, &a), None);
        let merged = merged_bundle(&a, &b).unwrap();
        let certs = parse_certs(&merged).unwrap();
        assert_eq!(certs[0], parse_certs(&b).unwrap()[0]);
        assert_eq!(certs[1], parse_certs(&a).unwrap()[0]);
        // Both replicas are content with the merged bundle: no ping-pong.
        assert_eq!(merged_bundle(&merged, &a), None);
        assert_eq!(merged_bundle(&merged, &b), None);
        assert_eq!(merged_bundle(b"", &a), Some(a.clone()));
        assert_eq!(merged_bundle(&a, b"garbage"), None);
        // Old certificates fall off after MAX_BUNDLE_CERTS.
        let mut bundle = Vec::new();
        for _ in 0..6 {
            bundle = merged_bundle(&bundle, &ca()).unwrap();
        }
        assert_eq!(parse_certs(&bundle).unwrap().len(), MAX_BUNDLE_CERTS);
    }

    #[test]
    fn patches_only_entries_that_lack_our_ca() {
        let ours = ca();
        let other = ca();
        let cfg = config(&[Some(&ours), None, Some(&other)]);
        let patch = serde_json::to_value(ca_bundle_patch(&cfg, &ours).unwrap()).unwrap();
        let ops = patch.as_array().unwrap();
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(ops[0]["path"], "/webhooks/1/name");
        assert_eq!(ops[0]["value"], "w1.openflux.dev");
        assert_eq!(ops[1]["path"], "/webhooks/1/clientConfig/caBundle");
        assert_eq!(ops[3]["path"], "/webhooks/2/clientConfig/caBundle");
        // Applying it leaves nothing to do.
        let mut value = serde_json::to_value(&cfg).unwrap();
        json_patch::patch(&mut value, &ca_bundle_patch(&cfg, &ours).unwrap()).unwrap();
        let patched: MutatingWebhookConfiguration = serde_json::from_value(value).unwrap();
        assert!(ca_bundle_patch(&patched, &ours).is_none());
        assert!(ca_bundle_patch(&config(&[]), &ours).is_none());
    }
}
