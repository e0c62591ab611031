//! Every reason openflux writes into an Artifact's `Ready` condition has a
//! row in docs/troubleshooting.md's table of reasons, read from the `reason` module's
//! source so that a new reason without a row fails here.

use std::path::Path;

#[test]
fn every_ready_reason_has_a_row_in_the_troubleshooting_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let api = std::fs::read_to_string(root.join("crates/openflux-api/src/lib.rs")).unwrap();
    let module = api
        .split_once("pub mod reason {")
        .and_then(|(_, rest)| rest.split_once("\n}"))
        .map(|(body, _)| body)
        .expect("crates/openflux-api/src/lib.rs has `pub mod reason`");
    let reasons: Vec<&str> = module
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .filter_map(|l| l.split('"').nth(1))
        // Flux's success reason goes on exported objects, not on Artifacts.
        .filter(|r| *r != openflux::api::reason::SUCCEEDED)
        .collect();
    assert!(reasons.len() >= 6, "read {reasons:?}");
    let page = std::fs::read_to_string(root.join("docs/troubleshooting.md")).unwrap();
    let missing: Vec<&&str> = reasons
        .iter()
        .filter(|r| !page.lines().any(|l| l.starts_with(&format!("| `{r}` |"))))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md has no row for the Ready reasons {missing:?}"
    );
}
