//! Who writes a test's Artifacts: a TestSource (the CRD of
//! [`crate::install_test_source_crd`]) and ServiceAccounts that may write
//! Artifacts, one of them also allowed to speak for the source (update its
//! status, as the source's own controller may), for the trust checks.

use serde_json::{json, Value};

use crate::identity::acting_as;
use crate::openflux::publish;
use crate::{wait_for, Env, TIMEOUT};

/// A TestSource `name` in `ns` of API group `group`; returns its uid.
pub async fn test_source(env: &Env, group: &str, ns: &str, name: &str) -> String {
    let source = env
        .apply(&json!({
            "apiVersion": format!("{group}/v1"), "kind": "TestSource",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"anything": "goes"}
        }))
        .await
        .expect("creating the custom source");
    source.metadata.uid.expect("uid")
}

/// ServiceAccounts `intruder`, who may write Artifacts in `ns`, and
/// `producer`, who may also update the status of the TestSources of
/// `group` (as a source's controller may).
pub async fn intruder_and_producer(env: &Env, group: &str, ns: &str) {
    let artifacts_rule = json!({"apiGroups": ["openflux.dev"], "resources": ["artifacts"],
                               "verbs": ["get", "list", "create", "patch", "update"]});
    let status_rule = json!({"apiGroups": [group], "resources": ["testsources/status"],
                            "verbs": ["update", "patch"]});
    let rbac = "rbac.authorization.k8s.io/v1";
    for (who, rules) in [
        ("intruder", json!([artifacts_rule])),
        ("producer", json!([artifacts_rule, status_rule])),
    ] {
        for obj in [
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": who, "namespace": ns}}),
            json!({"apiVersion": rbac, "kind": "Role",
                   "metadata": {"name": who, "namespace": ns}, "rules": rules}),
            json!({"apiVersion": rbac, "kind": "RoleBinding",
                   "metadata": {"name": who, "namespace": ns},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": who},
                   "subjects": [{"kind": "ServiceAccount", "name": who, "namespace": ns}]}),
        ] {
            env.apply(&obj).await.expect("the writers' RBAC");
        }
        // Acting before the authorizer has the binding would be refused.
        crate::identity::wait_allowed(env, ns, who, "create", "openflux.dev", "artifacts").await;
    }
}

/// Artifact `name` in `ns` with `spec`, owned (as controller) by the
/// TestSource of `group` named `source` whose uid is `uid`.
pub fn owned_artifact(
    group: &str,
    ns: &str,
    name: &str,
    source: &str,
    uid: &str,
    spec: &Value,
) -> Value {
    json!({
        "apiVersion": "openflux.dev/v1alpha1", "kind": "Artifact",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [
            {"apiVersion": format!("{group}/v1"), "kind": "TestSource", "name": source, "uid": uid, "controller": true}]},
        "spec": spec,
    })
}

/// What [`write_as`] writes: Artifact `name` for the TestSource `source`
/// (uid `uid`) of `group`, with `labels`.
pub struct Written<'a> {
    pub group: &'a str,
    pub name: &'a str,
    pub source: &'a str,
    pub uid: &'a str,
    pub labels: Option<Value>,
}

/// ServiceAccount `who` writes the Artifact `what` says, carrying a
/// ConfigMap whose value is `who`.
pub async fn write_as(env: &Env, ns: &str, who: &str, what: Written<'_>) {
    let spec = publish(
        env.fixtures(),
        ns,
        what.name,
        "v1",
        &[("configmap.yaml", &crate::configmap_yaml(who))],
    );
    let mut artifact = owned_artifact(what.group, ns, what.name, what.source, what.uid, &spec);
    if let Some(labels) = what.labels {
        artifact["metadata"]["labels"] = labels;
    }
    let client = acting_as(env, ns, who);
    // RBAC bindings take a moment to apply: retry until written.
    wait_for(
        &format!("{who} to write Artifact {}", what.name),
        TIMEOUT,
        || {
            let client = client.clone();
            let artifact = artifact.clone();
            async move { crate::apply(&client, &artifact).await.ok() }
        },
    )
    .await;
}
