//! Who the processes of a test act as.
//!
//! On the local control plane openflux runs under a client certificate of
//! its own (`system:serviceaccount:openflux-system:openflux`), bound by
//! exactly the shipped `manifests/rbac.yaml`, so the end-to-end tests prove
//! that RBAC and the admission policy on openflux's exports
//! (`webhook-config/externalartifact-policy.yaml`). A test runs openflux in
//! a namespace of its own and behind a webhook configuration of its own:
//! [`grant_runtime_namespace`] and [`grant_webhook_configuration`] give
//! those the rights the shipped RBAC gives `openflux-system` and the
//! configuration named `openflux`, taken from the same file.
//!
//! Tests that act as someone else (a producer, an intruder) impersonate a
//! ServiceAccount with [`acting_as`]; the test's own client stays the
//! cluster admin.

use std::path::PathBuf;

use serde::Deserialize as _;
use serde_json::{json, Value};

use crate::Env;

/// The user openflux acts as in a cluster (its ServiceAccount).
pub const OPENFLUX_USER: &str = "system:serviceaccount:openflux-system:openflux";

/// The namespace and name of the ServiceAccount [`OPENFLUX_USER`] names.
pub fn openflux_account() -> (&'static str, &'static str) {
    OPENFLUX_USER
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .expect("openflux's user is a ServiceAccount's")
}

/// The namespace the shipped manifests install openflux into.
pub const OPENFLUX_NAMESPACE: &str = "openflux-system";

/// The shipped RBAC of openflux.
const RBAC: &str = include_str!("../../../manifests/rbac.yaml");

/// The documents of the shipped `manifests/rbac.yaml`.
pub fn shipped_rbac() -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(RBAC)
        .map(|doc| Value::deserialize(doc).expect("manifests/rbac.yaml is YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The kubeconfig openflux runs with: on the local control plane its own
/// identity (`e2e/cluster env` prints it as
/// `OPENFLUX_E2E_OPENFLUX_KUBECONFIG`), else the test's kubeconfig (`None`:
/// the `KUBECONFIG` of the environment).
pub fn openflux_kubeconfig(env: &Env) -> Option<PathBuf> {
    env.vars
        .get("OPENFLUX_E2E_OPENFLUX_KUBECONFIG")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| env.kubeconfig.clone())
}

/// A client with exactly the credentials openflux runs with on the local
/// control plane (its client certificate, [`openflux_kubeconfig`]), so the
/// API server authenticates it as [`OPENFLUX_USER`]: RBAC and the admission
/// policies judge it as they judge openflux. Panics where the control plane
/// gives openflux no identity of its own (a cluster of `KUBECONFIG`): a
/// test of openflux's rights cannot run there.
pub async fn openflux_client(env: &Env) -> kube::Client {
    let path = env
        .vars
        .get("OPENFLUX_E2E_OPENFLUX_KUBECONFIG")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .expect("this control plane gives openflux no identity of its own (`e2e/cluster env` printed no OPENFLUX_E2E_OPENFLUX_KUBECONFIG)");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("the kubeconfig {}: {e}", path.display()));
    kube::Client::try_from(config).expect("a client as openflux")
}

/// The shipped Roles of openflux's own namespace (the leader election
/// Lease) and their bindings, placed in `ns`, where a test runs openflux
/// (`--namespace=<ns>`). Removed with the namespace.
pub async fn grant_runtime_namespace(env: &Env, ns: &str) {
    // What each Role grants openflux on any object (a rule without
    // resourceNames): until the authorizer has the bindings, openflux is
    // refused it there.
    let mut granted = Vec::new();
    for mut doc in shipped_rbac() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        if !matches!(kind.as_str(), "Role" | "RoleBinding")
            || doc["metadata"]["namespace"] != OPENFLUX_NAMESPACE
        {
            continue;
        }
        let any_object = doc["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r.get("resourceNames").is_none());
        if let Some(rule) = any_object {
            let first = |field: &str| rule[field][0].as_str().unwrap_or_default().to_string();
            granted.push((first("verbs"), first("apiGroups"), first("resources")));
        }
        doc["metadata"]["namespace"] = json!(ns);
        env.apply(&doc)
            .await
            .unwrap_or_else(|e| panic!("granting openflux its {kind} in {ns}: {e:#}"));
    }
    for (verb, group, resource) in &granted {
        wait_allowed_in(env, openflux_account(), ns, verb, group, resource).await;
    }
}

/// The shipped rule on openflux's MutatingWebhookConfiguration (which
/// names the configuration `openflux`), for the configuration `name`
/// instead: a ClusterRole and ClusterRoleBinding owned by that
/// configuration (`uid`), so they go with it.
pub async fn grant_webhook_configuration(env: &Env, name: &str, uid: &str) {
    let mut rule = shipped_rbac()
        .iter()
        .filter(|doc| doc["kind"] == "ClusterRole" && doc["metadata"]["name"] == "openflux")
        .flat_map(|doc| doc["rules"].as_array().cloned().unwrap_or_default())
        .find(|rule| {
            rule["resources"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("mutatingwebhookconfigurations")))
        })
        .expect("manifests/rbac.yaml grants openflux its MutatingWebhookConfiguration");
    rule["resourceNames"] = json!([name]);
    let owner = json!([{"apiVersion": "admissionregistration.k8s.io/v1",
                        "kind": "MutatingWebhookConfiguration", "name": name, "uid": uid}]);
    let (sa_namespace, sa_name) = openflux_account();
    for doc in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": name, "ownerReferences": owner}, "rules": [rule]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": name, "ownerReferences": owner},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_namespace}]}),
    ] {
        env.apply(&doc).await.unwrap_or_else(|e| {
            panic!("granting openflux the webhook configuration {name}: {e:#}")
        });
    }
}

/// A client acting as ServiceAccount `name` of `ns` (the test's admin
/// impersonates it, with the groups a ServiceAccount token carries).
pub fn acting_as(env: &Env, ns: &str, name: &str) -> kube::Client {
    let mut config = env.config.clone();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:{name}"));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".into(),
    ]);
    kube::Client::try_from(config).expect("an impersonating client")
}

/// Waits until the API server's authorizer lets ServiceAccount `name` of
/// `ns` `verb` the `resource` of `group` in `ns`: a Role or RoleBinding
/// just written reaches the authorizer a moment later, and a request
/// sent before then is refused.
pub async fn wait_allowed(
    env: &Env,
    ns: &str,
    name: &str,
    verb: &str,
    group: &str,
    resource: &str,
) {
    wait_allowed_in(env, (ns, name), ns, verb, group, resource).await;
}

/// [`wait_allowed`] for the ServiceAccount `account` (namespace, name) in
/// namespace `ns`, which may be another than the ServiceAccount's.
pub async fn wait_allowed_in(
    env: &Env,
    account: (&str, &str),
    ns: &str,
    verb: &str,
    group: &str,
    resource: &str,
) {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let (sa_ns, name) = account;
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{sa_ns}:{name}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{sa_ns}"),
                       "system:authenticated"],
            "resourceAttributes": {"namespace": ns, "verb": verb, "group": group,
                                   "resource": resource},
        },
    }))
    .expect("a SubjectAccessReview");
    let reviews: kube::Api<SubjectAccessReview> = kube::Api::all(env.client.clone());
    crate::wait_for(
        &format!("{sa_ns}/{name} allowed to {verb} {resource}.{group} in {ns}"),
        crate::TIMEOUT,
        || async {
            let answered = reviews.create(&Default::default(), &review).await.ok()?;
            answered.status.filter(|s| s.allowed).map(|_| ())
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_rbac_names_openflux_in_its_namespace() {
        let docs = shipped_rbac();
        let (ns, name) = openflux_account();
        assert_eq!(ns, OPENFLUX_NAMESPACE);
        assert!(docs.iter().any(|d| d["kind"] == "ServiceAccount"
            && d["metadata"]["name"] == name
            && d["metadata"]["namespace"] == ns));
        // Every binding names openflux's ServiceAccount.
        for binding in docs
            .iter()
            .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
        {
            assert_eq!(
                binding["subjects"],
                json!([{"kind": "ServiceAccount", "name": name, "namespace": ns}]),
                "{binding}"
            );
        }
        assert!(docs
            .iter()
            .any(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == ns));
    }

    /// openflux's rights on webhook configurations are limited to those
    /// named `openflux`, save `create` (which Kubernetes cannot limit by
    /// name), and it may delete none.
    #[test]
    fn the_shipped_rbac_limits_webhook_configurations_to_openflux() {
        let mut rules = 0;
        for doc in shipped_rbac() {
            for rule in doc["rules"].as_array().into_iter().flatten() {
                if rule["apiGroups"] != json!(["admissionregistration.k8s.io"]) {
                    continue;
                }
                rules += 1;
                let verbs = rule["verbs"].as_array().unwrap();
                assert!(
                    !verbs.contains(&json!("delete")) && !verbs.contains(&json!("*")),
                    "{rule}"
                );
                if verbs == &[json!("create")] {
                    assert!(rule.get("resourceNames").is_none(), "{rule}");
                } else {
                    assert_eq!(rule["resourceNames"], json!(["openflux"]), "{rule}");
                }
            }
        }
        assert!(rules >= 2, "no rule on webhook configurations found");
    }

    /// Every admission policy shipped in webhook-config/ is installed on
    /// the local control planes (so every end-to-end test runs under it)
    /// and is part of what `kubectl apply -k manifests/` applies.
    #[test]
    fn every_shipped_policy_is_installed_everywhere() {
        let root = crate::workspace_root();
        let script = std::fs::read_to_string(root.join("e2e/cluster")).unwrap();
        let kustomization =
            std::fs::read_to_string(root.join("webhook-config/kustomization.yaml")).unwrap();
        let mut policies: Vec<String> = std::fs::read_dir(root.join("webhook-config"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.ends_with("policy.yaml"))
            .collect();
        policies.sort();
        assert!(policies.len() >= 3, "{policies:?}");
        for policy in &policies {
            assert!(
                script.contains(&format!("webhook-config/{policy}")),
                "e2e/cluster does not install {policy}"
            );
            assert!(
                kustomization.contains(&format!("- {policy}")),
                "webhook-config/kustomization.yaml leaves out {policy}"
            );
        }
    }

    /// The policy on openflux's webhook configurations
    /// (`webhook-config/registration-policy.yaml`) lets openflux's identity
    /// create, or write over, only the ValidatingWebhookConfiguration it
    /// publishes, with exactly the entries it ships: its variable `shipped`
    /// is the template's entries (`src/registration/validating.yaml`)
    /// without their clientConfig, and the clientConfig is held to the
    /// template's Service and path. It judges the identity the other
    /// policies judge.
    #[test]
    fn the_policy_on_webhook_configurations_holds_the_shipped_entries() {
        let root = crate::workspace_root();
        let read = |path: &str| -> Vec<Value> {
            let text = std::fs::read_to_string(root.join(path)).unwrap();
            serde_yaml_ng::Deserializer::from_str(&text)
                .map(|doc| Value::deserialize(doc).unwrap())
                .filter(|doc| !doc.is_null())
                .collect()
        };
        let docs = read("webhook-config/registration-policy.yaml");
        let policy = docs
            .iter()
            .find(|d| {
                d["kind"] == "ValidatingAdmissionPolicy"
                    && d["metadata"]["name"] == "openflux-webhook-configurations"
            })
            .expect("the policy openflux-webhook-configurations");
        let variable = |name: &str| -> String {
            policy["spec"]["variables"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .and_then(|v| v["expression"].as_str())
                .unwrap_or_else(|| panic!("no variable {name}"))
                .to_string()
        };
        let template = read("src/registration/validating.yaml").remove(0);
        let mut entries = template["webhooks"].clone();
        let mut services = Vec::new();
        for entry in entries.as_array_mut().unwrap() {
            let config = entry
                .as_object_mut()
                .unwrap()
                .remove("clientConfig")
                .unwrap();
            services.push(config["service"].clone());
        }
        assert_eq!(
            serde_json::from_str::<Value>(&without_dyn(&variable("shipped")))
                .expect("the variable shipped is JSON once its dyn() are taken off"),
            entries,
            "the policy's shipped entries are not src/registration/validating.yaml's"
        );
        let shipped = variable("asShipped");
        for service in services {
            for field in ["namespace", "name", "path"] {
                let value = service[field].as_str().unwrap();
                assert!(
                    shipped.contains(&format!("w.clientConfig.service.{field} == '{value}'")),
                    "{shipped}"
                );
            }
        }
        assert_eq!(
            policy["spec"]["matchConditions"][0]["expression"],
            json!(format!("request.userInfo.username == '{OPENFLUX_USER}'"))
        );
        let exports = docs
            .iter()
            .find(|d| {
                d["kind"] == "ValidatingAdmissionPolicy"
                    && d["metadata"]["name"] == "openflux-export-owners"
            })
            .expect("the policy openflux-export-owners");
        assert_eq!(
            exports["spec"]["matchConditions"],
            policy["spec"]["matchConditions"]
        );
        for binding in docs
            .iter()
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        {
            assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        }
    }

    /// The validating configuration openflux publishes is owned by its
    /// ClusterRole (`src/registration/mod.rs`, `OWNER`), so the garbage
    /// collector deletes it when an uninstall removes that ClusterRole: the
    /// policy on webhook configurations admits that owner and no other
    /// (not the Artifact CRD, which an uninstall keeps), and the shipped
    /// RBAC lets openflux read that ClusterRole (for its uid) and nothing
    /// else of RBAC.
    #[test]
    fn the_validating_configuration_is_owned_by_openfluxs_cluster_role() {
        let root = crate::workspace_root();
        let registration = std::fs::read_to_string(root.join("src/registration/mod.rs")).unwrap();
        let owner = registration
            .lines()
            .find_map(|l| l.strip_prefix("pub const OWNER: &str = \""))
            .and_then(|rest| rest.strip_suffix("\";"))
            .expect("src/registration/mod.rs names the ClusterRole that owns the configuration");
        let docs = shipped_rbac();
        assert!(
            docs.iter()
                .any(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == owner),
            "manifests/rbac.yaml ships no ClusterRole {owner}"
        );
        let rbac_rules: Vec<&Value> = docs
            .iter()
            .flat_map(|d| d["rules"].as_array().into_iter().flatten())
            .filter(|rule| rule["apiGroups"] == json!(["rbac.authorization.k8s.io"]))
            .collect();
        assert_eq!(
            rbac_rules,
            [
                &json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                     "resourceNames": [owner], "verbs": ["get"]})
            ],
            "openflux reads its own ClusterRole and nothing else of RBAC"
        );
        let text =
            std::fs::read_to_string(root.join("webhook-config/registration-policy.yaml")).unwrap();
        let policy = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|doc| Value::deserialize(doc).unwrap())
            .find(|d| {
                d["kind"] == "ValidatingAdmissionPolicy"
                    && d["metadata"]["name"] == "openflux-webhook-configurations"
            })
            .expect("the policy openflux-webhook-configurations");
        let metadata = policy["spec"]["variables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "shippedMetadata")
            .and_then(|v| v["expression"].as_str())
            .expect("the variable shippedMetadata")
            .to_string();
        for held in [
            "size(object.metadata.ownerReferences) == 1".to_string(),
            "o.apiVersion.startsWith('rbac.authorization.k8s.io/')".to_string(),
            "o.kind == 'ClusterRole'".to_string(),
            format!("o.name == '{owner}'"),
        ] {
            assert!(metadata.contains(&held), "{held} not in {metadata}");
        }
        assert!(!metadata.contains("CustomResourceDefinition"), "{metadata}");
    }

    /// `text` (a CEL literal of lists, maps, strings and numbers whose
    /// values are wrapped in `dyn(...)`) with every `dyn(` and its `)` taken
    /// off: outside string literals the literal holds no other parenthesis.
    fn without_dyn(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        let mut in_string = false;
        while let Some(c) = rest.chars().next() {
            if in_string {
                out.push(c);
                if c == '\\' {
                    let escaped = rest[1..].chars().next().unwrap();
                    out.push(escaped);
                    rest = &rest[1 + escaped.len_utf8()..];
                    continue;
                }
                in_string = c != '"';
            } else if let Some(after) = rest.strip_prefix("dyn(") {
                rest = after;
                continue;
            } else if c != ')' {
                in_string = c == '"';
                out.push(c);
            }
            rest = &rest[c.len_utf8()..];
        }
        out
    }
}
