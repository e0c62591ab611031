//! Webhook certificates kept in a Secret of openflux's namespace, with
//! nothing prepared by hand.
//!
//! - Every replica, leader or not, watches the Secret ([`serve`]) and
//!   serves its certificate, swapped in the TLS resolver when the Secret
//!   changes (connections open keep theirs). Until a certificate is loaded
//!   the replica is not ready, so the Service sends it no admissions.
//! - The elected leader keeps the Secret
//!   ([`renew::keep`](super::renew::keep)).
//!
//! The CA bundle each replica loads goes into the webhook configurations
//! through [`crate::certs::cabundle`], as for any other certificate
//! source.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::Api;
use kube::runtime::watcher;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::keeper::{SwappableCert, CA_FILE, CERT_FILE, KEY_FILE};
use super::material::{material_from_pem, parse_certs};
use super::rotation::Timing;
use super::stored::Names;
use crate::api::runtime::{EventRecorder, FluxEvent};
use crate::telemetry::SyncGuard;
use crate::watch::retry::{retrying, works};

/// Name of the Secret unless told otherwise.
pub const DEFAULT_SECRET: &str = "openflux-webhook-tls";
/// Label that marks the Secret as openflux's to write.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "openflux");

/// Where the certificates are kept and what they must be.
#[derive(Clone, Debug)]
pub struct SecretCerts {
    pub namespace: String,
    pub name: String,
    pub names: Names,
    pub timing: Timing,
    /// The webhook configurations that must trust a new CA before it signs.
    pub configurations: Vec<String>,
}

pub(crate) fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Reason of the Event when the Secret cannot be kept.
pub const REASON_FAILED: &str = "CertificateSecretFailed";
/// Reason of the Event when the Secret's certificate is refused.
pub const REASON_REJECTED: &str = "CertificateRejected";
/// Reason of the Event when the leader wrote the Secret.
pub const REASON_WRITTEN: &str = "CertificateSecretWritten";

/// Publishes `event` on the Secret of `certs` (which may not exist yet).
pub(crate) async fn publish(events: Option<&EventRecorder>, certs: &SecretCerts, event: FluxEvent) {
    let Some(events) = events else { return };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Secret".into()),
        namespace: Some(certs.namespace.clone()),
        name: Some(certs.name.clone()),
        ..Default::default()
    };
    events
        .publish_on(reference, &BTreeMap::new(), &event, None)
        .await;
}

fn bytes(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret.data.as_ref()?.get(key).map(|b| b.0.clone())
}

/// Serves the certificate of the Secret: installs it in `resolver` and its
/// CA bundle in `bundle` whenever it changes, marks `ready` synced at the
/// first one, and counts every change of the Secret in `seen`. Runs until
/// `stop` turns true or its sender goes away.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    client: kube::Client,
    certs: SecretCerts,
    recorder: Option<EventRecorder>,
    resolver: Arc<SwappableCert>,
    bundle: watch::Sender<Vec<u8>>,
    mut ready: SyncGuard,
    seen: watch::Sender<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Secret> = Api::namespaced(client, &certs.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", certs.name));
    let events = retrying(api, config);
    tokio::pin!(events);
    let mut last: Option<[u8; 32]> = None;
    loop {
        let event = tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
                continue;
            }
            event = events.next() => event,
        };
        let secret = match event {
            Some(Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s))) => s,
            Some(Ok(watcher::Event::Delete(_))) => {
                ready.ok();
                tracing::warn!(secret = %certs.name, "the webhook certificate Secret was deleted; serving the current certificate");
                seen.send_modify(|n| *n += 1);
                continue;
            }
            Some(Ok(event)) => {
                if works(&event) {
                    ready.ok();
                }
                continue;
            }
            Some(Err(error)) => {
                ready.failed();
                tracing::warn!(secret = %certs.name, %error, "watching the webhook certificate Secret");
                continue;
            }
            None => return,
        };
        ready.ok();
        seen.send_modify(|n| *n += 1);
        let (Some(cert), Some(key), Some(ca)) = (
            bytes(&secret, CERT_FILE),
            bytes(&secret, KEY_FILE),
            bytes(&secret, CA_FILE),
        ) else {
            tracing::warn!(secret = %certs.name, "the webhook certificate Secret lacks {CERT_FILE}, {KEY_FILE} or {CA_FILE}");
            continue;
        };
        let mut hasher = Sha256::new();
        for part in [&cert, &key, &ca] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let hash: [u8; 32] = hasher.finalize().into();
        if last == Some(hash) {
            continue;
        }
        last = Some(hash);
        match material_from_pem(&cert, &key, Some(&ca)) {
            Ok(material) => {
                let served = resolver.get();
                if served.as_ref().map(|c| &c.cert) != Some(&material.certified.cert) {
                    resolver.set(material.certified.clone());
                    tracing::info!(secret = %certs.name, not_after = material.not_after, "serving the webhook certificate of the Secret");
                }
                let cas = parse_certs(&material.ca_bundle)
                    .map(|c| c.len())
                    .unwrap_or(0);
                bundle.send_if_modified(|current| {
                    let changed = *current != material.ca_bundle;
                    if changed {
                        tracing::info!(secret = %certs.name, cas, "the Secret's CA bundle changed");
                    }
                    *current = material.ca_bundle;
                    changed
                });
                ready.synced();
            }
            Err(error) => {
                tracing::error!(secret = %certs.name, %error, "rejected the webhook certificate of the Secret; serving the current one");
                let message = format!(
                    "the webhook certificate was refused ({error}); the current one is served"
                );
                publish(
                    recorder.as_ref(),
                    &certs,
                    FluxEvent::warning(REASON_REJECTED, message),
                )
                .await;
            }
        }
    }
}
