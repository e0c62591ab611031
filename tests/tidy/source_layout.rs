//! The shape of the source tree, checked so it cannot drift:
//!
//! - imports point one way: API types, then pure decisions, then the I/O
//!   shells, then the runtime that wires them ([`LAYERS`] says which module
//!   is which, and a new module must be added there);
//! - no module imports another that (directly or not) imports it back;
//! - no source file is longer than [`MAX_LINES`] before its inline tests.
//!
//! Imports are read from the code (`crate::`, `super::`, `self::` and child
//! module paths), comments and tests left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 400;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// The Artifact API and what every module may use.
    Api,
    /// Plain functions from data to data.
    Pure,
    /// Watchers, writers, servers, files.
    Shell,
    /// The wiring of `openflux run`.
    Runtime,
}

/// Every module of the openflux library and its layer.
const LAYERS: &[(&str, Layer)] = &[
    ("api", Layer::Api),
    ("locks", Layer::Api),
    ("index::small_set", Layer::Api),
    ("names", Layer::Pure),
    ("names::identity", Layer::Pure),
    ("vocabulary", Layer::Pure),
    ("vocabulary::consumers", Layer::Pure),
    ("vocabulary::marks", Layer::Pure),
    ("vocabulary::mirrored", Layer::Pure),
    ("vocabulary::uid", Layer::Pure),
    ("index", Layer::Pure),
    ("index::entry", Layer::Pure),
    ("shard", Layer::Pure),
    ("cluster", Layer::Pure),
    ("cluster::target", Layer::Pure),
    ("cluster::evidence", Layer::Pure),
    ("cluster::facts", Layer::Pure),
    ("cluster::listers", Layer::Pure),
    ("consumers", Layer::Pure),
    ("consumers::references", Layer::Pure),
    ("consumers::repoint", Layer::Pure),
    ("mirror::plan", Layer::Pure),
    ("mirror::source", Layer::Pure),
    ("export::plan", Layer::Pure),
    ("export::message", Layer::Pure),
    ("export::events", Layer::Pure),
    ("export::shadow", Layer::Pure),
    ("export::trust", Layer::Pure),
    ("adopt::plan", Layer::Pure),
    ("certs::material", Layer::Pure),
    ("certs::retire", Layer::Pure),
    ("certs::rotation", Layer::Pure),
    ("certs::stored", Layer::Pure),
    ("runtime::router", Layer::Pure),
    ("webhook::review", Layer::Pure),
    ("rewrite::admission::prune", Layer::Pure),
    ("webhook::review::encode", Layer::Pure),
    ("webhook::answer", Layer::Pure),
    ("rewrite", Layer::Pure),
    ("rewrite::decision", Layer::Pure),
    ("rewrite::refs", Layer::Pure),
    ("rewrite::destination", Layer::Pure),
    ("rewrite::testing", Layer::Pure),
    ("rewrite::mutate", Layer::Pure),
    ("rewrite::admission", Layer::Pure),
    ("rewrite::writer", Layer::Pure),
    ("rewrite::validate", Layer::Pure),
    ("registration::configuration", Layer::Pure),
    ("policy", Layer::Pure),
    ("policy::candidates", Layer::Pure),
    ("telemetry", Layer::Shell),
    ("control", Layer::Shell),
    ("control::memo", Layer::Shell),
    ("control::looks", Layer::Shell),
    ("cluster::survey", Layer::Shell),
    ("cluster::gate", Layer::Shell),
    ("consumers::controller", Layer::Shell),
    ("consumers::controller::repointer", Layer::Shell),
    ("consumers::controller::wake", Layer::Shell),
    ("mirror", Layer::Shell),
    ("mirror::backlog", Layer::Shell),
    ("mirror::runner", Layer::Shell),
    ("mirror::store", Layer::Shell),
    ("mirror::wake", Layer::Shell),
    ("export", Layer::Shell),
    ("export::verify", Layer::Shell),
    ("export::census", Layer::Shell),
    ("export::write", Layer::Shell),
    ("export::release", Layer::Shell),
    ("export::request", Layer::Shell),
    ("export::retire", Layer::Shell),
    ("export::status", Layer::Shell),
    ("export::series", Layer::Shell),
    ("export::wake", Layer::Shell),
    ("adopt", Layer::Shell),
    ("certs", Layer::Shell),
    ("certs::keeper", Layer::Shell),
    ("certs::command", Layer::Shell),
    ("certs::secret", Layer::Shell),
    ("certs::renew", Layer::Shell),
    ("webhook", Layer::Shell),
    ("webhook::large", Layer::Shell),
    ("webhook::metrics", Layer::Shell),
    ("webhook::server", Layer::Shell),
    ("webhook::drain", Layer::Shell),
    ("webhook::connection", Layer::Shell),
    ("webhook::limits", Layer::Shell),
    ("certs::cabundle", Layer::Shell),
    ("registration", Layer::Shell),
    ("webhook::refused", Layer::Shell),
    ("watch", Layer::Shell),
    ("watch::backoff", Layer::Pure),
    ("watch::change", Layer::Pure),
    ("watch::fake_api", Layer::Shell),
    ("watch::decoded", Layer::Shell),
    ("watch::depth", Layer::Pure),
    ("watch::retry", Layer::Shell),
    ("watch::run", Layer::Shell),
    ("watch::streaming", Layer::Shell),
    ("runtime::hub", Layer::Shell),
    ("runtime::process", Layer::Runtime),
    ("policy::watch", Layer::Shell),
    ("runtime::wakes", Layer::Shell),
    ("runtime", Layer::Runtime),
    ("runtime::allocator", Layer::Runtime),
    ("runtime::flags", Layer::Runtime),
    ("runtime::controllers", Layer::Runtime),
    ("runtime::controllers::dispatch", Layer::Runtime),
];

/// A crate of the workspace: where its code is, and the layer of each of
/// its modules.
pub(crate) struct Crate {
    pub(crate) name: &'static str,
    dir: &'static str,
    layers: &'static [(&'static str, Layer)],
    /// Names the crate's code uses as modules that are not its files (a
    /// re-exported crate).
    external: &'static [&'static str],
}

pub(crate) const CRATES: &[Crate] = &[
    Crate {
        name: "openflux",
        dir: ".",
        layers: LAYERS,
        external: &["api"],
    },
    Crate {
        name: "openflux-api",
        dir: "crates/openflux-api",
        layers: API_LAYERS,
        external: &[],
    },
    Crate {
        name: "openflux-http-source",
        dir: "crates/openflux-http-source",
        layers: HTTP_SOURCE_LAYERS,
        external: &[],
    },
    Crate {
        name: "openflux-testkit",
        dir: "crates/openflux-testkit",
        layers: TESTKIT_LAYERS,
        external: &[],
    },
];

/// The modules of the Artifact API crate and their layers.
const API_LAYERS: &[(&str, Layer)] = &[
    ("conditions", Layer::Api),
    ("duration", Layer::Api),
    ("timestamp", Layer::Api),
    ("policy", Layer::Api),
    ("runtime::id", Layer::Api),
    ("runtime::retry", Layer::Pure),
    ("runtime::panics", Layer::Pure),
    ("producer::digest", Layer::Pure),
    ("producer::testutil", Layer::Pure),
    ("runtime::selector", Layer::Pure),
    ("runtime::flags", Layer::Pure),
    ("runtime::leader::record", Layer::Pure),
    ("producer", Layer::Shell),
    ("producer::archive", Layer::Shell),
    ("producer::unpack", Layer::Shell),
    ("producer::storage", Layer::Shell),
    ("producer::publish", Layer::Shell),
    ("runtime", Layer::Shell),
    ("runtime::events", Layer::Shell),
    ("runtime::events::notifier", Layer::Shell),
    ("runtime::health", Layer::Shell),
    ("runtime::leader", Layer::Shell),
    ("runtime::leader::store", Layer::Shell),
    ("runtime::leader::sim", Layer::Shell),
    ("runtime::logging", Layer::Shell),
    ("runtime::metrics", Layer::Shell),
    ("runtime::metrics::labels", Layer::Api),
    ("spiffe::ids", Layer::Pure),
    ("spiffe::flags", Layer::Pure),
    ("spiffe", Layer::Shell),
    ("spiffe::tls", Layer::Shell),
    ("spiffe::serve", Layer::Shell),
];

/// The modules of the HttpSource controller and their layers.
const HTTP_SOURCE_LAYERS: &[(&str, Layer)] = &[
    ("api", Layer::Api),
    ("archive", Layer::Pure),
    ("credentials", Layer::Pure),
    ("fetch", Layer::Pure),
    ("heal", Layer::Pure),
    ("netpolicy", Layer::Pure),
    ("plan", Layer::Pure),
    ("redact", Layer::Pure),
    ("redirect", Layer::Pure),
    ("schedule", Layer::Pure),
    ("status", Layer::Pure),
    ("transport", Layer::Pure),
    ("metrics", Layer::Shell),
    ("guard", Layer::Shell),
    ("http", Layer::Shell),
    ("serve", Layer::Shell),
    ("context", Layer::Shell),
    ("artifact", Layer::Shell),
    ("report", Layer::Shell),
    ("workers", Layer::Shell),
    ("reconcile", Layer::Shell),
    ("controller", Layer::Runtime),
];

/// The modules of the test kit and their layers.
const TESTKIT_LAYERS: &[(&str, Layer)] = &[
    ("wait", Layer::Api),
    ("turns", Layer::Api),
    ("references", Layer::Pure),
    ("namespace", Layer::Shell),
    ("objects", Layer::Shell),
    ("identity", Layer::Shell),
    ("fixtures", Layer::Shell),
    ("openflux", Layer::Shell),
    ("operator", Layer::Shell),
    ("proxy", Layer::Shell),
    ("release", Layer::Shell),
    ("webhook", Layer::Shell),
    ("exports", Layer::Shell),
    ("writers", Layer::Shell),
    ("cells", Layer::Shell),
    ("nodes", Layer::Shell),
    ("pods", Layer::Shell),
    ("spire", Layer::Shell),
];

pub(crate) fn workspace_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file before its inline tests, without comment lines.
fn code_before_tests(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .collect()
}

/// The module a file of `src/` holds: `None` for the crate roots and for
/// test modules kept in their own files.
fn module_of(relative: &Path) -> Option<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop()?;
    if file == "tests.rs" || file.ends_with("_tests.rs") {
        return None;
    }
    if parts.is_empty() && (file == "lib.rs" || file == "main.rs") {
        return None;
    }
    if file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_string());
    }
    Some(parts.join("::"))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in `code` (`a::b::c`, with `a::{b, c::d}` groups expanded),
/// as its segments.
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_path =
            is_ident(chars[i]) && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'));
        if starts_path {
            i = read_path(&chars, i, Vec::new(), &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads the path at `i` (after `prefix`), pushes what it names, and
/// returns where it ends.
fn read_path(
    chars: &[char],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut segments = prefix;
    loop {
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        if i > start {
            segments.push(chars[start..i].iter().collect());
        }
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i += 2;
            if chars.get(i) == Some(&'{') {
                i += 1;
                loop {
                    while chars.get(i).is_some_and(|c| c.is_whitespace() || *c == ',') {
                        i += 1;
                    }
                    match chars.get(i) {
                        None => return i,
                        Some('}') => return i + 1,
                        _ => i = read_path(chars, i, segments.clone(), out),
                    }
                }
            }
            continue;
        }
        if segments.len() > 1 {
            out.push(segments);
        }
        return i;
    }
}

/// The modules `module`'s code refers to.
fn imports(module: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let own: Vec<&str> = module.split("::").collect();
    let parent = &own[..own.len() - 1];
    let mut found = BTreeSet::new();
    for path in paths(code) {
        let mut absolute: Vec<String> = match path[0].as_str() {
            "crate" => Vec::new(),
            "super" => parent.iter().map(|s| s.to_string()).collect(),
            "self" => own.iter().map(|s| s.to_string()).collect(),
            child if known.contains(&format!("{module}::{child}")) => {
                own.iter().map(|s| s.to_string()).collect()
            }
            _ => continue,
        };
        let rest = if matches!(path[0].as_str(), "crate" | "super" | "self") {
            &path[1..]
        } else {
            &path[..]
        };
        absolute.extend(rest.iter().cloned());
        let target = (1..=absolute.len())
            .rev()
            .map(|n| absolute[..n].join("::"))
            .find(|candidate| known.contains(candidate));
        if let Some(target) = target {
            if target != module {
                found.insert(target);
            }
        }
    }
    found
}

/// The library's modules and what each imports.
pub(crate) fn module_graph(krate: &Crate) -> BTreeMap<String, BTreeSet<String>> {
    let src = workspace_dir().join(krate.dir).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut code = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap().to_path_buf();
        let Some(module) = module_of(&relative) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<String> = code_before_tests(&text)
            .into_iter()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(str::to_string)
            .collect();
        code.insert(module, lines.join("\n"));
    }
    let mut known: BTreeSet<String> = code.keys().cloned().collect();
    known.extend(krate.external.iter().map(|m| m.to_string()));
    code.iter()
        .map(|(module, text)| (module.clone(), imports(module, text, &known)))
        .collect()
}

fn layer(krate: &Crate, module: &str) -> Option<Layer> {
    krate
        .layers
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, l)| *l)
}

#[test]
fn imports_point_from_the_runtime_down_to_the_api() {
    let mut wrong = Vec::new();
    for krate in CRATES {
        let graph = module_graph(krate);
        assert!(
            graph.len() >= 5,
            "{}: read {} modules",
            krate.name,
            graph.len()
        );
        let layer_of = |module: &str| {
            layer(krate, module).or_else(|| krate.external.contains(&module).then_some(Layer::Api))
        };
        for module in graph.keys() {
            if layer_of(module).is_none() {
                wrong.push(format!("{}: module {module} has no layer", krate.name));
            }
        }
        for (module, targets) in &graph {
            for target in targets {
                if let (Some(from), Some(to)) = (layer_of(module), layer_of(target)) {
                    if to > from {
                        wrong.push(format!(
                            "{}: {module} ({from:?}) imports {target} ({to:?})",
                            krate.name
                        ));
                    }
                }
            }
        }
        // Every layered module exists, so the tables do not rot.
        for (module, _) in krate.layers {
            if !graph.contains_key(*module) && !krate.external.contains(module) {
                wrong.push(format!("{}: {module} has a layer but no file", krate.name));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering (the tables are in {}):\n{}",
        file!(),
        wrong.join("\n")
    );
}

#[test]
fn no_module_imports_itself_through_others() {
    // Depth-first search keeping the path, so a circle is reported as such.
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut circle = path[at..].to_vec();
            circle.push(module.to_string());
            return Some(circle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(module.to_string());
        None
    }
    let mut circles = Vec::new();
    for krate in CRATES {
        let graph = module_graph(krate);
        let mut done = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for module in graph.keys() {
            if let Some(circle) = visit(module, &graph, &mut Vec::new(), &mut done) {
                // One report a circle, whichever module it was entered from.
                let mut members = circle[1..].to_vec();
                members.sort();
                if seen.insert(members) {
                    circles.push(format!("{}: {}", krate.name, circle.join(" -> ")));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules import each other:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_checker_reads_imports_as_rust_does() {
    let known: BTreeSet<String> = [
        "api",
        "index",
        "webhook",
        "webhook::review",
        "webhook::decision",
        "webhook::rewrite",
        "webhook::rewrite::refs",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let code = "use super::decision::{Decision, Options};\nuse crate::{index::OwnerIndex, api};\nmod refs;\nuse refs::locate;\nlet x = review::parse(b);\nuse self::refs::Located;";
    let found = imports("webhook::rewrite", code, &known);
    let found: Vec<&str> = found.iter().map(String::as_str).collect();
    assert_eq!(
        found,
        [
            "api",
            "index",
            "webhook::decision",
            "webhook::rewrite::refs"
        ]
    );
}

#[test]
fn no_source_file_is_too_long_before_its_tests() {
    let root = workspace_dir();
    let mut files = Vec::new();
    for krate in CRATES {
        rust_files(&root.join(krate.dir).join("src"), &mut files);
    }
    rust_files(&root.join("benches"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter(|file| {
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            // Test modules in their own files are tests from their first line.
            name != "tests.rs" && !name.ends_with("_tests.rs")
        })
        .filter_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            let lines = code_before_tests(&text).len();
            (lines > MAX_LINES).then(|| format!("{}: {lines} lines", file.display()))
        })
        .collect();
    assert!(files.len() > 30, "read {} files", files.len());
    assert!(
        long.is_empty(),
        "longer than {MAX_LINES} lines before the tests:\n{}",
        long.join("\n")
    );
}
