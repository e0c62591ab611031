use serde_json::{json, Value};

use super::*;
use crate::cluster::facts::Facts;
use crate::index::OwnerIndex;
use crate::policy::{Policies, Rule};
use crate::webhook::review;

const FLUX: &str = "source.toolkit.fluxcd.io/v1";
/// The exports of HttpSource `web` and Widget `w`: as openflux names them,
/// then as the release before did.
fn exports() -> [(String, String); 2] {
    use crate::names::identity::{dotted_source_export_name, source_export_name};
    [
        (
            source_export_name("source.openflux.dev", "HttpSource", "web"),
            source_export_name("zz.example.test", "Widget", "w"),
        ),
        (
            dotted_source_export_name("source.openflux.dev", "HttpSource", "web"),
            dotted_source_export_name("zz.example.test", "Widget", "w"),
        ),
    ]
}

/// Widget `w`'s export.
fn widget_export() -> String {
    crate::names::identity::source_export_name("zz.example.test", "Widget", "w")
}

fn facts() -> Facts {
    let mut facts = Facts {
        synced: true,
        ..Facts::default()
    };
    for consumer in crate::vocabulary::consumers::CONSUMERS.iter() {
        let choice = crate::cluster::target::Choice {
            target: crate::cluster::target::Target::ExternalArtifact,
            reason: "test".into(),
        };
        facts.choices.insert(consumer.kind, Ok(choice));
    }
    for (kind, group) in [
        ("HttpSource", "source.openflux.dev"),
        ("Widget", "zz.example.test"),
    ] {
        facts
            .kinds
            .entry(kind.to_string())
            .or_default()
            .insert(group.to_string());
    }
    facts
}

fn index() -> OwnerIndex {
    let mut idx = OwnerIndex::new();
    idx.reset([]);
    idx
}

/// Tenant A may use HttpSource, tenant B Widget; `open` has no policy.
fn policies() -> Policies {
    let rule = |name: &str, team: &str, group: &str, kind: &str| {
        let rule = Rule {
            name: name.into(),
            selector: serde_json::from_value(json!({"matchLabels": {"team": team}})).unwrap(),
            allowed: vec![crate::api::policy::AllowedKind {
                group: group.into(),
                kind: kind.into(),
            }],
        };
        (name.to_string(), rule)
    };
    Policies {
        synced: true,
        rules: [
            rule("tenant-a", "a", "source.openflux.dev", "HttpSource"),
            rule("tenant-b", "b", "zz.example.test", "Widget"),
        ]
        .into_iter()
        .collect(),
        namespaces: [("team-a", "a"), ("team-b", "b"), ("open", "c")]
            .into_iter()
            .map(|(ns, team)| {
                (
                    ns.to_string(),
                    [("team".to_string(), team.to_string())].into(),
                )
            })
            .collect(),
    }
}

fn review(resource: (&str, &str, &str), namespace: &str, spec: Value) -> Vec<u8> {
    let (group, version, plural) = resource;
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": group, "version": version, "kind": "X"},
            "resource": {"group": group, "version": version, "resource": plural},
            "name": "app",
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "tenant"},
            "object": {"metadata": {"name": "app", "namespace": namespace}, "spec": spec}
        }
    }))
    .unwrap()
}

const KS: (&str, &str, &str) = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations");
const HR: (&str, &str, &str) = ("helm.toolkit.fluxcd.io", "v2", "helmreleases");
const AG: (&str, &str, &str) = (
    "source.extensions.fluxcd.io",
    "v1beta1",
    "artifactgenerators",
);

fn ks(namespace: &str, source_ref: Value) -> Vec<u8> {
    review(
        KS,
        namespace,
        json!({"sourceRef": source_ref, "path": "./"}),
    )
}

fn validate(body: &[u8], policies: &Policies, options: &Options) -> Decision {
    let (index, facts) = (index(), facts());
    let view = View {
        index: &index,
        facts: &facts,
        policies,
    };
    decide(&review::parse(body).unwrap(), view, options)
}

fn mutate(body: &[u8], policies: &Policies) -> Decision {
    let (index, facts) = (index(), facts());
    let view = View {
        index: &index,
        facts: &facts,
        policies,
    };
    crate::webhook::answer::answer(body, view, &Options::default())
        .decision
        .unwrap()
}

fn denial(decision: &Decision) -> &str {
    match decision {
        Decision::Deny { message } | Decision::NotServed { message } => message,
        other => panic!("not denied: {other:?}"),
    }
}

#[test]
fn a_direct_reference_to_an_export_is_judged_by_its_source_kind() {
    let ea = |name: &str| json!({"kind": "ExternalArtifact", "apiVersion": FLUX, "name": name});
    let shadow = |name: &str| json!({"kind": "OCIRepository", "name": name});
    let deny = |policy: &str, kind: &str| Some((policy.to_string(), kind.to_string()));
    for (http_export, widget_export) in exports() {
        let (http_export, widget_export) = (http_export.as_str(), widget_export.as_str());
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, Vec<u8>, Option<(String, String)>)> = vec![
            (
                "A names its HttpSource export",
                ks("team-a", ea(http_export)),
                None,
            ),
            (
                "A names a Widget export",
                ks("team-a", ea(widget_export)),
                deny("tenant-a", "Widget.zz.example.test"),
            ),
            (
                "A names a Widget shadow",
                ks("team-a", shadow(widget_export)),
                deny("tenant-a", "Widget.zz.example.test"),
            ),
            (
                "B names an HttpSource export",
                ks("team-b", ea(http_export)),
                deny("tenant-b", "HttpSource.source.openflux.dev"),
            ),
            (
                "B names its Widget export",
                ks("team-b", ea(widget_export)),
                None,
            ),
            (
                "a namespace no policy selects",
                ks("open", ea(widget_export)),
                None,
            ),
            (
                "A names a stock OCIRepository",
                ks("team-a", shadow("podinfo")),
                None,
            ),
            (
                "A names the export in B's namespace",
                ks(
                    "team-a",
                    json!({"kind": "ExternalArtifact", "name": widget_export, "namespace": "team-b"}),
                ),
                deny("tenant-a", "Widget.zz.example.test"),
            ),
            (
                "a HelmRelease chartRef",
                review(HR, "team-b", json!({"chartRef": ea(http_export)})),
                deny("tenant-b", "HttpSource.source.openflux.dev"),
            ),
            (
                "an ArtifactGenerator, one entry of two",
                review(
                    AG,
                    "team-a",
                    json!({"sources": [
            {"alias": "one", "kind": "ExternalArtifact", "name": http_export},
            {"alias": "two", "kind": "ExternalArtifact", "name": widget_export}]}),
                ),
                deny("tenant-a", "Widget.zz.example.test"),
            ),
        ];
        for (what, body, want) in cases {
            let what = format!("{what} ({widget_export})");
            let decision = validate(&body, &policies(), &Options::default());
            match want {
                None => assert_eq!(decision, Decision::Unchanged, "{what}"),
                Some((policy, kind)) => {
                    let message = denial(&decision);
                    assert!(
                        message.contains(&format!("SourcePolicy {policy} ")),
                        "{what}: {message}"
                    );
                    assert!(
                        message.contains(&format!("a source of kind {kind},")),
                        "{what}: {message}"
                    );
                }
            }
        }
    }
    // An export of a kind no API serves: the release before's name still
    // tells a group (none of them allowed); openflux's own cannot be told.
    let message = validate(
        &ks("team-a", ea("x.gizmo.new.example.test")),
        &policies(),
        &Options::default(),
    );
    assert!(
        denial(&message).contains("new.example.test,"),
        "{message:?}"
    );
    let gizmo = crate::names::identity::source_export_name("new.example.test", "Gizmo", "x");
    let message = validate(&ks("team-a", ea(&gizmo)), &policies(), &Options::default());
    assert!(
        denial(&message).contains("whose source kind openflux cannot tell"),
        "{message:?}"
    );
    assert_eq!(
        validate(&ks("open", ea(&gizmo)), &policies(), &Options::default()),
        Decision::Unchanged
    );
}

#[test]
fn the_cross_namespace_rule_holds_for_a_direct_reference() {
    let body = ks(
        "open",
        json!({"kind": "ExternalArtifact", "name": widget_export(), "namespace": "team-b"}),
    );
    let strict = Options {
        no_cross_namespace_refs: true,
    };
    assert_eq!(
        validate(&body, &policies(), &Options::default()),
        Decision::Unchanged
    );
    let message = denial(&validate(&body, &crate::policy::NONE, &strict)).to_string();
    assert!(message.contains("--no-cross-namespace-refs"), "{message}");
    // A stock source in another namespace is Flux's to judge.
    let stock = ks(
        "open",
        json!({"kind": "OCIRepository", "name": "podinfo", "namespace": "x"}),
    );
    assert_eq!(
        validate(&stock, &crate::policy::NONE, &strict),
        Decision::Unchanged
    );
}

#[test]
fn nothing_is_judged_before_the_policies_are_loaded_but_stock_references_pass() {
    let unsynced = Policies {
        synced: false,
        ..Policies::default()
    };
    let export = ks(
        "open",
        json!({"kind": "ExternalArtifact", "name": widget_export()}),
    );
    assert!(matches!(
        validate(&export, &unsynced, &Options::default()),
        Decision::Error { code: 503, .. }
    ));
    let stock = ks("open", json!({"kind": "OCIRepository", "name": "podinfo"}));
    assert_eq!(
        validate(&stock, &unsynced, &Options::default()),
        Decision::Unchanged
    );
    // Before the source kinds are known, only a restricted namespace waits.
    let (index, facts, policies) = (index(), Facts::default(), policies());
    let view = View {
        index: &index,
        facts: &facts,
        policies: &policies,
    };
    let decide_in = |ns: &str| {
        let body = ks(
            ns,
            json!({"kind": "ExternalArtifact", "name": widget_export()}),
        );
        decide(&review::parse(&body).unwrap(), view, &Options::default())
    };
    assert_eq!(decide_in("open"), Decision::Unchanged);
    assert!(matches!(
        decide_in("team-a"),
        Decision::Error { code: 503, .. }
    ));
}

#[test]
fn a_namespace_the_watch_has_not_seen_is_not_judged_without_its_labels() {
    // It may carry a policy's labels: not judged without them, on either
    // path (the API server's retry, or Flux's next reconcile, comes after
    // the watch has seen it).
    let export = ks(
        "brand-new",
        json!({"kind": "ExternalArtifact", "name": widget_export()}),
    );
    let validated = validate(&export, &policies(), &Options::default());
    assert!(
        matches!(validated, Decision::Error { code: 503, .. }),
        "{validated:?}"
    );
    let widget = json!({"kind": "Widget", "apiVersion": "zz.example.test/v1", "name": "w"});
    let mutated = mutate(&ks("brand-new", widget.clone()), &policies());
    assert!(
        matches!(mutated, Decision::Error { code: 503, .. }),
        "{mutated:?}"
    );
    // Without any policy there is nothing to wait for.
    let none = Policies {
        synced: true,
        ..Policies::default()
    };
    assert!(matches!(
        mutate(&ks("brand-new", widget), &none),
        Decision::Rewrite { .. }
    ));
}

#[test]
fn the_mutating_webhook_denies_its_own_rewrite_by_the_same_rule() {
    let http = json!({"kind": "HttpSource", "apiVersion": "source.openflux.dev/v1", "name": "web"});
    let widget = json!({"kind": "Widget", "apiVersion": "zz.example.test/v1", "name": "w"});
    assert!(matches!(
        mutate(&ks("team-a", http.clone()), &policies()),
        Decision::Rewrite { .. }
    ));
    assert!(matches!(
        mutate(&ks("team-b", widget.clone()), &policies()),
        Decision::Rewrite { .. }
    ));
    assert!(matches!(
        mutate(&ks("open", widget.clone()), &policies()),
        Decision::Rewrite { .. }
    ));
    let denied = mutate(&ks("team-b", http), &policies());
    assert_eq!(
        denial(&denied),
        format!("openflux: Kustomization team-b/app refers to HttpSource team-b/web (exported as \
         {}) in spec.sourceRef, a source of kind HttpSource.source.openflux.dev, \
         which SourcePolicy tenant-b (selecting namespace team-b) does not allow; use a source of an allowed \
         kind, or ask an administrator to allow HttpSource.source.openflux.dev for this namespace", exports()[0].0)
    );
    let denied = mutate(&ks("team-a", widget), &policies());
    assert!(denial(&denied).contains("SourcePolicy tenant-a "));
    // Without policies the rewrite is what it always was.
    let http = json!({"kind": "HttpSource", "apiVersion": "source.openflux.dev/v1", "name": "web"});
    assert!(matches!(
        mutate(&ks("team-b", http), &crate::policy::NONE),
        Decision::Rewrite { .. }
    ));
}

#[test]
fn only_a_consumer_being_created_or_updated_in_a_namespace_is_judged() {
    let policies = policies();
    let options = Options::default();
    let export = &exports()[0];
    let body = |f: &dyn Fn(&mut Value)| {
        let mut review: Value = serde_json::from_slice(&ks(
            "team-a",
            json!({"kind": "OCIRepository", "name": export.1}),
        ))
        .unwrap();
        f(&mut review["request"]);
        serde_json::to_vec(&review).unwrap()
    };
    let error = |decision: Decision| match decision {
        Decision::Error { code: 400, message } => message,
        other => panic!("not a bad request: {other:?}"),
    };

    let pods = validate(
        &body(&|r| r["resource"] = json!({"group": "", "version": "v1", "resource": "pods"})),
        &policies,
        &options,
    );
    assert_eq!(
        error(pods),
        "openflux does not validate resource pods.; check the rules of its validating webhook configuration"
    );
    let no_namespace = validate(
        &body(&|r| {
            r["namespace"] = json!("");
            r["object"]["metadata"]["namespace"] = Value::Null;
        }),
        &policies,
        &options,
    );
    assert_eq!(error(no_namespace), "the Kustomization has no namespace");
    let no_object = validate(&body(&|r| r["object"] = Value::Null), &policies, &options);
    assert_eq!(error(no_object), "the admission request carries no object");

    denial(&validate(&body(&|_| {}), &policies, &options));
    type Change<'c> = &'c dyn Fn(&mut Value);
    let unjudged: [(&str, Change); 3] = [
        ("a delete", &|r: &mut Value| {
            r["operation"] = json!("DELETE")
        }),
        ("the status subresource", &|r: &mut Value| {
            r["subResource"] = json!("status")
        }),
        ("an object being deleted", &|r: &mut Value| {
            r["object"]["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z")
        }),
    ];
    for (what, change) in unjudged {
        assert_eq!(
            validate(&body(change), &policies, &options),
            Decision::Unchanged,
            "{what} is not judged"
        );
    }
}

/// `levels` objects, each the only value of the one before:
/// `{"l": {"l": ... "leaf" ...}}`.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!("leaf"), |inner, _| json!({ "l": inner }))
}

/// A review of an Artifact whose `spec.exportedInputs` has `levels` levels.
fn deep_artifact(operation: &str, levels: usize) -> Vec<u8> {
    let spec = json!({"url": "http://store/a.tar.gz", "revision": "v1", "digest": "sha256:00"});
    let mut review: Value = serde_json::from_slice(&review(
        ("openflux.dev", "v1alpha1", "artifacts"),
        "apps",
        spec,
    ))
    .unwrap();
    // Put in as a value: reading it from text would meet serde_json's limit.
    review["request"]["object"]["spec"]["exportedInputs"] = nested(levels);
    review["request"]["operation"] = json!(operation);
    if operation == "UPDATE" {
        let mut old = review["request"]["object"].clone();
        old["spec"]["exportedInputs"] = json!({"env": "dev"});
        review["request"]["oldObject"] = old;
    }
    serde_json::to_vec(&review).unwrap()
}

/// An Artifact the controllers could not decode (nested past serde_json's
/// recursion limit, which the API server does not have) is refused at
/// admission by both webhooks, with a message that names the field; the
/// review is still read, and the answer is a refusal, never an admission.
#[test]
fn an_artifact_the_controllers_cannot_decode_is_refused() {
    let policies = policies();
    let options = Options::default();
    let fits = crate::watch::depth::MAX_DEPTH - 2;
    for (operation, levels) in [
        ("CREATE", 130),
        ("UPDATE", 130),
        ("CREATE", fits + 1),
        ("CREATE", 1000),
    ] {
        let body = deep_artifact(operation, levels);
        let (index, facts) = (index(), facts());
        let view = View {
            index: &index,
            facts: &facts,
            policies: &policies,
        };
        let answer = crate::webhook::answer::answer(&body, view, &options);
        let review: Value = serde_json::from_slice(answer.review.as_ref().unwrap()).unwrap();
        assert_eq!(
            review["response"]["allowed"],
            json!(false),
            "{operation}: {review}"
        );
        let message = review["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("spec.exportedInputs") && message.contains("cannot decode"),
            "{operation}: {message}"
        );
        assert!(message.contains("apps/app"), "{message}");
        let validated = validate(&body, &policies, &options);
        assert_eq!(denial(&validated), message, "{operation}");
    }
    // One that fits is admitted (and stamped with its writer).
    let body = deep_artifact("CREATE", fits);
    assert!(matches!(mutate(&body, &policies), Decision::Rewrite { .. }));
    assert_eq!(validate(&body, &policies, &options), Decision::Unchanged);
}
