//! The floors of openflux's library: each top-level module of `src/` (a
//! folder, or a file standing alone) on a floor, the vocabulary and the
//! watch engine at the bottom, the features above them, the runtime that
//! wires them at the top. An import from one folder into another goes down
//! to a lower floor, never up nor across: what one controller tells another
//! is a value of a floor below both. A new folder gets its floor here.
//!
//! Two checks read the same imports (`crate::` paths, groups included, in
//! code that is not a test: comments, strings and `#[cfg(test)]` items and
//! the files they declare left out): every import goes down a floor, and no
//! folders import each other in a loop, however many they are. The second
//! holds without the table, so a loop is named as such even where a floor
//! is missing or wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use super::source_layout::{rust_files, workspace_dir};

/// The floors, ground first; a floor's folders may import those of the
/// floors below it. The API crate (`crate::api`) lies below them all.
const FLOORS: &[&[&str]] = &[
    &["locks", "shard"],
    &["names", "telemetry"],
    &["vocabulary", "watch"],
    &["certs", "cluster", "index", "registration"],
    &["control"],
    &["mirror", "adopt"],
    &["export", "policy"],
    &["rewrite"],
    &["webhook"],
    &["consumers"],
    &["runtime"],
];

fn floor_of(folder: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&folder))
}

/// Where one folder imports another: the first such import found.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Import {
    /// The file, relative to `src/`.
    file: String,
    line: usize,
    /// The line, trimmed.
    text: String,
}

impl fmt::Display for Import {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src/{}:{}: {}", self.file, self.line, self.text)
    }
}

/// Each folder of `src/`, the folders it imports and where.
type Graph = BTreeMap<String, BTreeMap<String, Import>>;

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` with comments and the contents of string and character literals
/// blanked out; lines (and so line numbers) kept.
fn mask(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied();
        // A raw string (r"..", r#".."#, br".."): the number of its hashes.
        let after_ident = i > 0 && is_ident(c[i - 1]);
        let raw = (c[i] == 'r'
            && (!after_ident || (c[i - 1] == 'b' && (i < 2 || !is_ident(c[i - 2])))))
        .then(|| c[i + 1..].iter().take_while(|h| **h == '#').count())
        .filter(|hashes| at(i + 1 + hashes) == Some('"'));
        if c[i] == '/' && at(i + 1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw {
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            out.extend(&c[i..i + 2 + hashes]);
            i += 2 + hashes;
            while i < c.len() && !c[i..].starts_with(&close) {
                out.push(blank(c[i]));
                i += 1;
            }
            out.extend(&close);
            i += close.len();
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                let n = if c[i] == '\\' { 2 } else { 1 };
                for &ch in &c[i..(i + n).min(c.len())] {
                    out.push(blank(ch));
                }
                i += n;
            }
            if i < c.len() {
                out.push('"');
                i += 1;
            }
        } else if c[i] == '\'' && (at(i + 1) == Some('\\') || at(i + 2) == Some('\'')) {
            // A character literal ('x', '\n', '\u{7f}'), not a lifetime.
            out.push('\'');
            i += 1;
            while i < c.len() && c[i] != '\'' {
                let n = if c[i] == '\\' { 2 } else { 1 };
                out.push_str(&" ".repeat(n));
                i += n;
            }
            if i < c.len() {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The end (exclusive, a line index) of the item starting at line `start`
/// of `lines` (masked): its `;`, or the brace that closes its first one.
fn item_end(lines: &[&str], start: usize) -> usize {
    let mut depth = 0usize;
    for (n, line) in lines.iter().enumerate().skip(start) {
        for ch in line.chars() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return n + 1;
                    }
                }
                ';' if depth == 0 => return n + 1,
                _ => {}
            }
        }
    }
    lines.len()
}

/// The name of the module a `mod name;` line declares.
fn declared_module(item: &str) -> Option<&str> {
    let mut words = item.split_whitespace();
    words.find(|w| *w == "mod")?;
    words.next()?.strip_suffix(';')
}

/// A file's code that is not a test, masked (see [`mask`]), one entry a
/// line (a test's lines left empty); and the files of the modules it
/// declares as tests (`#[cfg(test)] mod name;`), relative to `src/`.
fn code_and_test_files(file: &str, text: &str) -> (Vec<String>, Vec<String>) {
    let masked = mask(text);
    let lines: Vec<&str> = masked.lines().collect();
    let original: Vec<&str> = text.lines().collect();
    let path = Path::new(file);
    let dir = path.parent().unwrap_or(Path::new(""));
    let stem = path.file_stem().unwrap_or_default();
    let children = if matches!(path.file_name(), Some(n) if n == "mod.rs" || n == "lib.rs") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    let mut code = vec![String::new(); lines.len()];
    let mut tests = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            code[i] = lines[i].to_string();
            i += 1;
            continue;
        }
        i += 1;
        let mut at_path = None;
        while i < lines.len() && lines[i].trim().starts_with("#[") {
            if lines[i].trim().starts_with("#[path") {
                at_path = original[i].split('"').nth(1).map(|p| dir.join(p));
            }
            i += 1;
        }
        if let Some(name) = lines.get(i).and_then(|l| declared_module(l.trim())) {
            match at_path {
                Some(p) => tests.push(p.display().to_string()),
                None => {
                    tests.push(children.join(format!("{name}.rs")).display().to_string());
                    tests.push(children.join(name).display().to_string() + "/");
                }
            }
            i += 1;
        } else {
            i = item_end(&lines, i);
        }
    }
    (code, tests)
}

/// The first segment of each `crate::` path in `code` (each item of a
/// `crate::{a, b::c}` group), with the line (from 1) it is on.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = code.chars().collect();
    let line_at = |k: usize| c[..k].iter().filter(|ch| **ch == '\n').count() + 1;
    let ident_at = |mut k: usize| {
        let start = k;
        while k < c.len() && is_ident(c[k]) {
            k += 1;
        }
        c[start..k].iter().collect::<String>()
    };
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(offset) = c[i..]
        .windows(7)
        .position(|w| w.iter().copied().eq("crate::".chars()))
    {
        let at = i + offset;
        i = at + 7;
        if at > 0 && is_ident(c[at - 1]) {
            continue;
        }
        if c.get(i) != Some(&'{') {
            found.push((line_at(i), ident_at(i)));
            continue;
        }
        // A group: the first segment of each of its items.
        let mut depth = 0;
        let mut item_start = true;
        while i < c.len() {
            match c[i] {
                '{' => {
                    depth += 1;
                    item_start = depth == 1;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => item_start = true,
                ch if item_start && is_ident(ch) => {
                    found.push((line_at(i), ident_at(i)));
                    item_start = false;
                }
                _ => {}
            }
            i += 1;
        }
    }
    found
}

/// The folders of `src/` (given as its files: path relative to `src/`, and
/// text) and what each imports. The crate roots are no folder.
fn folder_graph(files: &[(String, String)]) -> Graph {
    let folder_of = |file: &str| {
        let top = file.split('/').next().unwrap_or(file);
        top.strip_suffix(".rs").unwrap_or(top).to_string()
    };
    let roots = ["lib.rs", "main.rs"];
    let mut graph: Graph = files
        .iter()
        .filter(|(file, _)| !roots.contains(&file.as_str()))
        .map(|(file, _)| (folder_of(file), BTreeMap::new()))
        .collect();
    let mut code = BTreeMap::new();
    let mut tests = BTreeSet::new();
    for (file, text) in files {
        let (lines, test_files) = code_and_test_files(file, text);
        code.insert(file.clone(), (lines, text));
        tests.extend(test_files);
    }
    for (file, (lines, text)) in &code {
        let is_test = tests
            .iter()
            .any(|t| t == file || (t.ends_with('/') && file.starts_with(t.as_str())));
        if is_test || roots.contains(&file.as_str()) {
            continue;
        }
        let from = folder_of(file);
        for (line, to) in crate_paths(&lines.join("\n")) {
            if to == from || !graph.contains_key(&to) {
                continue;
            }
            let text = text.lines().nth(line - 1).unwrap_or_default().trim();
            let import = Import {
                file: file.clone(),
                line,
                text: text.chars().take(120).collect(),
            };
            graph.get_mut(&from).unwrap().entry(to).or_insert(import);
        }
    }
    graph
}

/// The folders that import each other in a loop: the strongly connected
/// components of more than one folder (Tarjan's), each sorted.
fn loops(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flat_map(|tos| tos.keys()) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

/// Each loop, named by its folders, with one import for each of its edges.
fn describe_loops(graph: &Graph) -> Vec<String> {
    loops(graph)
        .iter()
        .map(|folders| {
            let mut text = format!(
                "a loop of {} folders: {}",
                folders.len(),
                folders.join(", ")
            );
            for from in folders {
                for (to, import) in &graph[from] {
                    if folders.contains(to) {
                        text.push_str(&format!("\n  {from} -> {to}: {import}"));
                    }
                }
            }
            text
        })
        .collect()
}

/// The files of `src/`: path relative to it, and text.
fn source_files() -> Vec<(String, String)> {
    let src = workspace_dir().join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let mut files: Vec<(String, String)> = paths
        .iter()
        .map(|p| {
            let relative = p.strip_prefix(&src).unwrap().display().to_string();
            (relative, std::fs::read_to_string(p).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn imports_between_folders_go_down_a_floor() {
    let graph = folder_graph(&source_files());
    assert!(graph.len() > 10, "read {} folders", graph.len());
    let mut wrong = Vec::new();
    for folder in graph.keys() {
        if floor_of(folder).is_none() {
            wrong.push(format!("{folder} stands on no floor (add it to FLOORS)"));
        }
    }
    for name in FLOORS.iter().flat_map(|floor| floor.iter()) {
        if !graph.contains_key(*name) {
            wrong.push(format!("FLOORS names {name}, which src/ does not have"));
        }
    }
    for (from, tos) in &graph {
        for (to, import) in tos {
            let (Some(a), Some(b)) = (floor_of(from), floor_of(to)) else {
                continue;
            };
            if b >= a {
                wrong.push(format!(
                    "{from} (floor {a}) imports {to} (floor {b}): {import}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the floors (the table is in {}):\n{}",
        file!(),
        wrong.join("\n")
    );
}

#[test]
fn no_folders_import_each_other_in_a_loop() {
    let graph = folder_graph(&source_files());
    assert!(graph.len() > 10, "read {} folders", graph.len());
    let found = describe_loops(&graph);
    assert!(
        found.is_empty(),
        "folders of src/ import each other:\n{}",
        found.join("\n")
    );
}

mod checker {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    }

    /// The old shape: a feature imports the shared context, which imports
    /// the feature's state, through a folder between them.
    const A_LOOP: &[(&str, &str)] = &[
        (
            "lib.rs",
            "pub mod context;\npub mod index;\npub mod mirror;\n",
        ),
        (
            "context.rs",
            "//! The context.\n\nuse crate::index::OwnerIndex;\npub struct Context;\n",
        ),
        (
            "index/mod.rs",
            "use crate::{locks, mirror::plan::fingerprint};\n",
        ),
        ("mirror/mod.rs", "pub mod plan;\n"),
        (
            "mirror/plan.rs",
            "use std::sync::Arc;\n\nfn f(c: &crate::context::Context) {}\n",
        ),
        ("locks.rs", "pub fn lock() {}\n"),
    ];

    #[test]
    fn a_loop_is_named_with_one_import_an_edge() {
        let graph = folder_graph(&files(A_LOOP));
        assert_eq!(
            loops(&graph),
            [vec!["context", "index", "mirror"]],
            "{graph:?}"
        );
        let described = describe_loops(&graph);
        assert_eq!(
            described,
            ["a loop of 3 folders: context, index, mirror\n  \
              context -> index: src/context.rs:3: use crate::index::OwnerIndex;\n  \
              index -> mirror: src/index/mod.rs:1: use crate::{locks, mirror::plan::fingerprint};\n  \
              mirror -> context: src/mirror/plan.rs:3: fn f(c: &crate::context::Context) {}"]
        );
        assert!(graph["index"].contains_key("locks"), "a group's first item");
    }

    #[test]
    fn imports_going_one_way_make_no_loop() {
        let mut list = A_LOOP.to_vec();
        list[1] = ("context.rs", "pub struct Context;\n");
        assert!(loops(&folder_graph(&files(&list))).is_empty());
    }

    #[test]
    fn comments_strings_and_tests_are_no_imports() {
        let list = [
            ("a/mod.rs", "//! See [`crate::b`].\nconst S: &str = \"crate::b\";\nconst R: &str = r#\"crate::b \"{\"#;\nconst C: char = '{';\nfn f<'a>(x: &'a str) {}\n/* crate::b */\n#[cfg(test)]\nmod testing;\n#[cfg(test)]\n#[path = \"a_checks.rs\"]\nmod checks;\n#[cfg(test)]\nfn helper() { let _ = crate::b::x(); }\npub fn g() {}\n#[cfg(test)]\nmod tests {\n    use crate::b::X;\n}\n"),
            ("a/testing.rs", "use crate::b::Y;\n"),
            ("a/a_checks.rs", "use crate::b::Z;\n"),
            ("b/mod.rs", "use crate::a::g;\n"),
        ];
        let graph = folder_graph(&files(&list));
        assert!(graph["a"].is_empty(), "{:?}", graph["a"]);
        assert!(graph["b"].contains_key("a"));
        assert!(loops(&graph).is_empty());
    }

    #[test]
    fn code_after_a_test_item_is_read() {
        let list = [
            ("a/mod.rs", "extern \"C\" {\n    #[cfg(test)]\n    fn probe();\n}\n#[cfg(test)]\npub(crate) mod fake;\nuse crate::b::Y;\n"),
            ("b.rs", "use crate::a::Z;\n"),
        ];
        let graph = folder_graph(&files(&list));
        assert_eq!(graph["a"]["b"].line, 7);
        assert_eq!(loops(&graph), [vec!["a", "b"]]);
    }
}
