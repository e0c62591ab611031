//! The webhook configurations of a test's own: the shipped local mutating
//! and validating ones, pointed at the test's openflux and limited to the
//! test's namespace, and deleted when dropped, so tests never see each
//! other's webhooks.

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, DeleteParams};
use serde_json::{json, Value};

use crate::Env;

const LOCAL_WEBHOOK: &str = include_str!("../../../webhook-config/local/mutating-webhook.yaml");
const LOCAL_VALIDATING: &str =
    include_str!("../../../webhook-config/local/validating-webhook.yaml");

/// The test's Mutating- and ValidatingWebhookConfiguration (one name),
/// deleted on drop.
pub struct Webhook {
    pub name: String,
    config: kube::Config,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let (config, name) = (self.config.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    // The client spawns its buffer task: inside the runtime.
                    let Ok(client) = kube::Client::try_from(config) else {
                        return;
                    };
                    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
                    let _ = tokio::time::timeout(
                        Duration::from_secs(10),
                        api.delete(&name, &DeleteParams::default()),
                    )
                    .await;
                    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
                    let _ = tokio::time::timeout(
                        Duration::from_secs(10),
                        api.delete(&name, &DeleteParams::default()),
                    )
                    .await;
                });
            }
        })
        .join();
    }
}

/// Applies the shipped local webhook configuration as `<prefix>-<ns>`,
/// pointed at `addr` and limited to namespace `ns`, and lets openflux's
/// identity keep it as the shipped RBAC lets it keep `openflux`.
pub async fn local_webhook(env: &Env, prefix: &str, ns: &str, addr: SocketAddr) -> Webhook {
    local_webhook_selecting(env, prefix, ns, addr, None).await
}

/// [`local_webhook`] for only the objects `object_selector` (a label
/// selector) selects, when given: several configurations in one namespace,
/// each calling its own openflux.
pub async fn local_webhook_selecting(
    env: &Env,
    prefix: &str,
    ns: &str,
    addr: SocketAddr,
    object_selector: Option<Value>,
) -> Webhook {
    let mut config: Value = serde_yaml_ng::from_str(LOCAL_WEBHOOK).expect("local webhook YAML");
    let name = format!("{prefix}-{ns}");
    config["metadata"]["name"] = json!(name);
    for webhook in config["webhooks"].as_array_mut().expect("webhooks") {
        webhook["clientConfig"]["url"] = json!(format!("https://{addr}/mutate"));
        webhook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
        if let Some(selector) = &object_selector {
            webhook["objectSelector"] = selector.clone();
        }
    }
    let applied = env
        .apply(&config)
        .await
        .expect("creating the webhook configuration");
    let mut validating: Value =
        serde_yaml_ng::from_str(LOCAL_VALIDATING).expect("local validating webhook YAML");
    validating["metadata"]["name"] = json!(name);
    for webhook in validating["webhooks"].as_array_mut().expect("webhooks") {
        webhook["clientConfig"]["url"] = json!(format!("https://{addr}/validate"));
        webhook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    }
    env.apply(&validating)
        .await
        .expect("creating the validating webhook configuration");
    let uid = applied
        .metadata
        .uid
        .expect("the webhook configuration's uid");
    crate::identity::grant_webhook_configuration(env, &name, &uid).await;
    Webhook {
        name,
        config: env.config.clone(),
    }
}

/// Starts `openflux run` for namespace `ns` (plus `extra` flags) with its
/// webhook on a free port behind a configuration of its own, and waits until
/// the CA bundle is in both configurations.
pub async fn openflux_with_webhook(
    env: &Env,
    ns: &str,
    extra: &[&str],
) -> (crate::openflux::Openflux, Webhook) {
    let addr = crate::openflux::free_addr();
    let webhook = local_webhook(env, "openflux-e2e", ns, addr).await;
    let mut args = vec![
        "--watch-all-namespaces=false".to_string(),
        format!("--namespace={ns}"),
        format!("--webhook-addr={addr}"),
        format!("--webhook-configuration={}", webhook.name),
        // The webhook records every Artifact's writer: check it.
        "--verify-artifact-writers=true".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let of = crate::openflux::Openflux::start(env, ns, &args).await;
    let api: Api<MutatingWebhookConfiguration> = Api::all(env.client.clone());
    crate::wait_for(
        "the CA bundle in the webhook configuration",
        crate::TIMEOUT,
        || async {
            let config = api.get_opt(&webhook.name).await.ok().flatten()?;
            config
                .webhooks?
                .iter()
                .all(|w| w.client_config.ca_bundle.is_some())
                .then_some(())
        },
    )
    .await;
    let api: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    crate::wait_for(
        "the CA bundle in the validating webhook configuration",
        crate::TIMEOUT,
        || async {
            let config = api.get_opt(&webhook.name).await.ok().flatten()?;
            config
                .webhooks?
                .iter()
                .all(|w| w.client_config.ca_bundle.is_some())
                .then_some(())
        },
    )
    .await;
    (of, webhook)
}
