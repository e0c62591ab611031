//! The elected leader keeps the webhook's certificate Secret: creates it
//! when it is missing (create only: when two replicas race, the one that
//! lost reads what won), and renews, rotates and prunes it as
//! [`rotation::decide`](super::rotation::decide) says, each write
//! conditional on the version it read. Every replica serves it
//! ([`secret::serve`](super::secret::serve)).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::material::parse_certs;
use super::retire::{entries, retire_patch, Configuration, Retirement};
use super::rotation::{decide, Step};
use super::secret::{now, publish, SecretCerts, MANAGED_BY, REASON_FAILED, REASON_WRITTEN};
use super::stored::Content;
use crate::api::runtime::retry::Backoff;
use crate::api::runtime::{EventRecorder, FluxEvent};
use rustls::pki_types::CertificateDer;

/// Longest the leader goes without looking at the Secret.
const MAX_WAIT: Duration = Duration::from_secs(300);

/// Why a round of the leader's keeping failed.
#[derive(Debug, thiserror::Error)]
enum KeepError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Cert(#[from] super::material::CertError),
    #[error("it is not labelled {0}={1}, so it is served as it is and never renewed; delete it to let openflux make its own, or run openflux with --tls-cert-file to mount it")]
    NotOurs(&'static str, &'static str),
}

/// Keeps the Secret while this replica leads: `terms` holds the current
/// term of leadership (cancelled when it ends), `seen` counts changes of the
/// Secret (from [`serve`]). Runs until `stop` turns true or its sender goes
/// away.
pub async fn keep(
    client: kube::Client,
    certs: SecretCerts,
    events: Option<EventRecorder>,
    mut terms: watch::Receiver<Option<CancellationToken>>,
    mut seen: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let keeper = Keeper {
        secrets: Api::namespaced(client.clone(), &certs.namespace),
        mutating: Api::all(client.clone()),
        validating: Api::all(client),
        certs,
        events,
    };
    loop {
        let term = terms.borrow_and_update().clone();
        if let Some(term) = term.filter(|t| !t.is_cancelled()) {
            tokio::select! {
                () = keeper.lead(&mut seen) => {}
                () = term.cancelled() => {}
                _ = stop.changed() => return,
            }
            continue;
        }
        tokio::select! {
            changed = terms.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}

struct Keeper {
    secrets: Api<Secret>,
    mutating: Api<MutatingWebhookConfiguration>,
    validating: Api<ValidatingWebhookConfiguration>,
    certs: SecretCerts,
    events: Option<EventRecorder>,
}

impl Keeper {
    /// Rounds until the term ends (the caller drops this future).
    async fn lead(&self, seen: &mut watch::Receiver<u64>) {
        let mut trusted: Option<(String, i64)> = None;
        let mut retirement = Retirement::default();
        let mut backoff = Backoff::default();
        // The last failure published, so a failure that lasts is one Event.
        let mut reported: Option<String> = None;
        loop {
            let wait = match self.round(&mut trusted, &mut retirement).await {
                Ok(until) => {
                    backoff.succeeded();
                    reported = None;
                    let secs = u64::try_from(until.saturating_sub(now())).unwrap_or(0);
                    Duration::from_secs(secs).min(MAX_WAIT)
                }
                Err(error) => {
                    let wait = backoff.failed();
                    tracing::warn!(secret = %self.certs.name, %error, retry_in = ?wait, "cannot keep the webhook certificate Secret");
                    let message = format!(
                        "cannot keep the webhook certificate Secret {}/{}: {error}",
                        self.certs.namespace, self.certs.name
                    );
                    if reported.as_ref() != Some(&message) {
                        publish(
                            self.events.as_ref(),
                            &self.certs,
                            FluxEvent::warning(REASON_FAILED, message.clone()),
                        )
                        .await;
                        reported = Some(message);
                    }
                    wait
                }
            };
            if wait.is_zero() {
                continue;
            }
            seen.borrow_and_update();
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                changed = seen.changed() => if changed.is_err() {
                    tokio::time::sleep(wait).await;
                },
            }
        }
    }

    /// One look at the Secret and at most one write. Returns when to look
    /// again (Unix seconds; now, after a write or a lost race).
    async fn round(
        &self,
        trusted: &mut Option<(String, i64)>,
        retirement: &mut Retirement,
    ) -> Result<i64, KeepError> {
        let name = &self.certs.name;
        let current = self.secrets.get_opt(name).await?;
        if let Some(secret) = &current {
            let labels = secret.metadata.labels.as_ref();
            if labels.and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) != Some(MANAGED_BY.1) {
                return Err(KeepError::NotOurs(MANAGED_BY.0, MANAGED_BY.1));
            }
        }
        let content = current.as_ref().and_then(|secret| {
            let data: BTreeMap<String, Vec<u8>> = secret
                .data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect();
            Content::from_data(&data)
                .and_then(|c| c.facts(&self.certs.names).map(|f| (c, f)))
                .map_err(|error| tracing::warn!(secret = %name, %error, "the webhook certificate Secret is unusable; making a new one"))
                .ok()
        });
        let now = now();
        if let Some((content, facts)) = &content {
            if !facts.leaf_by_signer {
                let signer = content.signer().to_string();
                if trusted.as_ref().is_none_or(|(s, _)| *s != signer) {
                    *trusted = None;
                    if self.trusted_everywhere(&signer).await? {
                        tracing::info!(secret = %name, "the new webhook CA is in every webhook configuration");
                        *trusted = Some((signer, now));
                    }
                }
            }
        }
        let timing = &self.certs.timing;
        let step = decide(
            content.as_ref().map(|(_, f)| f),
            now,
            timing,
            trusted.as_ref().map(|(_, since)| *since),
        );
        if let Step::Keep { until } = step {
            let Some((content, _)) = &content else {
                return Ok(until);
            };
            let next = self.retire(content, now, retirement).await?;
            return Ok(next.map_or(until, |at| at.min(until)));
        }
        let next = match &content {
            Some((content, _)) => content.apply(step, now, timing, &self.certs.names)?,
            None => Content::create(timing, &self.certs.names)?,
        };
        let data = next
            .to_data()
            .into_iter()
            .map(|(k, v)| (k, ByteString(v)))
            .collect();
        let written = match current {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.certs.namespace.clone()),
                        labels: Some(BTreeMap::from([(
                            MANAGED_BY.0.to_string(),
                            MANAGED_BY.1.to_string(),
                        )])),
                        ..Default::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data: Some(data),
                    ..Default::default()
                };
                self.secrets.create(&PostParams::default(), &secret).await
            }
            Some(mut secret) => {
                // Conditional on the resourceVersion read above.
                secret.data = Some(data);
                self.secrets
                    .replace(name, &PostParams::default(), &secret)
                    .await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = %name, ?step, "wrote the webhook certificate Secret");
                let message = match step {
                    Step::Create => "made a CA and a serving certificate",
                    Step::NewAuthority => "added a new CA to the trusted bundle; it signs once every webhook configuration trusts it",
                    Step::Issue => "issued a serving certificate",
                    Step::Prune => "removed expired CAs from the trusted bundle",
                    Step::Keep { .. } => "",
                };
                publish(
                    self.events.as_ref(),
                    &self.certs,
                    FluxEvent::normal(REASON_WRITTEN, message),
                )
                .await;
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::info!(secret = %name, ?step, "another replica wrote the webhook certificate Secret first; reading it");
            }
            Err(error) => return Err(error.into()),
        }
        Ok(now)
    }

    /// Removes from the webhook configurations the CAs that have been out
    /// of the Secret's bundle for [`Timing::retire_after`]; returns when to
    /// look again for one still waiting (now after a write).
    ///
    /// [`Timing::retire_after`]: super::rotation::Timing::retire_after
    async fn retire(
        &self,
        content: &Content,
        now: i64,
        retirement: &mut Retirement,
    ) -> Result<Option<i64>, KeepError> {
        let mut kept = Vec::new();
        for pem in &content.bundle {
            kept.extend(parse_certs(pem.as_bytes())?);
        }
        let mutating = self.read_entries(&self.mutating).await?;
        let validating = self.read_entries(&self.validating).await?;
        let held: Vec<_> = mutating
            .iter()
            .chain(&validating)
            .flat_map(|(_, entries)| entries)
            .flat_map(|(_, bundle)| parse_certs(bundle).unwrap_or_default())
            .collect();
        let after = i64::try_from(self.certs.timing.retire_after().as_secs()).unwrap_or(i64::MAX);
        let (due, next) = retirement.due(&held, &kept, now, after);
        if due.is_empty() {
            return Ok(next);
        }
        let (w1, l1) = retire_in(&self.mutating, &mutating, &due, &kept).await?;
        let (w2, l2) = retire_in(&self.validating, &validating, &due, &kept).await?;
        let (written, lost) = (w1 || w2, l1 || l2);
        if written {
            tracing::info!(secret = %self.certs.name, retired = due.len(), "removed CAs that left the Secret from the webhook configurations");
            publish(
                self.events.as_ref(),
                &self.certs,
                FluxEvent::normal(
                    REASON_WRITTEN,
                    "removed CAs that left the trusted bundle from the webhook configurations",
                ),
            )
            .await;
        }
        // After a write, look again at once; after a lost race, in a second;
        // an entry holding retired CAs alone waits for a replica to add the
        // Secret's first.
        Ok(match (written, lost) {
            (_, true) => Some(now + 1),
            (true, false) => Some(now),
            (false, false) => next,
        })
    }

    /// Each configuration of kind `C` openflux keeps (by name) that exists,
    /// with its entries' names and CA bundles.
    async fn read_entries<C: Configuration>(&self, api: &Api<C>) -> Result<Entries, KeepError> {
        let mut found = Vec::new();
        for name in &self.certs.configurations {
            if let Some(config) = api.get_opt(name).await? {
                found.push((name.clone(), entries(&config)));
            }
        }
        Ok(found)
    }

    /// Whether every entry of every webhook configuration (mutating and
    /// validating, of each name) trusts `signer`. A configuration that does
    /// not exist has nobody to protect.
    async fn trusted_everywhere(&self, signer: &str) -> Result<bool, KeepError> {
        let Some(signer) = parse_certs(signer.as_bytes())?.into_iter().next() else {
            return Ok(false);
        };
        let mutating = self.read_entries(&self.mutating).await?;
        let validating = self.read_entries(&self.validating).await?;
        let trusted = mutating
            .iter()
            .chain(&validating)
            .flat_map(|(_, entries)| entries)
            .all(|(_, bundle)| parse_certs(bundle).unwrap_or_default().contains(&signer));
        Ok(trusted)
    }
}

/// The configurations of one kind that exist: each one's name, and its
/// entries' names and CA bundles.
type Entries = Vec<(String, Vec<(String, Vec<u8>)>)>;

/// Removes `due` from the configurations of kind `C` read as `configs`:
/// whether any was written, and whether any write lost a race.
async fn retire_in<C: Configuration>(
    api: &Api<C>,
    configs: &Entries,
    due: &[CertificateDer<'_>],
    kept: &[CertificateDer<'_>],
) -> Result<(bool, bool), KeepError> {
    let params = kube::api::PatchParams::default();
    let (mut written, mut lost) = (false, false);
    for (name, entries) in configs {
        if let Some(patch) = retire_patch(entries, due, kept) {
            let patch = kube::api::Patch::Json::<()>(patch);
            let done = written_or_lost(api.patch(name, &params, &patch).await)?;
            (written, lost) = (written || done, lost || !done);
        }
    }
    Ok((written, lost))
}

/// `Ok(true)` for a write, `Ok(false)` for one refused because the
/// configuration changed since it was read (a failed test, or a conflict):
/// it is read again.
fn written_or_lost<T>(result: Result<T, kube::Error>) -> Result<bool, KeepError> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if matches!(status.code, 409 | 422) => Ok(false),
        Err(error) => Err(error.into()),
    }
}
