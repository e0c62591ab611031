use super::*;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use serde_json::json;

fn target() -> Target {
    Target {
        namespace: "gitops-addons".into(),
        service: "admission-front".into(),
        port: 8443,
    }
}

fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        name: "artifacts.openflux.dev".into(),
        uid: "0b6f3c1e".into(),
        ..Default::default()
    }
}

#[test]
fn every_entry_calls_the_service_port_given_and_spares_its_own_namespace() {
    let config = desired("tenant-rules", &target(), Some(owner())).unwrap();
    assert_eq!(config.metadata.name.as_deref(), Some("tenant-rules"));
    assert_eq!(config.metadata.owner_references, Some(vec![owner()]));
    let webhooks = config.webhooks.unwrap();
    assert_eq!(
        webhooks.len(),
        crate::vocabulary::consumers::CONSUMERS.len()
    );
    for webhook in &webhooks {
        let service = webhook.client_config.service.as_ref().unwrap();
        assert_eq!(
            (
                service.namespace.as_str(),
                service.name.as_str(),
                service.port
            ),
            ("gitops-addons", "admission-front", Some(8443)),
            "{}",
            webhook.name
        );
        assert_eq!(service.path.as_deref(), Some("/validate"));
        assert!(webhook.client_config.ca_bundle.is_none());
        let excluded = webhook
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap();
        assert_eq!(
            excluded[0].values.as_deref(),
            Some(&["kube-system".to_string(), "gitops-addons".to_string()][..])
        );
    }
}

fn slice(port: Option<&str>, ready: &[Option<bool>]) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: ready
            .iter()
            .map(|r| Endpoint {
                addresses: vec!["198.18.0.7".into()],
                conditions: Some(EndpointConditions {
                    ready: *r,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: port.map(str::to_string),
            port: Some(9443),
            ..Default::default()
        }]),
        metadata: Default::default(),
    }
}

#[test]
fn serving_needs_a_ready_endpoint_on_the_named_port() {
    let cases: &[(&[EndpointSlice], bool, &str)] = &[
        (&[], false, "no slices"),
        (
            &[slice(Some("https"), &[Some(true)])],
            false,
            "Pods of an earlier release only",
        ),
        (
            &[slice(Some("validate"), &[])],
            false,
            "the port, no endpoint",
        ),
        (
            &[slice(Some("validate"), &[Some(false)])],
            false,
            "not ready",
        ),
        (
            &[slice(Some("validate"), &[None])],
            true,
            "readiness unknown",
        ),
        (
            &[
                slice(Some("https"), &[Some(true)]),
                slice(Some("validate"), &[Some(false), Some(true)]),
            ],
            true,
            "one ready among others",
        ),
        (&[slice(None, &[Some(true)])], false, "an unnamed port"),
    ];
    for (slices, expected, case) in cases {
        assert_eq!(serving(slices.iter(), "validate"), *expected, "{case}");
    }
}

#[test]
fn the_port_is_found_by_name() {
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "admission-front"},
        "spec": {"ports": [{"name": "https", "port": 443}, {"name": "validate", "port": 8443}]}
    }))
    .unwrap();
    assert_eq!(service_port(&service, "validate"), Some(8443));
    assert_eq!(service_port(&service, "https"), Some(443));
    assert_eq!(service_port(&service, "metrics"), None);
    assert_eq!(service_port(&Service::default(), "validate"), None);
}

/// `config` as the API server would store it: defaults added, a
/// resourceVersion, CA bundles written.
fn stored(
    config: &ValidatingWebhookConfiguration,
    bundle: &[u8],
) -> ValidatingWebhookConfiguration {
    let mut value = serde_json::to_value(config).unwrap();
    value["metadata"]["resourceVersion"] = json!("41");
    value["metadata"]["uid"] = json!("c5b1");
    for webhook in value["webhooks"].as_array_mut().unwrap() {
        webhook["objectSelector"] = json!({});
        webhook["clientConfig"]["caBundle"] = json!(k8s_openapi::ByteString(bundle.to_vec()));
        webhook["rules"][0]["scope"] = json!("Namespaced");
    }
    serde_json::from_value(value).unwrap()
}

#[test]
fn a_missing_configuration_is_created_with_our_bundle() {
    let want = desired("openflux", &target(), Some(owner())).unwrap();
    let Write::Create(config) = plan(None, want, b"OURS") else {
        panic!("not a create");
    };
    for webhook in config.webhooks.unwrap() {
        assert_eq!(webhook.client_config.ca_bundle.unwrap().0, b"OURS");
    }
}

#[test]
fn a_configuration_holding_every_field_is_kept_whatever_its_bundles() {
    let want = desired("openflux", &target(), Some(owner())).unwrap();
    let current = stored(&want, b"ROTATED");
    assert_eq!(plan(Some(&current), want, b"OURS"), Write::Keep);
}

#[test]
fn a_changed_configuration_is_replaced_keeping_its_bundles() {
    let want = desired("openflux", &target(), Some(owner())).unwrap();
    // An earlier build's: another port, and one entry edited by hand.
    let mut earlier = want.clone();
    for webhook in earlier.webhooks.iter_mut().flatten() {
        webhook.client_config.service.as_mut().unwrap().port = Some(443);
    }
    let mut current = stored(&earlier, b"KEPT");
    current.webhooks.as_mut().unwrap()[1]
        .client_config
        .ca_bundle = None;
    let Write::Replace(config) = plan(Some(&current), want.clone(), b"OURS") else {
        panic!("not a replace");
    };
    assert_eq!(config.metadata.resource_version.as_deref(), Some("41"));
    let bundles: Vec<_> = config
        .webhooks
        .iter()
        .flatten()
        .map(|w| w.client_config.ca_bundle.clone().unwrap().0)
        .collect();
    assert_eq!(bundles[0], b"KEPT");
    assert_eq!(bundles[1], b"OURS", "an entry without a bundle gets ours");
    // What it writes then holds.
    assert_eq!(
        plan(Some(&stored(&config, b"KEPT")), want, b"OURS"),
        Write::Keep
    );
}

#[test]
fn a_lost_owner_or_label_is_written_again() {
    let want = desired("openflux", &target(), Some(owner())).unwrap();
    let mut current = stored(&want, b"KEPT");
    current.metadata.owner_references = None;
    assert!(matches!(
        plan(Some(&current), want.clone(), b"OURS"),
        Write::Replace(_)
    ));
    let mut current = stored(&want, b"KEPT");
    current.metadata.labels = None;
    assert!(matches!(
        plan(Some(&current), want, b"OURS"),
        Write::Replace(_)
    ));
}
