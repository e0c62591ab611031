//! The README's compatibility table names tests that exist: every row whose
//! status claims a test (e2e, nodes, unit, render) names at least one, and
//! every test, test binary or file named in its "proven by" column is there.

use std::path::{Path, PathBuf};

/// The rows of the table under `## Compatibility`: (what, status, proven by).
fn rows(readme: &str) -> Vec<(String, String, String)> {
    let section = readme
        .split_once("\n## Compatibility\n")
        .map(|(_, rest)| rest.split("\n## ").next().unwrap_or(rest))
        .expect("README.md has a `## Compatibility` section");
    section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("| ---") && !l.starts_with("| |"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect();
            assert_eq!(cells.len(), 3, "a compatibility row of three cells: {l}");
            (cells[0].clone(), cells[1].clone(), cells[2].clone())
        })
        .collect()
}

/// The backticked items of a cell.
fn quoted(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The files of the integration test binary `name`, or of the module
/// `name` of one, if there is one.
fn binary(root: &Path, name: &str) -> Option<Vec<PathBuf>> {
    for tests in std::iter::once(root.join("tests")).chain(
        std::fs::read_dir(root.join("crates"))
            .ok()?
            .filter_map(|e| Some(e.ok()?.path().join("tests"))),
    ) {
        let file = tests.join(format!("{name}.rs"));
        if file.is_file() {
            return Some(vec![file]);
        }
        let dir = tests.join(name);
        if dir.join("main.rs").is_file() {
            return Some(rust_files(&dir));
        }
        // A module of a test binary (`tests/e2e/e2e_core.rs`).
        for entry in std::fs::read_dir(&tests).into_iter().flatten().flatten() {
            let module = entry.path().join(format!("{name}.rs"));
            if entry.path().join("main.rs").is_file() && module.is_file() {
                return Some(vec![module]);
            }
        }
    }
    None
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            files.push(path);
        }
    }
    files
}

fn defines(files: &[PathBuf], function: &str) -> bool {
    let needle = format!("fn {function}(");
    files.iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .contains(&needle)
    })
}

/// Whether `item` (a test binary, `binary::test`, `module::path::test` of
/// the library, or a path) exists; `current` is the binary named before it
/// in the same cell, which a bare test name belongs to.
fn exists(root: &Path, item: &str, current: &mut Option<Vec<PathBuf>>) -> Result<bool, String> {
    if item.contains('/') {
        return Ok(root.join(item).exists());
    }
    let segments: Vec<&str> = item.split("::").collect();
    if segments.len() == 1 {
        if let Some(files) = binary(root, item) {
            *current = Some(files);
            return Ok(true);
        }
        return match current {
            Some(files) => Ok(defines(files, item)),
            None => Err(format!("`{item}` is no test binary and follows none")),
        };
    }
    let function = segments[segments.len() - 1];
    if let Some(files) = binary(root, segments[0]) {
        let found = defines(&files, function);
        *current = Some(files);
        return Ok(found);
    }
    let module = root.join("src").join(segments[0]);
    let files = if module.is_dir() {
        rust_files(&module)
    } else {
        vec![module.with_extension("rs")]
    };
    Ok(defines(&files, function))
}

#[test]
fn every_test_the_compatibility_table_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let rows = rows(&readme);
    assert!(rows.len() >= 10, "read {} rows", rows.len());
    let mut problems = Vec::new();
    for (what, status, proof) in &rows {
        let claims = ["e2e", "nodes", "unit", "render"]
            .iter()
            .any(|s| status.contains(s));
        if !claims {
            continue;
        }
        let mut current = None;
        let mut named = 0;
        for item in quoted(proof) {
            match exists(root, item, &mut current) {
                Ok(true) => named += 1,
                Ok(false) => problems.push(format!("{what}: `{item}` does not exist")),
                Err(e) => problems.push(format!("{what}: {e}")),
            }
        }
        if named == 0 {
            problems.push(format!("{what} ({status}) names no test"));
        }
    }
    assert!(
        problems.is_empty(),
        "README.md's compatibility table:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_misnamed_test_is_found() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut current = None;
    assert_eq!(exists(root, "e2e_matrix", &mut current), Ok(true));
    assert_eq!(
        exists(root, "flux_2_7_with_default_flags", &mut current),
        Ok(true)
    );
    assert_eq!(exists(root, "no_such_test", &mut current), Ok(false));
    assert_eq!(
        exists(root, "e2e_nodes::no_such_test", &mut current),
        Ok(false)
    );
    assert_eq!(
        exists(
            root,
            "cluster::target::tests::choices_follow_the_cluster",
            &mut None
        ),
        Ok(true)
    );
    assert_eq!(
        exists(root, "cluster::target::tests::nothing", &mut None),
        Ok(false)
    );
    assert!(exists(root, "loose_name", &mut None).is_err());
}
