//! The kube-state-metrics configuration of `manifests/monitoring/` reads
//! fields the shipped CRDs have: every `labelsFromPath` path is walked
//! through the CRD's OpenAPI schema of the version it names.

use serde_json::Value;

const CONFIG: &str = include_str!("../../manifests/monitoring/kube-state-metrics.yaml");
const CRDS: &[&str] = &[
    include_str!("../../manifests/crds/artifacts.yaml"),
    include_str!("../../manifests/http-source/crd.yaml"),
];

/// The schema of `group`/`version`/`kind` in the shipped CRDs.
fn schema(group: &str, version: &str, kind: &str) -> Value {
    for text in CRDS {
        let crd: Value = serde_yaml_ng::from_str(text).expect("a CRD");
        if crd["spec"]["group"] != group || crd["spec"]["names"]["kind"] != kind {
            continue;
        }
        for v in crd["spec"]["versions"].as_array().expect("versions") {
            if v["name"] == version {
                return v["schema"]["openAPIV3Schema"].clone();
            }
        }
    }
    panic!("no shipped CRD serves {group}/{version} {kind}");
}

/// Whether `path` (kube-state-metrics' form: field names, and `[k=v]` to
/// pick an array item) leads somewhere in `schema`.
fn walk(schema: &Value, path: &[Value]) -> Result<(), String> {
    let Some((step, rest)) = path.split_first() else {
        return Ok(());
    };
    let step = step
        .as_str()
        .ok_or_else(|| format!("{step} is not a string"))?;
    if step.starts_with('[') {
        let items = &schema["items"];
        if items.is_null() {
            return Err(format!("{step}: not an array"));
        }
        let field = step
            .trim_matches(|c| c == '[' || c == ']')
            .split_once('=')
            .map(|(k, _)| k)
            .ok_or_else(|| format!("{step}: not [key=value]"))?;
        if items["properties"][field].is_null() {
            return Err(format!("{step}: the items have no {field}"));
        }
        return walk(items, rest);
    }
    let next = &schema["properties"][step];
    if next.is_null() {
        return Err(format!("no field {step}"));
    }
    walk(next, rest)
}

#[test]
fn every_path_of_the_kube_state_metrics_configuration_is_in_its_crd() {
    let config: Value = serde_yaml_ng::from_str(CONFIG).expect("the configuration parses");
    let resources = config["spec"]["resources"].as_array().expect("resources");
    assert_eq!(resources.len(), 2, "Artifact and HttpSource");
    let mut checked = 0;
    for resource in resources {
        let gvk = &resource["groupVersionKind"];
        let (group, version, kind) = (
            gvk["group"].as_str().unwrap(),
            gvk["version"].as_str().unwrap(),
            gvk["kind"].as_str().unwrap(),
        );
        let schema = schema(group, version, kind);
        for metric in resource["metrics"].as_array().expect("metrics") {
            let sets = [
                &metric["labelsFromPath"],
                &metric["each"]["info"]["labelsFromPath"],
            ];
            for (label, path) in sets.iter().filter_map(|s| s.as_object()).flatten() {
                let path = path.as_array().expect("a path is a list");
                if path.first().and_then(Value::as_str) == Some("metadata") {
                    continue;
                }
                walk(&schema, path).unwrap_or_else(|e| panic!("{kind} label {label}: {e}"));
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "checked {checked} paths");
}

#[test]
fn a_path_the_crd_lacks_is_found() {
    let schema = schema("openflux.dev", "v1alpha1", "Artifact");
    let path = |p: &[&str]| p.iter().map(|s| Value::from(*s)).collect::<Vec<_>>();
    assert!(walk(&schema, &path(&["spec", "revision"])).is_ok());
    assert!(walk(
        &schema,
        &path(&["status", "conditions", "[type=Ready]", "status"])
    )
    .is_ok());
    assert!(walk(&schema, &path(&["spec", "suspend"])).is_err());
    assert!(walk(&schema, &path(&["status", "artifact", "revision"])).is_err());
}
