//! The floors of openflux's library: each top-level module (a folder, or a
//! file standing alone) on a floor, the vocabulary and the watch engine at
//! the bottom, the features above them, the runtime that wires them at the
//! top. An import from one folder into another goes down to a lower floor,
//! never up nor across: what one controller tells another is a value of a
//! floor below both, so no circle of folders can close. A new folder gets
//! its floor here.

use std::collections::{BTreeMap, BTreeSet};

use super::source_layout::{module_graph, CRATES};

/// The floors, ground first; a floor's folders may import those of the
/// floors below it. `api` is the API crate.
const FLOORS: &[&[&str]] = &[
    &["api"],
    &["locks", "shard"],
    &["names", "telemetry"],
    &["vocabulary", "watch"],
    &["certs", "cluster", "index"],
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

/// Which folders import which (a module's folder is its first segment).
fn folder_graph() -> BTreeMap<String, BTreeSet<String>> {
    let openflux = CRATES.iter().find(|c| c.name == "openflux").unwrap();
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, imports) in module_graph(openflux) {
        let from = module.split("::").next().unwrap().to_string();
        let entry = folders.entry(from.clone()).or_default();
        for import in imports {
            let to = import.split("::").next().unwrap().to_string();
            if to != from {
                entry.insert(to);
            }
        }
    }
    folders
}

#[test]
fn imports_between_folders_go_down_a_floor() {
    let graph = folder_graph();
    assert!(graph.len() > 10, "read {} folders", graph.len());
    let mut wrong = Vec::new();
    for folder in graph.keys() {
        if floor_of(folder).is_none() {
            wrong.push(format!("{folder} stands on no floor (add it to FLOORS)"));
        }
    }
    for (from, tos) in &graph {
        for to in tos {
            let (Some(a), Some(b)) = (floor_of(from), floor_of(to)) else {
                continue;
            };
            if b >= a {
                wrong.push(format!("{from} (floor {a}) imports {to} (floor {b})"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
