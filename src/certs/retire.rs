//! Retired CAs leave the webhook configurations.
//!
//! Every replica adds the CA bundle it serves to each entry of the
//! configurations and removes nothing
//! ([`keep_injected`](crate::certs::cabundle::keep_injected)), so that a
//! replica that has not yet seen a rotated Secret stays trusted. What left
//! the Secret's trusted bundle (an expired CA pruned, or the CA of a deleted
//! Secret) is removed by the leader that keeps the Secret: once a
//! certificate has been out of the Secret for
//! [`Timing::retire_after`](super::rotation::Timing::retire_after), it
//! leaves every entry. Each write is guarded by a test of the entry's name
//! and bundle, so an entry a replica changed meanwhile is read again; a
//! replica that still serves a removed CA puts it back.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{Patch, PatchOperation, ReplaceOperation, TestOperation};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::ClusterResourceScope;
use rustls::pki_types::CertificateDer;

use super::material::{parse_certs, pem_of};

/// When each certificate that the configurations hold and the Secret does
/// not was first seen so (Unix seconds).
#[derive(Debug, Default)]
pub struct Retirement {
    since: BTreeMap<Vec<u8>, i64>,
}

impl Retirement {
    /// Looks at the certificates the configurations hold (`held`) against
    /// the Secret's (`kept`) at `now`: the ones out of the Secret for
    /// `after` seconds or more, and when the next one will be (None when no
    /// other is waiting). A certificate no longer held, or back in the
    /// Secret, is forgotten.
    pub fn due(
        &mut self,
        held: &[CertificateDer<'_>],
        kept: &[CertificateDer<'_>],
        now: i64,
        after: i64,
    ) -> (Vec<CertificateDer<'static>>, Option<i64>) {
        let out: Vec<&CertificateDer<'_>> = held.iter().filter(|c| !kept.contains(c)).collect();
        self.since
            .retain(|der, _| out.iter().any(|c| c.as_ref() == der.as_slice()));
        let mut due = Vec::new();
        let mut next: Option<i64> = None;
        for cert in out {
            let since = *self.since.entry(cert.as_ref().to_vec()).or_insert(now);
            let at = since.saturating_add(after);
            if at <= now {
                if !due.contains(cert) {
                    due.push(cert.clone().into_owned());
                }
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (due, next)
    }
}

/// `current` without the certificates of `retired`, in its order. None when
/// it holds none of them, or when none of `kept` would be left: an entry is
/// never emptied, the replicas add the Secret's CA first.
pub fn without(
    current: &[u8],
    retired: &[CertificateDer<'_>],
    kept: &[CertificateDer<'_>],
) -> Option<Vec<u8>> {
    let certs = parse_certs(current).ok()?;
    if !certs.iter().any(|c| retired.contains(c)) || !certs.iter().any(|c| kept.contains(c)) {
        return None;
    }
    let left: String = certs
        .iter()
        .filter(|c| !retired.contains(c))
        .map(pem_of)
        .collect();
    Some(left.into_bytes())
}

/// The JSON patch that removes `retired` from each entry (name, CA bundle)
/// of a configuration, each change guarded by tests of the entry's name and
/// of the bundle it had; None when no entry changes.
pub fn retire_patch(
    entries: &[(String, Vec<u8>)],
    retired: &[CertificateDer<'_>],
    kept: &[CertificateDer<'_>],
) -> Option<Patch> {
    let mut ops = Vec::new();
    for (i, (name, current)) in entries.iter().enumerate() {
        let Some(bundle) = without(current, retired, kept) else {
            continue;
        };
        let index = i.to_string();
        let path =
            PointerBuf::from_tokens(["webhooks", index.as_str(), "clientConfig", "caBundle"]);
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["webhooks", index.as_str(), "name"]),
            value: serde_json::Value::String(name.clone()),
        }));
        ops.push(PatchOperation::Test(TestOperation {
            path: path.clone(),
            value: serde_json::json!(k8s_openapi::ByteString(current.clone())),
        }));
        ops.push(PatchOperation::Replace(ReplaceOperation {
            path,
            value: serde_json::json!(k8s_openapi::ByteString(bundle)),
        }));
    }
    (!ops.is_empty()).then_some(Patch(ops))
}

/// A webhook configuration whose entries carry a CA bundle.
pub trait Configuration:
    kube::Resource<DynamicType = (), Scope = ClusterResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// Each entry's name and CA bundle, in order.
    fn bundles(&self) -> Vec<(&str, &[u8])>;
}

impl Configuration for MutatingWebhookConfiguration {
    fn bundles(&self) -> Vec<(&str, &[u8])> {
        let entries = self.webhooks.iter().flatten();
        entries
            .map(|w| (w.name.as_str(), bundle_of(&w.client_config)))
            .collect()
    }
}

impl Configuration for ValidatingWebhookConfiguration {
    fn bundles(&self) -> Vec<(&str, &[u8])> {
        let entries = self.webhooks.iter().flatten();
        entries
            .map(|w| (w.name.as_str(), bundle_of(&w.client_config)))
            .collect()
    }
}

fn bundle_of(config: &k8s_openapi::api::admissionregistration::v1::WebhookClientConfig) -> &[u8] {
    config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.as_slice())
        .unwrap_or_default()
}

/// Each entry's name and CA bundle, owned.
pub fn entries(config: &impl Configuration) -> Vec<(String, Vec<u8>)> {
    config
        .bundles()
        .into_iter()
        .map(|(name, bundle)| (name.to_string(), bundle.to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::material::Authority;
    use std::time::Duration;

    fn ca() -> CertificateDer<'static> {
        let authority = Authority::generate(Duration::from_secs(3600)).unwrap();
        parse_certs(authority.cert_pem.as_bytes())
            .unwrap()
            .remove(0)
    }

    fn bundle(certs: &[&CertificateDer<'_>]) -> Vec<u8> {
        certs
            .iter()
            .map(|c| pem_of(c))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn a_certificate_is_due_once_it_has_been_out_of_the_secret_long_enough() {
        let (old, new) = (ca(), ca());
        let mut retirement = Retirement::default();
        let held = [new.clone(), old.clone()];
        let kept = [new.clone()];
        assert_eq!(retirement.due(&held, &kept, 100, 60), (vec![], Some(160)));
        assert_eq!(retirement.due(&held, &kept, 159, 60), (vec![], Some(160)));
        assert_eq!(
            retirement.due(&held, &kept, 160, 60),
            (vec![old.clone()], None)
        );
        // Back in the Secret (a rotation undone), or no longer held: forgotten.
        assert_eq!(retirement.due(&held, &held, 170, 60), (vec![], None));
        assert_eq!(retirement.due(&held, &kept, 171, 60), (vec![], Some(231)));
        assert_eq!(retirement.due(&kept, &kept, 172, 60), (vec![], None));
        assert_eq!(retirement.due(&held, &kept, 173, 60), (vec![], Some(233)));
    }

    #[test]
    fn an_entry_loses_what_retired_and_keeps_its_order_but_is_never_emptied() {
        let (old, new, other) = (ca(), ca(), ca());
        let (retired, kept) = ([old.clone()], [new.clone()]);
        let current = bundle(&[&new, &old, &other]);
        assert_eq!(
            without(&current, &retired, &kept),
            Some(bundle(&[&new, &other]))
        );
        assert_eq!(without(&bundle(&[&new, &other]), &retired, &kept), None);
        // Only retired certificates: left for the replicas to add theirs first.
        assert_eq!(without(&bundle(&[&old]), &retired, &kept), None);
    }

    #[test]
    fn the_patch_tests_each_changed_entrys_name_and_bundle() {
        let (old, new) = (ca(), ca());
        let entries = vec![
            ("a.openflux.dev".to_string(), bundle(&[&new, &old])),
            ("b.openflux.dev".to_string(), bundle(&[&new])),
        ];
        let (retired, kept) = ([old], [new.clone()]);
        let patch = retire_patch(&entries, &retired, &kept).unwrap();
        let ops = serde_json::to_value(&patch).unwrap();
        let ops = ops.as_array().unwrap();
        assert_eq!(ops.len(), 3, "{ops:?}");
        assert_eq!(ops[0]["op"], "test");
        assert_eq!(ops[0]["path"], "/webhooks/0/name");
        assert_eq!(ops[1]["op"], "test");
        assert_eq!(ops[1]["path"], "/webhooks/0/clientConfig/caBundle");
        assert_eq!(ops[2]["op"], "replace");
        let written: k8s_openapi::ByteString =
            serde_json::from_value(ops[2]["value"].clone()).unwrap();
        assert_eq!(written.0, bundle(&[&new]));
        assert!(retire_patch(&entries[1..], &retired, &kept).is_none());
    }
}
