//! End to end on every Kubernetes line the README names: besides the pinned
//! release (the tests' own control plane), a cell with the newest release
//! the Go module proxy serves and one with the last release of the oldest
//! supported line (`KUBERNETES_NEWEST_LINE`, `KUBERNETES_OLDEST_LINE` in
//! e2e/versions.env), each with the current Flux line. Kubelets are not part
//! of these cells: the nodes cell runs them at the pinned release.
//!
//! Each cell applies the shipped ValidatingAdmissionPolicies when it starts
//! (as the tests' control plane does): on a line that could not compile
//! their CEL the cell would not come up. Then the tests below run there as
//! they run on the tests' own control plane, the ones that exercise every
//! shipped admission object: the mutating webhook's match conditions and
//! rewrite, the validating decisions, the export, consumer, openflux,
//! Secret and registration policies, SourcePolicy, and the export and
//! mirror controllers.

use openflux_testkit as support;
use support::Cell;

/// The cell's API server reports the release e2e/versions.env pins for
/// its line, and `e2e/cluster env` says the same.
async fn runs_its_release(cell: Cell) {
    let env = support::cell(cell).await;
    let versions = std::fs::read_to_string(support::workspace_root().join("e2e/versions.env"))
        .expect("reading e2e/versions.env");
    let value = |name: &str| -> String {
        versions
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("e2e/versions.env sets no {name}"))
            .trim()
            .to_string()
    };
    let line = match cell {
        Cell::KubernetesNewest => value("KUBERNETES_NEWEST_LINE"),
        Cell::KubernetesOldest => value("KUBERNETES_OLDEST_LINE"),
        other => panic!("{other} is not a Kubernetes line's cell"),
    };
    let want = value(&format!("KUBERNETES_{}_VERSION", line.replace('.', "_")));
    let info = env
        .client
        .apiserver_version()
        .await
        .unwrap_or_else(|e| panic!("{cell}: reading /version: {e}"));
    assert_eq!(info.git_version, want, "{cell}: the API server's release");
    assert_eq!(
        format!("v{}.{}", info.major, info.minor.trim_end_matches('+')),
        format!("v{line}"),
        "{cell}: the API server's line"
    );
    assert_eq!(
        env.vars
            .get("OPENFLUX_E2E_KUBERNETES_VERSION")
            .map(String::as_str),
        Some(want.as_str()),
        "{cell}: what `e2e/cluster env` says it runs"
    );
}

/// For each Kubernetes line's cell, a module of tests: the line's release
/// check, then each `NAME = PATH`, `PATH(cell)` being a suite's test body.
macro_rules! on_every_line {
    ($($name:ident = $body:path),+ $(,)?) => {
        on_every_line!(@line newest, Cell::KubernetesNewest, $($name = $body),+);
        on_every_line!(@line oldest, Cell::KubernetesOldest, $($name = $body),+);
    };
    (@line $line:ident, $cell:expr, $($name:ident = $body:path),+) => {
        mod $line {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_runs_its_release() {
                runs_its_release($cell).await;
            }

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $body($cell).await;
                }
            )+
        }
    };
}

on_every_line! {
    // Admission: the mutating webhook's match conditions and rewrite, the
    // validating decisions.
    admission_match_conditions =
        crate::e2e_policy::the_match_conditions_send_openflux_what_the_table_says_on,
    admission_rewrite_and_export =
        crate::e2e_webhook::custom_reference_is_rewritten_deployed_and_reapplied_without_change_on,
    admission_denials = crate::e2e_webhook::denials_name_openflux_and_say_what_to_change_on,
    // Export: the export controller and the stock kustomize-controller.
    export_deployed =
        crate::e2e_core::custom_source_is_exported_and_deployed_by_stock_kustomize_controller_on,
    // Policy: the export policy, openflux's own, the Secret and the
    // registration policies, SourcePolicy.
    policy_exports = crate::e2e_policy::only_openflux_creates_changes_or_deletes_an_export_on,
    policy_openflux_consumers =
        crate::e2e_privilege::openflux_changes_only_the_source_reference_of_a_consumer_on,
    policy_openflux_secrets = crate::e2e_privilege::openflux_writes_no_secret_but_its_certificates_on,
    policy_registration =
        crate::e2e_privilege::openflux_changes_only_the_ca_bundles_of_its_webhook_configurations_on,
    policy_source_policy = crate::e2e_source_policy::tenants_use_only_the_source_kinds_their_policies_allow_however_they_refer_on,
    // Mirror: a GitRepository mirrored, updated and collected.
    mirror_git = crate::e2e_core::git_repository_is_mirrored_updated_and_collected_on,
}
