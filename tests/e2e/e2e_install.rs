//! End to end: the install manifests are accepted by a real API server.

use openflux_testkit as support;

use support::cluster;

/// `kubectl apply -k <dir> --dry-run=server` against the test cluster.
fn dry_run_apply(env: &support::Env, dir: &str) -> (bool, String) {
    let out = env.run_kubectl(&["apply", "-k", dir, "--dry-run=server"], None);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_manifests_pass_server_side_dry_run() {
    let env = cluster().await;
    // A real apply creates the namespace first; a dry run does not persist
    // it, so the namespaced objects need it to exist already.
    env.apply(&serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "openflux-system"}
    }))
    .await
    .expect("creating openflux-system");
    for dir in ["manifests/", "manifests/http-source/"] {
        let (ok, text) = dry_run_apply(&env, dir);
        assert!(
            ok,
            "kubectl apply -k {dir} --dry-run=server failed:\n{text}"
        );
        assert!(text.contains("(server dry run)"), "{text}");
    }
    let (_, text) = dry_run_apply(&env, "manifests/");
    for expected in [
        "customresourcedefinition.apiextensions.k8s.io/artifacts.openflux.dev",
        "clusterrole.rbac.authorization.k8s.io/openflux",
        "role.rbac.authorization.k8s.io/openflux-webhook-certs",
        "deployment.apps/openflux",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/openflux",
        "validatingadmissionpolicy.admissionregistration.k8s.io/",
        "poddisruptionbudget.policy/openflux",
        "validatingadmissionpolicy.admissionregistration.k8s.io/openflux-secrets",
        "validatingadmissionpolicy.admissionregistration.k8s.io/openflux-webhook-configurations",
        "validatingadmissionpolicy.admissionregistration.k8s.io/openflux-export-owners",
    ] {
        assert!(text.contains(expected), "{expected} missing from:\n{text}");
    }
}
