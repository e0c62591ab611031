//! What the stages of the repository's Dockerfile set, to compare with the
//! config of an image `images/build` wrote.

use openflux_testkit as support;

use std::collections::BTreeMap;

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
