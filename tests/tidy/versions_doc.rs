//! e2e/versions.env is the single source of truth for the versions of the
//! local control plane: README.md, CONTRIBUTING.md and docs/*.md must not
//! name another version of a pinned component, and CONTRIBUTING.md names
//! each pinned one. No cluster needed.
//!
//! Every `<NAME>_VERSION=vX.Y.Z` line of versions.env pins the component
//! `<name>` (lower case, `_` as `-`: `KUSTOMIZE_CONTROLLER_VERSION` pins
//! `kustomize-controller`). A mention is the component's name followed by a
//! full version (`kustomize-controller v1.9.5`, `Kubernetes v1.36.3`, `etcd |
//! v3.6.16`); `Kubernetes 1.30` (no patch level) is a version range, not a
//! mention. A pin of an older Flux line, `FLUX_2_7_SOURCE_CONTROLLER_VERSION`,
//! pins `source-controller` too, and one of another Kubernetes line,
//! `KUBERNETES_1_37_VERSION`, pins `kubernetes`: a mention agrees when it
//! names any pinned version of its component.

use openflux_testkit as support;

use std::path::{Path, PathBuf};

/// `(component, version)` pairs of a versions.env text, in file order.
fn pins(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once('=')?;
            let component = name.strip_suffix("_VERSION")?;
            let component = strip_line(component);
            if name.starts_with('#') || component.is_empty() {
                return None;
            }
            let value = value.trim().trim_matches('"').trim_matches('\'');
            Some((
                component.to_ascii_lowercase().replace('_', "-"),
                value.to_string(),
            ))
        })
        .collect()
}

/// `SOURCE_CONTROLLER` for `FLUX_2_7_SOURCE_CONTROLLER`, `KUBERNETES` for
/// `KUBERNETES_1_37`: the component of a pin of another Flux or Kubernetes
/// line.
fn strip_line(component: &str) -> &str {
    let number = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let parts: Vec<&str> = component.splitn(4, '_').collect();
    match parts.as_slice() {
        ["FLUX", major, minor, rest] if number(major) && number(minor) => rest,
        [name, major, minor] if number(major) && number(minor) => name,
        _ => component,
    }
}

/// Strips a leading `v`: `v1.2.3` and `1.2.3` name the same version.
fn bare(version: &str) -> &str {
    version.strip_prefix('v').unwrap_or(version)
}

/// Every version named right after `component` in `line` (case-insensitive,
/// whole words only).
fn versions_after(line: &str, component: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find(component) {
        let start = from + at;
        let end = start + component.len();
        from = end;
        if lower[..start].chars().next_back().is_some_and(word)
            || lower[end..].chars().next().is_some_and(word)
        {
            continue;
        }
        let rest = lower[end..].trim_start_matches(|c: char| " \t|:*`=@".contains(c));
        let rest = rest.strip_prefix('v').unwrap_or(rest);
        let token: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
            .collect();
        let token = token.trim_end_matches(['.', '-']);
        let core: Vec<&str> = token.split('-').next().unwrap_or("").split('.').collect();
        if core.len() == 3
            && core
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        {
            found.push(token.to_string());
        }
    }
    found
}

/// `file:line: text` for each mention in `text` that names no pinned
/// version of its component, and how many mentions named `counted`.
fn check(
    file: &str,
    text: &str,
    pins: &[(String, String)],
    counted: Option<&(String, String)>,
) -> (Vec<String>, usize) {
    let mut wrong = Vec::new();
    let mut agreed = 0;
    let mut components: Vec<&String> = pins.iter().map(|(c, _)| c).collect();
    components.sort();
    components.dedup();
    for (n, line) in text.lines().enumerate() {
        for component in &components {
            let versions: Vec<&str> = pins
                .iter()
                .filter(|(c, _)| c == *component)
                .map(|(_, v)| bare(v))
                .collect();
            for named in versions_after(line, component) {
                if counted.is_some_and(|(c, v)| c == *component && bare(v) == bare(&named)) {
                    agreed += 1;
                }
                if !versions.contains(&bare(&named)) {
                    wrong.push(format!(
                        "{file}:{}: names {component} v{} but e2e/versions.env pins {}: {}",
                        n + 1,
                        bare(&named),
                        versions.join(", "),
                        line.trim()
                    ));
                }
            }
        }
    }
    (wrong, agreed)
}

fn docs(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn docs_name_only_the_pinned_versions() {
    let root = support::workspace_root();
    let env =
        std::fs::read_to_string(root.join("e2e/versions.env")).expect("reading e2e/versions.env");
    let pins = pins(&env);
    for expected in ["kubernetes", "etcd", "kustomize-controller"] {
        assert!(
            pins.iter().any(|(c, _)| c == expected),
            "e2e/versions.env pins no {expected}: {pins:?}"
        );
    }
    let mut wrong = Vec::new();
    for path in docs(&root) {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let name = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let (w, _) = check(&name, &text, &pins, None);
        wrong.extend(w);
        if name == "CONTRIBUTING.md" {
            // The contributors' guide states every pinned version at least once.
            for pin in &pins {
                let (component, pinned) = pin;
                let (_, agreed) = check(&name, &text, &pins, Some(pin));
                assert!(
                    agreed > 0,
                    "CONTRIBUTING.md does not name {component} {pinned} (pinned in e2e/versions.env)"
                );
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "versions in the docs disagree with e2e/versions.env:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn pins_and_mentions_are_found() {
    let pins = pins(
        "# a comment\nKUBERNETES_VERSION=v1.36.3\nKUSTOMIZE_CONTROLLER_VERSION=\"v1.9.5\"\n\
         X_EXTRA_REPLACES=\"a=b@v1\"\n# OLD_VERSION=v0.0.1\nFLUX_2_7_KUSTOMIZE_CONTROLLER_VERSION=v1.7.3\n\
         KUBERNETES_NEWEST_LINE=1.37\nKUBERNETES_1_37_VERSION=v1.37.2\n",
    );
    assert_eq!(
        pins,
        [
            ("kubernetes".to_string(), "v1.36.3".to_string()),
            ("kustomize-controller".to_string(), "v1.9.5".to_string()),
            ("kustomize-controller".to_string(), "v1.7.3".to_string()),
            ("kubernetes".to_string(), "v1.37.2".to_string()),
        ]
    );
    let text = "Kubernetes v1.36.3, kustomize-controller v1.9.6 and\n\
                | kustomize-controller | `v1.9.5` | kustomize-controller v1.7.3\n\
                Kubernetes v1.37.2; Kubernetes 1.30 or later; my-kustomize-controller v9.9.9; kustomize-controller v1.9\n\
                KUBERNETES 1.35.0-rc.1.";
    let (wrong, _) = check("x.md", text, &pins, None);
    let agreed: Vec<usize> = pins
        .iter()
        .map(|pin| check("x.md", text, &pins, Some(pin)).1)
        .collect();
    assert_eq!(agreed, [1, 1, 1, 1], "{wrong:?}");
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert!(
        wrong[0].starts_with("x.md:1: names kustomize-controller v1.9.6"),
        "{wrong:?}"
    );
    assert!(
        wrong[1].starts_with("x.md:4: names kubernetes v1.35.0-rc.1"),
        "{wrong:?}"
    );
}
