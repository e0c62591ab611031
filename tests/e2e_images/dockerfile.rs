//! What the stages of the repository's Dockerfile set, to compare with the
//! config of an image `images/build` wrote.

use openflux_testkit as support;

use std::collections::BTreeMap;
use std::process::Command;

/// What a stage of the Dockerfile sets: user, entry point, exposed ports
/// and labels, to compare with an image's config.
#[derive(Debug, Default)]
pub struct Stage {
    pub user: String,
    pub entrypoint: Vec<String>,
    pub ports: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// Reads stage `name` (`FROM ... AS <name>`) of the repository's Dockerfile.
pub fn dockerfile_stage(name: &str) -> Stage {
    let path = support::workspace_root().join("Dockerfile");
    let text = std::fs::read_to_string(&path).expect("reading the Dockerfile");
    let joined = text.replace("\\\n", " ");
    let mut stage = Stage::default();
    let mut inside = false;
    for line in joined.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (instruction, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => {
                inside = rest
                    .rsplit_once(" AS ")
                    .or_else(|| rest.rsplit_once(" as "))
                    .is_some_and(|(_, stage)| stage.trim() == name)
            }
            _ if !inside => {}
            "USER" => stage.user = rest.to_string(),
            "ENTRYPOINT" => {
                stage.entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT in exec form")
            }
            "EXPOSE" => stage.ports.extend(rest.split_whitespace().map(|p| {
                if p.contains('/') {
                    p.to_string()
                } else {
                    format!("{p}/tcp")
                }
            })),
            "LABEL" => stage.labels.extend(labels(rest)),
            _ => {}
        }
    }
    stage.ports.sort();
    assert!(
        !stage.entrypoint.is_empty(),
        "no stage {name} with an ENTRYPOINT in the Dockerfile"
    );
    stage
}

/// `key="value" key2="value 2"` as a map.
fn labels(mut rest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some((key, after)) = rest.split_once("=\"") {
        let Some((value, next)) = after.split_once('"') else {
            break;
        };
        out.push((key.trim().to_string(), value.to_string()));
        rest = next;
    }
    out
}

/// A pattern of `.dockerignore`, as Docker reads it (moby's
/// patternmatcher): the path cleaned, `*` and `?` within one path element,
/// `**` across elements, a leading `!` re-includes; the last pattern that
/// matches a path or one of its parent directories decides.
struct Pattern {
    exclude: bool,
    elements: Vec<String>,
}

/// The paths (files, relative, `/`-separated) of the build context that
/// `.dockerignore` leaves of the repository, `.git` never among them.
pub fn build_context() -> std::collections::BTreeSet<String> {
    let root = support::workspace_root();
    let text = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    let patterns: Vec<Pattern> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (exclude, path) = match l.strip_prefix('!') {
                Some(rest) => (false, rest.trim()),
                None => (true, l),
            };
            assert!(
                !path.contains(['[', '\\']),
                ".dockerignore pattern {l:?}: classes and escapes are not read by this check"
            );
            let elements = path
                .split('/')
                .filter(|e| !e.is_empty() && *e != ".")
                .map(str::to_string)
                .collect();
            Pattern { exclude, elements }
        })
        .collect();
    let excluded = |path: &[&str]| {
        let mut excluded = false;
        for p in &patterns {
            if (1..=path.len()).any(|n| elements_match(&p.elements, &path[..n])) {
                excluded = p.exclude;
            }
        }
        excluded
    };
    // An excluded directory is walked only when an exception may re-include
    // something under it (so target/ is never walked).
    let may_reinclude = |dir: &[&str]| {
        patterns
            .iter()
            .filter(|p| !p.exclude)
            .any(|p| prefix_may_match(&p.elements, dir))
    };
    let mut files = std::collections::BTreeSet::new();
    let mut stack = vec![Vec::<String>::new()];
    while let Some(dir) = stack.pop() {
        let path = dir.iter().fold(root.clone(), |p, e| p.join(e));
        let mut entries: Vec<_> = std::fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .map(|e| e.expect("a directory entry"))
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            if dir.is_empty() && name == ".git" {
                continue;
            }
            let mut child = dir.clone();
            child.push(name);
            let elements: Vec<&str> = child.iter().map(String::as_str).collect();
            let kind = entry.file_type().expect("a file type");
            if kind.is_dir() {
                if !excluded(&elements) || may_reinclude(&elements) {
                    stack.push(child);
                }
            } else if !excluded(&elements) {
                files.insert(child.join("/"));
            }
        }
    }
    files
}

/// `pattern` (elements, `**` among them) matches the whole of `path`.
fn elements_match(pattern: &[String], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(p), _) if p == "**" => {
            elements_match(&pattern[1..], path)
                || (!path.is_empty() && elements_match(pattern, &path[1..]))
        }
        (Some(p), Some(e)) => {
            glob(p.as_bytes(), e.as_bytes()) && elements_match(&pattern[1..], &path[1..])
        }
        _ => false,
    }
}

/// `pattern` may match `dir` or a path under it.
fn prefix_may_match(pattern: &[String], dir: &[&str]) -> bool {
    for (i, e) in dir.iter().enumerate() {
        match pattern.get(i) {
            None => return true,
            Some(p) if p == "**" => return true,
            Some(p) if !glob(p.as_bytes(), e.as_bytes()) => return false,
            Some(_) => {}
        }
    }
    true
}

/// One path element against one pattern element: `*` any run, `?` one byte.
fn glob(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
        (Some(a), Some(b)) => a == b && glob(&p[1..], &s[1..]),
        _ => false,
    }
}

/// What the build stage (`FROM ... AS build`) of the Dockerfile does: its
/// COPY instructions from the context (sources, destination), its RUN
/// commands, and what the other stages COPY out of it.
#[derive(Debug, Default)]
pub struct BuildStage {
    pub workdir: String,
    pub copies: Vec<(Vec<String>, String)>,
    pub runs: Vec<String>,
    pub copied_out: Vec<String>,
}

/// Reads the build stage of the repository's Dockerfile.
pub fn build_stage() -> BuildStage {
    let path = support::workspace_root().join("Dockerfile");
    let text = std::fs::read_to_string(&path).expect("reading the Dockerfile");
    let joined = text.replace("\\\n", " ");
    let mut stage = BuildStage::default();
    let mut inside = false;
    for line in joined.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (instruction, rest) = line.split_once(' ').unwrap_or((line, ""));
        let words: Vec<&str> = rest.split_whitespace().collect();
        match instruction.to_ascii_uppercase().as_str() {
            "FROM" => {
                inside =
                    words.len() == 3 && words[1].eq_ignore_ascii_case("as") && words[2] == "build"
            }
            "COPY" | "ADD" => {
                let from_build = words.contains(&"--from=build");
                let args: Vec<String> = words
                    .iter()
                    .filter(|w| !w.starts_with("--"))
                    .map(|w| w.to_string())
                    .collect();
                let (dest, sources) = args.split_last().expect("COPY SOURCE... DEST");
                if from_build {
                    stage.copied_out.extend(sources.iter().cloned());
                } else if inside {
                    assert_eq!(instruction, "COPY", "the build stage ADDs: {line}");
                    assert!(
                        !words.iter().any(|w| w.starts_with("--from")),
                        "the build stage copies from another stage: {line}"
                    );
                    stage.copies.push((sources.to_vec(), dest.clone()));
                }
            }
            "RUN" if inside => stage.runs.push(rest.to_string()),
            "WORKDIR" if inside => stage.workdir = rest.to_string(),
            _ => {}
        }
    }
    assert!(
        !stage.copies.is_empty(),
        "no COPY in a stage `AS build` of the Dockerfile"
    );
    stage
}

/// `dest` of a COPY in the build stage, relative to the stage's root
/// directory as the build sees it (`WORKDIR`).
fn relative_dest(stage: &BuildStage, dest: &str) -> String {
    let dest = match dest.strip_prefix('/') {
        Some(absolute) => absolute
            .strip_prefix(stage.workdir.trim_matches('/'))
            .unwrap_or_else(|| panic!("COPY to {dest}, outside WORKDIR {}", stage.workdir))
            .to_string(),
        None => dest.to_string(),
    };
    dest.trim_start_matches("./")
        .trim_matches('/')
        .trim_start_matches('.')
        .to_string()
}

/// The paths (relative to `dir`) of the files every non-test part of a
/// Rust file under `dir` includes (`include_str!`, `include_bytes!`,
/// `include!` of a literal path), for the paths a build of the package
/// reads: a file named `tests.rs`, and whatever follows a file's first
/// `#[cfg(test)]`, are test code.
fn included_files(dir: &std::path::Path) -> Vec<(std::path::PathBuf, std::path::PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("reading a source dir") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("reading a Rust file");
            let code: String = text
                .lines()
                .take_while(|l| l.trim() != "#[cfg(test)]")
                .collect::<Vec<_>>()
                .join("\n");
            for mac in ["include_str!(", "include_bytes!(", "include!("] {
                for (at, _) in code.match_indices(mac) {
                    let after = code[at + mac.len()..].trim_start();
                    let Some(literal) = after.strip_prefix('"') else {
                        continue;
                    };
                    let Some((included, _)) = literal.split_once('"') else {
                        continue;
                    };
                    let parent = path.parent().expect("a parent dir");
                    out.push((path.clone(), parent.join(included)));
                }
            }
        }
    }
    out
}

/// The Dockerfile builds from what its context holds, checked without a
/// container engine: every COPY source of the build stage is in the
/// context `.dockerignore` leaves; from the files those COPYs put in place
/// cargo loads the workspace as the build's `cargo build --locked` does
/// (`cargo fetch --locked`: every member's manifest, every target the
/// manifests declare, a current lock file); every file the code of the
/// packages built (and their path dependencies) includes is there; the
/// binaries the build installs are those packages' and are what the other
/// stages copy out.
#[test]
fn the_dockerfile_builds_from_what_its_context_holds() {
    let context = build_context();
    let stage = build_stage();
    let root = support::workspace_root();
    let tree = tempfile::tempdir().expect("a temp dir");
    for (sources, dest) in &stage.copies {
        let dest = relative_dest(&stage, dest);
        let into_dir = sources.len() > 1 || dest.is_empty();
        for source in sources {
            assert!(
                !source.contains(['*', '?', '[']),
                "COPY {source}: wildcards are not read by this check"
            );
            let source = source.trim_start_matches("./").trim_end_matches('/');
            let target = |relative: &str| tree.path().join(&dest).join(relative);
            if context.contains(source) {
                let name = source.rsplit('/').next().expect("a file name");
                let to = if into_dir {
                    target(name)
                } else {
                    tree.path().join(&dest)
                };
                std::fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
                std::fs::copy(root.join(source), &to).expect("copying a file");
                continue;
            }
            let prefix = format!("{source}/");
            let under: Vec<&String> = context.iter().filter(|f| f.starts_with(&prefix)).collect();
            let tops: std::collections::BTreeSet<&str> = context
                .iter()
                .map(|f| f.split('/').next().unwrap_or(f))
                .collect();
            assert!(
                !under.is_empty(),
                "the Dockerfile's build stage copies {source}, which is not in the build context \
                 (.dockerignore leaves {tops:?})"
            );
            for file in under {
                let to = target(&file[prefix.len()..]);
                std::fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
                std::fs::copy(root.join(file), &to).expect("copying a file");
            }
        }
    }

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = tree.path().join("Cargo.toml");
    let host = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let fetch = Command::new(&cargo)
        .args(["fetch", "--locked", "--target", &host, "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("running cargo fetch");
    assert!(
        fetch.status.success(),
        "cargo cannot load the workspace from what the build stage copies: {}",
        String::from_utf8_lossy(&fetch.stderr)
    );
    let metadata = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .expect("running cargo metadata");
    assert!(
        metadata.status.success(),
        "{}",
        String::from_utf8_lossy(&metadata.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&metadata.stdout).expect("cargo metadata's JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let package = |name: &str| {
        packages
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("the build builds -p {name}, which the workspace lacks"))
    };

    let run = stage.runs.join("\n");
    let words: Vec<&str> = run.split_whitespace().collect();
    let built: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == "-p")
        .map(|w| w[1])
        .collect();
    assert!(
        !built.is_empty(),
        "the build stage runs no cargo build -p ...: {run}"
    );
    let mut bins = Vec::new();
    let mut scanned = std::collections::BTreeSet::new();
    let mut queue: Vec<&serde_json::Value> = built.iter().map(|n| package(n)).collect();
    while let Some(p) = queue.pop() {
        let name = p["name"].as_str().expect("a package name");
        if !scanned.insert(name.to_string()) {
            continue;
        }
        if built.contains(&name) {
            for t in p["targets"].as_array().expect("targets") {
                if t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
                {
                    bins.push(t["name"].as_str().expect("a target name").to_string());
                }
            }
        }
        for dep in p["dependencies"].as_array().expect("dependencies") {
            if dep["path"].is_string() && dep["kind"].is_null() {
                queue.push(package(dep["name"].as_str().expect("a dependency name")));
            }
        }
        let manifest_dir =
            std::path::Path::new(p["manifest_path"].as_str().expect("a manifest path"))
                .parent()
                .expect("a package dir")
                .to_path_buf();
        let mut sources = included_files(&manifest_dir.join("src"));
        for t in p["targets"].as_array().expect("targets") {
            if t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "custom-build"))
            {
                let script =
                    std::path::PathBuf::from(t["src_path"].as_str().expect("a build script"));
                assert!(
                    script.exists(),
                    "{name}'s build script {} is not copied",
                    script.display()
                );
                let text = std::fs::read_to_string(&script).expect("reading a build script");
                if let Some(literal) = text.split("include!(\"").nth(1) {
                    let included = literal.split('"').next().expect("a path");
                    sources.push((
                        script.clone(),
                        script.parent().expect("a dir").join(included),
                    ));
                }
            }
        }
        for (file, included) in sources {
            assert!(
                included.exists(),
                "{} includes {}, which the build stage does not copy",
                file.strip_prefix(tree.path()).unwrap_or(&file).display(),
                included.display()
            );
        }
    }
    for (_, bin) in words
        .windows(2)
        .map(|w| (w[0], w[1]))
        .filter(|(_, w)| w.starts_with("target/release/"))
    {
        let name = &bin["target/release/".len()..];
        assert!(
            bins.iter().any(|b| b == name),
            "the build stage installs {bin}, no binary of {built:?} ({bins:?})"
        );
    }
    for out in &stage.copied_out {
        assert!(
            words.iter().any(|w| w == out),
            "a stage copies {out} out of the build stage, which does not install it: {run}"
        );
    }
}
