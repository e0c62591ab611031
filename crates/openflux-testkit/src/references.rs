//! The table of source references that decides which consumer objects
//! reach openflux (`tests/fixtures/source-references.json`):
//! one table for the webhook's decision (unit tests) and for the webhook
//! configuration's `matchConditions` on a real API server (end-to-end).

use serde::Deserialize;
use serde_json::{json, Map, Value};

const TABLE: &str = include_str!("../../../tests/fixtures/source-references.json");

#[derive(Deserialize)]
struct Table {
    consumers: std::collections::BTreeMap<String, String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    consumer: String,
    field: String,
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    openflux: bool,
}

/// One case: a consumer whose `field` holds one reference to `kind`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefCase {
    /// The consumer's kind and `apiVersion`.
    pub consumer: String,
    pub consumer_api_version: String,
    /// The dotted path of the reference field.
    pub field: String,
    pub kind: String,
    /// `None`: no `apiVersion` in the reference.
    pub api_version: Option<String>,
    /// Whether the object reaches openflux (and openflux acts on it).
    pub openflux: bool,
}

/// Every case of the table.
pub fn source_reference_cases() -> Vec<RefCase> {
    let table: Table = serde_json::from_str(TABLE).expect("source-references.json");
    table
        .cases
        .into_iter()
        .map(|c| RefCase {
            consumer_api_version: table
                .consumers
                .get(&c.consumer)
                .unwrap_or_else(|| {
                    panic!("source-references.json: no apiVersion for {}", c.consumer)
                })
                .clone(),
            consumer: c.consumer,
            field: c.field,
            kind: c.kind,
            api_version: c.api_version,
            openflux: c.openflux,
        })
        .collect()
}

impl RefCase {
    /// The consumer object `namespace`/`name` holding the case's reference
    /// (to a source named `app`); a list field (`spec.sources`) holds it as
    /// its one entry, alias `app`.
    pub fn object(&self, namespace: &str, name: &str) -> Value {
        let mut reference = json!({"kind": self.kind, "name": "app"});
        if let Some(v) = &self.api_version {
            reference["apiVersion"] = json!(v);
        }
        let path: Vec<&str> = self.field.split('.').collect();
        let mut value = if self.field == "spec.sources" {
            reference["alias"] = json!("app");
            json!([reference])
        } else {
            reference
        };
        for part in path.iter().rev() {
            let mut parent = Map::new();
            parent.insert(part.to_string(), value);
            value = Value::Object(parent);
        }
        let mut object = value;
        object["apiVersion"] = json!(self.consumer_api_version);
        object["kind"] = json!(self.consumer);
        object["metadata"] = json!({"name": name, "namespace": namespace});
        object
    }
}

impl std::fmt::Display for RefCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let api_version = match &self.api_version {
            None => "no apiVersion".to_string(),
            Some(v) => format!("apiVersion {v:?}"),
        };
        write!(
            f,
            "{} {}: {} with {api_version}",
            self.consumer, self.field, self.kind
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_build_their_objects() {
        let cases = source_reference_cases();
        assert!(cases.iter().any(|c| c.openflux) && cases.iter().any(|c| !c.openflux));
        let hr = cases
            .iter()
            .find(|c| c.field == "spec.chart.spec.sourceRef")
            .unwrap();
        let object = hr.object("ns", "x");
        assert_eq!(object["spec"]["chart"]["spec"]["sourceRef"]["name"], "app");
        assert_eq!(object["apiVersion"], "helm.toolkit.fluxcd.io/v2");
        let ag = cases.iter().find(|c| c.field == "spec.sources").unwrap();
        assert_eq!(ag.object("ns", "x")["spec"]["sources"][0]["alias"], "app");
    }
}
