//! Reading what a fetch is made with from the Secrets an HttpSource names:
//! `spec.secretRef` (credentials), `spec.certSecretRef` (TLS) and
//! `spec.proxySecretRef` (proxy). Only Secrets in the source's own
//! namespace are read, one `get` each (the controller may not list or
//! watch Secrets).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::Client;

use crate::api::{reason, HttpSourceSpec, LocalObjectReference};
use crate::fetch::{self, Auth};
use crate::plan::{Failure, Retry};
use crate::transport::{self, Transport};

/// What the Secrets of a source say.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub auth: Auth,
    pub transport: Transport,
}

fn failure(message: String) -> Failure {
    Failure::new(reason::AUTHENTICATION_FAILED, message, Retry::Backoff)
}

/// The data of Secret `name` in `namespace`.
async fn read(
    client: &Client,
    namespace: &str,
    field: &str,
    secret: &LocalObjectReference,
) -> Result<BTreeMap<String, Vec<u8>>, Failure> {
    let name = &secret.name;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let found = secrets
        .get_opt(name)
        .await
        .map_err(|e| failure(format!("{field}: cannot read secret '{name}': {e}")))?
        .ok_or_else(|| failure(format!("{field}: secret '{name}' not found")))?;
    Ok(found
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect())
}

/// Reads the Secrets `spec` names in `namespace`.
pub async fn read_credentials(
    client: &Client,
    namespace: &str,
    spec: &HttpSourceSpec,
) -> Result<Credentials, Failure> {
    let mut credentials = Credentials::default();
    if let Some(secret) = &spec.secret_ref {
        let data = read(client, namespace, "secretRef", secret).await?;
        credentials.auth = fetch::auth_from_secret(&data)
            .map_err(|m| failure(format!("secretRef: secret '{}': {m}", secret.name)))?;
    }
    if let Some(secret) = &spec.cert_secret_ref {
        let data = read(client, namespace, "certSecretRef", secret).await?;
        credentials.transport.tls = Some(
            transport::tls_from_secret(&data)
                .map_err(|m| failure(format!("certSecretRef: secret '{}': {m}", secret.name)))?,
        );
    }
    if let Some(secret) = &spec.proxy_secret_ref {
        let data = read(client, namespace, "proxySecretRef", secret).await?;
        credentials.transport.proxy = Some(
            transport::proxy_from_secret(&data)
                .map_err(|m| failure(format!("proxySecretRef: secret '{}': {m}", secret.name)))?,
        );
    }
    Ok(credentials)
}
