//! The Flux objects that consume sources, and where their references live.
//!
//! One row a consumer kind: which field holds its source reference(s), which
//! stock kinds that field accepts, and whether the reference type has an
//! `apiVersion` field at all. The webhook's decision and the `matchConditions`
//! of the webhook configuration are both derived from this table and from
//! one rule, [`RefField::is_stock`]: a reference names a stock source when
//! its kind is one of Flux's source kinds and its `apiVersion` is absent,
//! empty, or of Flux's source API group. The table of cases in
//! `tests/fixtures/source-references.json` holds both to it: the decision in
//! `rewrite::mutate` unit tests, the expressions on a real API server in
//! `e2e_policy`.

use crate::api::{StockSource, FLUX_SOURCE_GROUP, STOCK_SOURCES};
use crate::names::{EXPORT_NAME_END, MAX_NAME};

/// How the references sit in the consumer's object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefShape {
    /// One reference object at the path.
    One,
    /// A list of reference objects at the path, each identified by the value
    /// of the named key (unique within the list).
    ListByKey(&'static str),
}

/// A field of a consumer that holds source references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefField {
    /// Path of the field from the object root.
    pub path: &'static [&'static str],
    pub shape: RefShape,
    /// Whether the reference type has an `apiVersion` field. When it has none,
    /// the API server prunes any `apiVersion` a user writes, so a reference is
    /// matched by kind alone and a rewrite never adds one.
    pub has_api_version: bool,
    /// The stock kinds the consumer accepts here.
    pub stock_kinds: &'static [StockSource],
}

/// A reference field that must not name a custom source, and what to do instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForbiddenRef {
    pub field: RefField,
    /// What the person should do instead, said in a full sentence.
    pub hint: &'static str,
}

/// What reads a consumer's references, as far as ExternalArtifact goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// A Flux controller that reads ExternalArtifact only with its
    /// `ExternalArtifact` feature gate on; the name is its Deployment's
    /// `app.kubernetes.io/component` label.
    Gated(&'static str),
    /// A controller that reads ExternalArtifact without a gate.
    Ungated,
    /// A controller that may not read ExternalArtifact, and why.
    NoExternalArtifact(&'static str),
}

/// A Flux object kind that consumes source artifacts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Consumer {
    pub kind: &'static str,
    pub group: &'static str,
    /// The version the webhook configuration asks the API server for.
    pub version: &'static str,
    /// Plural resource name.
    pub resource: &'static str,
    /// The field openflux rewrites.
    pub refs: RefField,
    /// A field openflux refuses custom sources in, if any.
    pub forbidden: Option<ForbiddenRef>,
    /// The controller that reads the references.
    pub reader: Reader,
}

/// By kind and group, which name a consumer; `Eq` compares every field, so
/// equal consumers hash alike.
impl std::hash::Hash for Consumer {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.group.hash(state);
    }
}

/// Every consumer openflux handles.
pub static CONSUMERS: [Consumer; 4] = [
    Consumer {
        kind: "Kustomization",
        group: "kustomize.toolkit.fluxcd.io",
        version: "v1",
        resource: "kustomizations",
        refs: RefField {
            path: &["spec", "sourceRef"],
            shape: RefShape::One,
            has_api_version: true,
            stock_kinds: &[
                StockSource::GIT_REPOSITORY,
                StockSource::OCI_REPOSITORY,
                StockSource::BUCKET,
                StockSource::EXTERNAL_ARTIFACT,
            ],
        },
        forbidden: None,
        reader: Reader::Gated("kustomize-controller"),
    },
    Consumer {
        kind: "HelmRelease",
        group: "helm.toolkit.fluxcd.io",
        version: "v2",
        resource: "helmreleases",
        refs: RefField {
            path: &["spec", "chartRef"],
            shape: RefShape::One,
            has_api_version: true,
            stock_kinds: &[
                StockSource::OCI_REPOSITORY,
                StockSource::HELM_CHART,
                StockSource::EXTERNAL_ARTIFACT,
            ],
        },
        forbidden: Some(ForbiddenRef {
            field: RefField {
                path: &["spec", "chart", "spec", "sourceRef"],
                shape: RefShape::One,
                has_api_version: true,
                stock_kinds: &[
                    StockSource::HELM_REPOSITORY,
                    StockSource::GIT_REPOSITORY,
                    StockSource::BUCKET,
                ],
            },
            hint: "helm-controller builds a chart there from a Helm repository, Git repository \
                   or Bucket only; reference a custom source whose artifact is a packaged chart \
                   with spec.chartRef instead",
        }),
        reader: Reader::Gated("helm-controller"),
    },
    Consumer {
        kind: "ArtifactGenerator",
        group: "source.extensions.fluxcd.io",
        version: "v1beta1",
        resource: "artifactgenerators",
        refs: RefField {
            path: &["spec", "sources"],
            shape: RefShape::ListByKey("alias"),
            has_api_version: false,
            stock_kinds: &[
                StockSource::BUCKET,
                StockSource::GIT_REPOSITORY,
                StockSource::OCI_REPOSITORY,
                StockSource::HELM_CHART,
                StockSource::EXTERNAL_ARTIFACT,
            ],
        },
        forbidden: None,
        reader: Reader::Ungated,
    },
    Consumer {
        kind: "Stack",
        group: "pulumi.com",
        version: "v1",
        resource: "stacks",
        refs: RefField {
            path: &["spec", "fluxSource", "sourceRef"],
            shape: RefShape::One,
            has_api_version: true,
            stock_kinds: &[
                StockSource::BUCKET,
                StockSource::GIT_REPOSITORY,
                StockSource::OCI_REPOSITORY,
            ],
        },
        forbidden: None,
        reader: Reader::NoExternalArtifact(
            "the Pulumi Kubernetes Operator's default role reads only Buckets, GitRepositories \
             and OCIRepositories",
        ),
    },
];

/// The consumer served under this API group and plural resource name.
pub fn find(group: &str, resource: &str) -> Option<&'static Consumer> {
    CONSUMERS
        .iter()
        .find(|c| c.group == group && c.resource == resource)
}

impl Consumer {
    /// The value of the `consumer` metric label.
    pub fn label(&self) -> &'static str {
        self.resource
    }
}

impl RefField {
    /// The field path in the dotted form people read in messages.
    pub fn dotted(&self) -> String {
        self.path.join(".")
    }

    /// Whether this field takes the stock source kind `kind`.
    pub fn accepts(&self, kind: &str) -> bool {
        self.stock_kinds.iter().any(|s| s.kind == kind)
    }

    /// The stock kinds this field takes, for messages.
    pub fn stock_kind_list(&self) -> String {
        let kinds: Vec<&str> = self.stock_kinds.iter().map(|s| s.kind).collect();
        kinds.join(", ")
    }

    /// Whether a reference in this field names a stock Flux source, which
    /// openflux leaves alone (and its webhook configuration never sends it).
    /// Where the reference type has no `apiVersion`, the API server drops
    /// one, so only the kind counts.
    pub fn is_stock(&self, api_version: Option<&str>, kind: &str) -> bool {
        is_stock_ref(api_version.filter(|_| self.has_api_version), kind)
    }
}

/// Whether a reference names a stock Flux source: one of Flux's source
/// kinds (whichever fields take it), with an `apiVersion` that is absent,
/// empty (Flux reads an empty one as absent) or of [`FLUX_SOURCE_GROUP`].
/// Written as the CEL of [`match_condition`] tests it.
pub fn is_stock_ref(api_version: Option<&str>, kind: &str) -> bool {
    StockSource::by_kind(kind).is_some()
        && api_version.is_none_or(|v| {
            v.is_empty()
                || v.strip_prefix(FLUX_SOURCE_GROUP)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
}

/// The CEL expression that lets a request of `consumer` reach the webhook:
/// only when one of its reference fields names something other than a stock
/// kind it accepts. A stock reference never reaches openflux, so stock Flux
/// works unchanged while openflux is down. Objects being deleted never do
/// either, so a finalizer can always be removed; nor do references without a
/// kind, which the API server's own validation refuses with a clear message.
pub fn match_condition(consumer: &Consumer) -> String {
    let mut fields = vec![field_condition(&consumer.refs)];
    if let Some(forbidden) = &consumer.forbidden {
        fields.push(field_condition(&forbidden.field));
    }
    format!(
        "object != null && !has(object.metadata.deletionTimestamp) && has(object.spec) && ({})",
        fields.join(" || ")
    )
}

fn field_condition(field: &RefField) -> String {
    // has() needs every parent to exist; `object.spec` is checked by the caller.
    let mut guards = Vec::new();
    for depth in 2..=field.path.len() {
        guards.push(format!("has(object.{})", field.path[..depth].join(".")));
    }
    // Every stock kind, as in is_stock_ref.
    let kinds = STOCK_SOURCES
        .iter()
        .map(|s| format!("'{}'", s.kind))
        .collect::<Vec<_>>()
        .join(", ");
    let expr = format!("object.{}", field.dotted());
    let custom = |r: &str| {
        if field.has_api_version {
            format!(
                "has({r}.kind) && !({r}.kind in [{kinds}] && (!has({r}.apiVersion) || {r}.apiVersion == '' || {r}.apiVersion.startsWith('{FLUX_SOURCE_GROUP}/')))"
            )
        } else {
            format!("has({r}.kind) && !({r}.kind in [{kinds}])")
        }
    };
    let test = match field.shape {
        RefShape::One => custom(&expr),
        RefShape::ListByKey(_) => format!("{expr}.exists(r, {})", custom("r")),
    };
    guards.push(test);
    format!("({})", guards.join(" && "))
}

/// The CEL `matchConditions` expression of openflux's validating webhook
/// for `consumer`: true when a reference names one of the kinds openflux
/// exports as (ExternalArtifact, OCIRepository, of Flux's API) with a name
/// that has the shape of an export's (ending in `--` and 12 hex
/// characters) or of the release before's (three dots or more, or cut to
/// the longest name). Every other object, stock Flux's included, is admitted
/// without openflux, so it keeps working while openflux is down. The Rust
/// twin is `policy::candidates::has_export_shape`.
pub fn export_match_condition(consumer: &Consumer) -> String {
    let field = &consumer.refs;
    let mut guards = Vec::new();
    for depth in 2..=field.path.len() {
        guards.push(format!("has(object.{})", field.path[..depth].join(".")));
    }
    let expr = format!("object.{}", field.dotted());
    let export = |r: &str| {
        let api_version = if field.has_api_version {
            format!(
                " && (!has({r}.apiVersion) || {r}.apiVersion == '' || {r}.apiVersion.startsWith('{FLUX_SOURCE_GROUP}/'))"
            )
        } else {
            String::new()
        };
        format!(
            "has({r}.kind) && has({r}.name) && {r}.kind in ['ExternalArtifact', 'OCIRepository']{api_version} && \
             ({r}.name.matches('{EXPORT_NAME_END}') || {r}.name.matches('[.].*[.].*[.]') || size({r}.name) == {MAX_NAME})"
        )
    };
    guards.push(match field.shape {
        RefShape::One => export(&expr),
        RefShape::ListByKey(_) => format!("{expr}.exists(r, {})", export("r")),
    });
    format!(
        "object != null && !has(object.metadata.deletionTimestamp) && has(object.spec) && ({})",
        guards.join(" && ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_consumers_by_group_and_resource() {
        assert_eq!(
            find("kustomize.toolkit.fluxcd.io", "kustomizations").map(|c| c.kind),
            Some("Kustomization")
        );
        assert_eq!(
            find("helm.toolkit.fluxcd.io", "helmreleases").map(|c| c.kind),
            Some("HelmRelease")
        );
        assert_eq!(
            find("source.extensions.fluxcd.io", "artifactgenerators").map(|c| c.kind),
            Some("ArtifactGenerator")
        );
        assert!(find("", "pods").is_none());
        assert!(find("kustomize.toolkit.fluxcd.io", "helmreleases").is_none());
    }

    #[test]
    fn stock_refs() {
        assert!(is_stock_ref(None, "GitRepository"));
        assert!(is_stock_ref(
            Some("source.toolkit.fluxcd.io/v1"),
            "ExternalArtifact"
        ));
        assert!(!is_stock_ref(Some("example.com/v1"), "GitRepository"));
        assert!(!is_stock_ref(None, "HttpSource"));
        assert!(!is_stock_ref(
            Some("source.toolkit.fluxcd.io/v1"),
            "HttpSource"
        ));
        // Empty is absent, as for Flux.
        assert!(is_stock_ref(Some(""), "Bucket"));
        assert!(!is_stock_ref(Some("source.toolkit.fluxcd.io"), "Bucket"));
        assert!(!is_stock_ref(
            Some("source.toolkit.fluxcd.iox/v1"),
            "Bucket"
        ));
        // A field without apiVersion: the kind alone counts.
        let sources = find("source.extensions.fluxcd.io", "artifactgenerators")
            .unwrap()
            .refs;
        assert!(sources.is_stock(Some("example.com/v1"), "GitRepository"));
        let source_ref = CONSUMERS[0].refs;
        assert!(!source_ref.is_stock(Some("example.com/v1"), "GitRepository"));
    }

    #[test]
    fn match_conditions_guard_every_parent() {
        let hr = find("helm.toolkit.fluxcd.io", "helmreleases").unwrap();
        let cel = match_condition(hr);
        assert!(cel.starts_with("object != null && "), "{cel}");
        assert!(cel.contains(
            "has(object.spec.chart) && has(object.spec.chart.spec) && has(object.spec.chart.spec.sourceRef)"
        ));
        let ag = find("source.extensions.fluxcd.io", "artifactgenerators").unwrap();
        let cel = match_condition(ag);
        assert!(
            cel.contains("object.spec.sources.exists(r, has(r.kind) && !(r.kind in ["),
            "{cel}"
        );
        assert!(!cel.contains("apiVersion"), "{cel}");
    }

    /// The validating webhook configurations carry one entry per consumer,
    /// sent only references that may name an export.
    #[test]
    fn shipped_validating_configurations_follow_the_table() {
        use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
        for file in [
            "src/registration/validating.yaml",
            "webhook-config/local/validating-webhook.yaml",
        ] {
            let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            let config: ValidatingWebhookConfiguration = serde_yaml_ng::from_str(&text).unwrap();
            let webhooks = config.webhooks.unwrap();
            assert_eq!(webhooks.len(), CONSUMERS.len(), "{file}");
            for consumer in &CONSUMERS {
                let webhook = webhooks
                    .iter()
                    .find(|w| w.name == format!("{}.validate.openflux.dev", consumer.resource))
                    .unwrap_or_else(|| panic!("{file}: no webhook for {}", consumer.kind));
                let rule = &webhook.rules.as_ref().unwrap()[0];
                assert_eq!(
                    rule.api_groups.as_deref(),
                    Some(&[consumer.group.to_string()][..])
                );
                assert_eq!(
                    rule.resources.as_deref(),
                    Some(&[consumer.resource.to_string()][..])
                );
                let conditions = webhook.match_conditions.as_ref().unwrap();
                assert_eq!(conditions.len(), 1);
                assert_eq!(
                    conditions[0].expression,
                    export_match_condition(consumer),
                    "{file}"
                );
                assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
                assert_eq!(webhook.side_effects, "None");
                let url = webhook.client_config.url.as_deref();
                let service = webhook.client_config.service.as_ref();
                assert!(
                    url.is_some_and(|u| u.ends_with("/validate"))
                        || service.is_some_and(|s| s.path.as_deref() == Some("/validate")),
                    "{file}"
                );
            }
        }
    }

    /// The webhook configurations shipped in webhook-config/ carry one entry
    /// per consumer, with the rules and matchConditions of this table.
    #[test]
    fn shipped_webhook_configurations_follow_the_table() {
        use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
        for file in [
            "webhook-config/mutating-webhook.yaml",
            "webhook-config/local/mutating-webhook.yaml",
        ] {
            let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            let config: MutatingWebhookConfiguration = serde_yaml_ng::from_str(&text).unwrap();
            let webhooks = config.webhooks.unwrap();
            // One per consumer, and one recording Artifacts' writers.
            assert_eq!(webhooks.len(), CONSUMERS.len() + 1, "{file}");
            let artifacts = webhooks
                .iter()
                .find(|w| w.name == "artifacts.openflux.dev")
                .unwrap_or_else(|| panic!("{file}: no webhook for Artifacts"));
            let rule = &artifacts.rules.as_ref().unwrap()[0];
            for group in rule.api_groups.iter().flatten() {
                assert!(
                    crate::rewrite::writer::is_artifact_resource(group, "artifacts"),
                    "{file}: {group}"
                );
            }
            for consumer in &CONSUMERS {
                let webhook = webhooks
                    .iter()
                    .find(|w| w.name == format!("{}.openflux.dev", consumer.resource))
                    .unwrap_or_else(|| panic!("{file}: no webhook for {}", consumer.kind));
                let rules = webhook.rules.as_ref().unwrap();
                assert_eq!(rules.len(), 1);
                let rule = &rules[0];
                assert_eq!(
                    rule.api_groups.as_deref(),
                    Some(&[consumer.group.to_string()][..])
                );
                assert_eq!(
                    rule.api_versions.as_deref(),
                    Some(&[consumer.version.to_string()][..])
                );
                assert_eq!(
                    rule.resources.as_deref(),
                    Some(&[consumer.resource.to_string()][..])
                );
                assert_eq!(
                    rule.operations.as_deref(),
                    Some(&["CREATE".to_string(), "UPDATE".to_string()][..])
                );
                let conditions = webhook.match_conditions.as_ref().unwrap();
                assert_eq!(conditions.len(), 1);
                assert_eq!(
                    conditions[0].expression,
                    match_condition(consumer),
                    "{file}"
                );
                assert_eq!(webhook.side_effects, "None");
                assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
                assert_eq!(webhook.timeout_seconds, Some(5));
                assert_eq!(webhook.admission_review_versions, vec!["v1"]);
                assert!(webhook.client_config.ca_bundle.is_none());
            }
        }
    }

    /// The shipped policy on openflux's own identity
    /// (`webhook-config/openflux-policy.yaml`) follows this table: it
    /// matches every consumer (and its status), lets openflux change the
    /// very reference field openflux rewrites, to a name shaped as an
    /// export's, and the annotations openflux writes; the policy on
    /// openflux's objects matches Artifacts and both export kinds. Both
    /// judge the identity the other shipped policies name, with no
    /// parameter (a built-in paramKind stops resolving once its binding is
    /// deleted and created again).
    #[test]
    fn the_policy_on_openflux_follows_the_table() {
        use serde_json::{json, Value};
        let read = |file: &str| -> Vec<Value> {
            let path = format!("{}/webhook-config/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            serde_yaml_ng::Deserializer::from_str(&text)
                .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap())
                .filter(|doc| !doc.is_null())
                .collect()
        };
        let docs = read("openflux-policy.yaml");
        let policy = |name: &str| -> Value {
            docs.iter()
                .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("no policy {name}"))
        };
        let variable = |policy: &Value, name: &str| -> String {
            policy["spec"]["variables"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .and_then(|v| v["expression"].as_str())
                .unwrap_or_else(|| panic!("no variable {name}"))
                .to_string()
        };
        let rules = |policy: &Value| -> Vec<(String, String)> {
            let mut out = Vec::new();
            for rule in policy["spec"]["matchConstraints"]["resourceRules"]
                .as_array()
                .unwrap()
            {
                assert_eq!(rule["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
                for group in rule["apiGroups"].as_array().unwrap() {
                    for resource in rule["resources"].as_array().unwrap() {
                        out.push((
                            group.as_str().unwrap().to_string(),
                            resource.as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
            out
        };
        let identity = read("externalartifact-policy.yaml")
            .iter()
            .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
            .and_then(|p| {
                p["spec"]["variables"]
                    .as_array()?
                    .iter()
                    .find(|v| v["name"] == "openflux")?["expression"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap();

        let consumers = policy("openflux-consumer-references");
        let matched = rules(&consumers);
        assert_eq!(matched.len(), 2 * CONSUMERS.len(), "{matched:?}");
        let field = variable(&consumers, "field");
        let top = variable(&consumers, "topKey");
        for c in &CONSUMERS {
            for resource in [c.resource.to_string(), format!("{}/status", c.resource)] {
                assert!(
                    matched.contains(&(c.group.to_string(), resource.clone())),
                    "{resource}"
                );
            }
            assert!(
                field.contains(&format!("'{}': '{}'", c.resource, c.refs.dotted())),
                "{field}"
            );
            assert!(
                top.contains(&format!("'{}': '{}'", c.resource, c.refs.path[1])),
                "{top}"
            );
            let list = matches!(c.refs.shape, RefShape::ListByKey(_));
            let refs = variable(&consumers, "newRefs");
            assert_eq!(
                refs.contains(&format!("'{}' ? variables.newTop", c.resource)),
                list
            );
        }
        // The one consumer whose reference sits deeper than spec.<key>.
        let inner = variable(&consumers, "innerKey");
        for c in &CONSUMERS {
            match c.refs.path {
                [_, _] => assert!(!inner.contains(&format!("'{}'", c.resource))),
                [_, _, last] => {
                    assert!(
                        inner.contains(&format!("== '{}' ? '{last}'", c.resource)),
                        "{inner}"
                    )
                }
                other => panic!("a reference path the policy cannot follow: {other:?}"),
            }
        }
        // openflux may write the annotation of where a consumer pointed
        // before; the references as written are the author's record.
        assert_eq!(
            variable(&consumers, "openfluxAnnotations"),
            format!("['{}']", crate::vocabulary::marks::MOVED_FROM_ANNOTATION)
        );
        let recorded = variable(&consumers, "recorded");
        assert!(
            recorded.contains(&format!("'{}'", crate::api::SOURCE_REF_ANNOTATION)),
            "{recorded}"
        );
        let to_sources = variable(&consumers, "refsToRecordedSources");
        assert!(
            to_sources.contains(&format!(
                "size(r.name) - {}",
                crate::names::EXPORT_HASH_LEN + 2
            )),
            "{to_sources}"
        );
        let exports = variable(&consumers, "refsToExports");
        assert!(
            exports.contains(&format!("size(r.name) == {MAX_NAME}")),
            "{exports}"
        );
        assert!(
            exports.contains("r.name.matches('[.].*[.].*[.]')"),
            "{exports}"
        );
        assert!(
            exports.contains(&format!("r.name.matches('{EXPORT_NAME_END}')")),
            "{exports}"
        );
        assert!(
            exports.contains(&format!("startsWith('{FLUX_SOURCE_GROUP}/')")),
            "{exports}"
        );

        let own = policy("openflux-own-objects");
        let matched = rules(&own);
        assert!(matched.contains(&("openflux.dev".to_string(), "artifacts".to_string())));
        for target in ["externalartifacts", "ocirepositories"] {
            for resource in [target.to_string(), format!("{target}/status")] {
                assert!(matched.contains(&(FLUX_SOURCE_GROUP.to_string(), resource)));
            }
        }
        for p in [&consumers, &own, &policy("openflux-source-requests")] {
            assert!(p["spec"].get("paramKind").is_none());
            assert_eq!(p["spec"]["failurePolicy"], "Fail");
            let condition = p["spec"]["matchConditions"][0]["expression"]
                .as_str()
                .unwrap();
            assert_eq!(condition, identity, "the policies judge one identity");
        }
        for binding in docs
            .iter()
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        {
            assert!(binding["spec"].get("paramRef").is_none());
            assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        }
        assert_eq!(
            docs.iter()
                .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
                .count(),
            3
        );
        // The third holds every other group openflux may be granted (the
        // custom sources' reconcile requests), leaving out exactly the
        // groups the first two hold and Kubernetes' own that openflux
        // writes in.
        let sources = policy("openflux-source-requests");
        assert_eq!(
            variable(&sources, "requestedAt"),
            format!("'{}'", crate::export::plan::REQUESTED_AT)
        );
        let excluded = sources["spec"]["matchConstraints"]["excludeResourceRules"][0]["apiGroups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap().to_string())
            .collect::<std::collections::BTreeSet<_>>();
        let held = CONSUMERS
            .iter()
            .map(|c| c.group.to_string())
            .chain(["openflux.dev".to_string(), FLUX_SOURCE_GROUP.to_string()])
            .collect::<std::collections::BTreeSet<_>>();
        assert_eq!(excluded, held);
        // On by default: part of what `kubectl apply -k manifests/` applies.
        let kustomization = read("kustomization.yaml");
        assert!(kustomization[0]["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("openflux-policy.yaml")));
    }
}
