//! The repository's workflows (.github/workflows) against what they build
//! on: the release workflow runs `make release` and `make publish` with the
//! project's key from its secrets and attaches what a user downloads and
//! verifies to a GitHub Release; the pull-request workflow runs make
//! targets and test targets that exist; the docs print the project's key
//! and verify with it.

use std::path::Path;

use openflux_testkit as support;
use serde_json::Value;

/// `.github/workflows/<name>` as JSON values.
fn workflow(name: &str) -> Value {
    let path = support::workspace_root()
        .join(".github/workflows")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `run:` script of every job's steps, in order.
fn scripts(workflow: &Value) -> Vec<String> {
    workflow["jobs"]
        .as_object()
        .expect("jobs")
        .values()
        .flat_map(|job| job["steps"].as_array().cloned().unwrap_or_default())
        .filter_map(|step| step["run"].as_str().map(str::to_string))
        .collect()
}

/// The targets of the Makefile (`name:` at the start of a line).
fn make_targets() -> Vec<String> {
    let text = std::fs::read_to_string(support::workspace_root().join("Makefile"))
        .expect("reading the Makefile");
    text.lines()
        .filter(|l| !l.starts_with(['\t', '#', '.', ' ']))
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, rest)| !name.contains(['=', '$', ' ']) && !rest.starts_with('='))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// `make <target>` in `script`: every target named.
fn make_calls(script: &str) -> Vec<String> {
    let words: Vec<&str> = script.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "make")
        .map(|w| w[1].to_string())
        .collect()
}

/// A test target of the workspace named `name`: tests/<name>.rs,
/// tests/<name>/main.rs, or one a manifest declares.
fn test_target_exists(name: &str) -> bool {
    let root = support::workspace_root();
    let declared = |dir: &Path| {
        dir.join(format!("tests/{name}.rs")).exists()
            || dir.join(format!("tests/{name}/main.rs")).exists()
            || std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|t| t.contains(&format!("name = \"{name}\"")))
    };
    declared(&root)
        || std::fs::read_dir(root.join("crates"))
            .expect("crates/")
            .any(|e| declared(&e.expect("an entry").path()))
}

#[test]
fn the_release_workflow_signs_with_the_projects_key_and_attaches_what_users_verify() {
    let release = workflow("release.yml");
    let trigger = &release["on"]["push"]["tags"];
    assert!(
        trigger.as_array().is_some_and(|t| t
            .iter()
            .any(|t| t.as_str().is_some_and(|t| t.starts_with('v')))),
        "the release workflow runs on a version tag: {trigger}"
    );
    assert_eq!(
        release["permissions"]["contents"], "write",
        "creating a GitHub Release needs contents: write"
    );
    let job = &release["jobs"]["release"];
    let env = &job["env"];
    // The key comes from the secret COSIGN_KEY (through cosign's env://),
    // its password from COSIGN_PASSWORD.
    let key = env["COSIGN_KEY"]
        .as_str()
        .expect("COSIGN_KEY in the job's env");
    let key_var = key
        .strip_prefix("env://")
        .unwrap_or_else(|| panic!("COSIGN_KEY is {key:?}, not env://VAR"));
    assert_eq!(
        env[key_var], "${{ secrets.COSIGN_KEY }}",
        "the key's variable"
    );
    assert_eq!(env["COSIGN_PASSWORD"], "${{ secrets.COSIGN_PASSWORD }}");
    for forbidden in [
        "TEST_BUILD",
        "SIGN",
        "ALLOW_DIRTY",
        "NO_CARGO",
        "QUICK_CROSS",
    ] {
        assert!(
            env.get(forbidden).is_none(),
            "a release sets no {forbidden}"
        );
    }

    let scripts = scripts(&release);
    let all = scripts.join("\n");
    for forbidden in [
        "TEST_BUILD",
        "SIGN=0",
        "ALLOW_DIRTY",
        "NO_CARGO",
        "QUICK_CROSS",
    ] {
        assert!(
            !all.contains(forbidden),
            "a release runs with no {forbidden}"
        );
    }
    let order: Vec<usize> = [
        "make release",
        "make publish",
        "verify-signature",
        "gh release create",
    ]
    .iter()
    .map(|what| {
        scripts
            .iter()
            .position(|s| s.contains(what))
            .unwrap_or_else(|| panic!("the release workflow runs no {what}"))
    })
    .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "release, publish, verify, then the GitHub Release: {order:?}"
    );
    let targets = make_targets();
    for called in scripts.iter().flat_map(|s| make_calls(s)) {
        assert!(targets.contains(&called), "make {called}: no such target");
    }
    // The bundle is checked against the repository's own cosign.pub.
    let verify = &scripts[order[2]];
    assert!(
        verify.contains("--blob cosign.pub") && verify.contains("SHA256SUMS.sig"),
        "SHA256SUMS.sig verified with the repository's cosign.pub: {verify}"
    );
    let create = &scripts[order[3]];
    for file in [
        "install.yaml",
        "openflux-$VERSION.tgz",
        "SHA256SUMS\"",
        "SHA256SUMS.sig",
        "cosign.pub",
    ] {
        assert!(
            create.contains(file),
            "the GitHub Release has {file} attached: {create}"
        );
    }
    // release/release writes what is attached.
    let release_script = std::fs::read_to_string(support::workspace_root().join("release/release"))
        .expect("reading release/release");
    for written in [
        "$dist/SHA256SUMS.sig",
        "$dist/cosign.pub",
        "$dist/install.yaml",
        "openflux-$version.tgz",
    ] {
        assert!(
            release_script.contains(written),
            "release/release writes no {written}"
        );
    }
    assert!(
        support::workspace_root().join("cosign.pub").exists(),
        "the project's public key, cosign.pub, is at the repository's root"
    );
}

#[test]
fn the_pull_request_workflow_runs_targets_that_exist() {
    let pr = workflow("pull-request.yml");
    assert!(
        pr["on"].get("pull_request").is_some(),
        "the workflow runs on pull requests: {}",
        pr["on"]
    );
    let scripts = scripts(&pr);
    let all = scripts.join("\n");
    let targets = make_targets();
    let called: Vec<String> = scripts.iter().flat_map(|s| make_calls(s)).collect();
    for target in &called {
        assert!(targets.contains(target), "make {target}: no such target");
    }
    for wanted in ["lint", "chart-check", "crate-check"] {
        assert!(
            called.iter().any(|c| c == wanted),
            "the pull-request workflow runs make {wanted}"
        );
    }
    let words: Vec<&str> = all.split_whitespace().collect();
    let tests: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--test")
        .map(|w| w[1])
        .collect();
    for wanted in ["webhook", "tidy", "e2e_images"] {
        assert!(
            tests.contains(&wanted),
            "the pull-request workflow runs --test {wanted}"
        );
    }
    for test in &tests {
        assert!(
            test_target_exists(test),
            "--test {test}: no such test target"
        );
    }
    assert!(
        all.contains("--lib --bins"),
        "the pull-request workflow runs the unit tests"
    );
    // The e2e_images tests it runs are the ones that need no image and no
    // root, and its filters name modules of this binary.
    for filter in ["dockerfile::", "workflows::"] {
        assert!(all.contains(filter), "e2e_images filtered to {filter}");
    }
    assert!(
        !called
            .iter()
            .any(|c| c == "test" || c == "test-nodes" || c == "images"),
        "the full make test and the images build need root and the local control plane"
    );
    // One toolchain for both workflows.
    let toolchain = |scripts: &[String]| {
        scripts
            .iter()
            .find_map(|s| s.split("rustup default ").nth(1))
            .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
    };
    let release = scripts_of("release.yml");
    assert_eq!(
        toolchain(&scripts),
        toolchain(&release),
        "the pull-request and the release workflows install the same Rust"
    );
    assert!(
        toolchain(&scripts).is_some(),
        "a Rust toolchain is installed"
    );
}

fn scripts_of(name: &str) -> Vec<String> {
    scripts(&workflow(name))
}

/// The public key docs/release.md prints is the repository's cosign.pub,
/// and docs/install.md verifies with it, by name, offline.
#[test]
fn the_docs_print_and_verify_with_the_projects_key() {
    let root = support::workspace_root();
    let key = std::fs::read_to_string(root.join("cosign.pub")).expect("reading cosign.pub");
    assert!(
        key.starts_with("-----BEGIN PUBLIC KEY-----\n")
            && key.trim_end().ends_with("-----END PUBLIC KEY-----"),
        "cosign.pub is a PEM public key"
    );
    let release = std::fs::read_to_string(root.join("docs/release.md")).expect("docs/release.md");
    assert!(
        release.contains(&format!("```text\n{key}```\n")),
        "docs/release.md prints cosign.pub as it is"
    );
    let install = std::fs::read_to_string(root.join("docs/install.md")).expect("docs/install.md");
    for command in [
        "cosign verify-blob --key cosign.pub --signature SHA256SUMS.sig --insecure-ignore-tlog SHA256SUMS",
        "sha256sum --ignore-missing -c SHA256SUMS",
        "cosign verify --key cosign.pub --insecure-ignore-tlog",
    ] {
        assert!(
            install.contains(command),
            "docs/install.md verifies with {command:?}"
        );
    }
}
