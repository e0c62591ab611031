//! Every test docs/security.md cites exists: each claim there names the
//! test that shows it, as `module::tests::name` (a unit test in `src` or a
//! crate) or `file::name` (an end-to-end test in `tests/`, or in a crate's
//! `tests/`). A renamed or removed test fails here, not in a reader's hands.

use std::path::{Path, PathBuf};

/// The backticked spans of `text` shaped like a test path: lower-case
/// words joined by `::`, at least two of them.
fn cited(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            let parts: Vec<&str> = span.split("::").collect();
            parts.len() >= 2
                && parts.iter().all(|p| {
                    !p.is_empty()
                        && p.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
        })
        .map(str::to_string)
        .collect()
}

/// Every `.rs` file under `dir` (`target` left out).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `source` defines a function `name` (`fn name(`, or `fn name<`).
fn defines(source: &str, name: &str) -> bool {
    source.match_indices(&format!("fn {name}")).any(|(at, m)| {
        source[at + m.len()..]
            .chars()
            .next()
            .is_some_and(|c| c == '(' || c == '<')
    })
}

#[test]
fn every_test_the_security_page_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/security.md")).expect("docs/security.md");
    let names = cited(&page);
    assert!(
        names.len() >= 30,
        "docs/security.md cites only {} tests: {names:?}",
        names.len()
    );
    let mut files = Vec::new();
    for dir in ["src", "tests", "crates"] {
        rust_files(&root.join(dir), &mut files);
    }
    let sources: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            (f, text)
        })
        .collect();
    let mut missing = Vec::new();
    for name in &names {
        let parts: Vec<&str> = name.split("::").collect();
        let function = parts[parts.len() - 1];
        // An end-to-end test is looked for in its own file (or directory).
        let file = parts[0];
        let in_scope = |path: &Path| {
            if !file.starts_with("e2e_") {
                return true;
            }
            path.components()
                .any(|c| c.as_os_str() == file || c.as_os_str() == format!("{file}.rs").as_str())
        };
        let found = sources
            .iter()
            .any(|(path, text)| in_scope(path) && defines(text, function));
        if !found {
            missing.push(name.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/security.md cites tests that do not exist: {missing:?}"
    );
}

#[test]
fn citations_are_read_from_backticks_only() {
    let text = "see `e2e_policy::a_test` and `module::tests::b`, not `RefField::is_stock`, \
                `--flag`, `openflux.dev/x` or `a`";
    assert_eq!(cited(text), ["e2e_policy::a_test", "module::tests::b"]);
    assert!(defines("async fn a_test() {}", "a_test"));
    assert!(!defines("fn a_test_longer() {}", "a_test"));
}
