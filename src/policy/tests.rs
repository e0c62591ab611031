use std::collections::BTreeMap;

use serde_json::json;

use super::*;

fn rule(name: &str, selector: serde_json::Value, allowed: &[(&str, &str)]) -> Rule {
    Rule {
        name: name.into(),
        selector: serde_json::from_value(selector).unwrap(),
        allowed: allowed
            .iter()
            .map(|(g, k)| AllowedKind {
                group: g.to_string(),
                kind: k.to_string(),
            })
            .collect(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn policies(rules: Vec<Rule>) -> Policies {
    Policies {
        synced: true,
        rules: rules.into_iter().map(|r| (r.name.clone(), r)).collect(),
        namespaces: [
            ("team-a", labels(&[("team", "a"), ("env", "prod")])),
            ("team-b", labels(&[("team", "b")])),
            ("plain", labels(&[])),
        ]
        .into_iter()
        .map(|(n, l)| (n.to_string(), l))
        .collect(),
    }
}

fn k(group: &str, kind: &str) -> SourceKind {
    SourceKind::new(group, kind)
}

fn denied(policies: &[&str], kind: Option<SourceKind>) -> Verdict {
    Verdict::Denied {
        policies: policies.iter().map(|p| p.to_string()).collect(),
        kind,
    }
}

const HTTP: (&str, &str) = ("source.openflux.dev", "HttpSource");

#[test]
fn the_policies_decide_as_network_policies_isolate() {
    let team_a = || rule("team-a", json!({"matchLabels": {"team": "a"}}), &[HTTP]);
    let widgets = || {
        rule(
            "widgets",
            json!({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}),
            &[("zz.example.test", "Widget")],
        )
    };
    let gadgets_everything = || rule("gadgets", json!({}), &[("gadgets.example.test", "*")]);
    let http = k(HTTP.0, HTTP.1);
    let widget = k("zz.example.test", "Widget");
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Vec<Rule>, &str, Vec<SourceKind>, Verdict)> = vec![
        (
            "no policy: every kind",
            vec![],
            "team-a",
            vec![widget.clone()],
            Verdict::Unrestricted,
        ),
        (
            "no policy, unknown kind",
            vec![],
            "team-a",
            vec![],
            Verdict::Unrestricted,
        ),
        (
            "a policy that selects other namespaces",
            vec![team_a()],
            "team-b",
            vec![widget.clone()],
            Verdict::Unrestricted,
        ),
        (
            "a namespace the watch has not seen, label selector",
            vec![team_a()],
            "new",
            vec![widget.clone()],
            Verdict::Unrestricted,
        ),
        (
            "one policy allows its kind",
            vec![team_a()],
            "team-a",
            vec![http.clone()],
            Verdict::Allowed,
        ),
        (
            "one policy denies another kind",
            vec![team_a()],
            "team-a",
            vec![widget.clone()],
            denied(&["team-a"], Some(widget.clone())),
        ),
        (
            "same kind, another group",
            vec![team_a()],
            "team-a",
            vec![k("other.example.test", "HttpSource")],
            denied(&["team-a"], Some(k("other.example.test", "HttpSource"))),
        ),
        (
            "kind spelled in lower case, as export names spell it",
            vec![team_a()],
            "team-a",
            vec![k(HTTP.0, "httpsource")],
            Verdict::Allowed,
        ),
        (
            "two overlapping policies allow the union",
            vec![team_a(), widgets()],
            "team-a",
            vec![widget.clone()],
            Verdict::Allowed,
        ),
        (
            "two overlapping policies, the first's kind",
            vec![team_a(), widgets()],
            "team-a",
            vec![http.clone()],
            Verdict::Allowed,
        ),
        (
            "two policies, only one selects",
            vec![team_a(), widgets()],
            "team-b",
            vec![http.clone()],
            denied(&["widgets"], Some(http.clone())),
        ),
        (
            "both named when neither allows",
            vec![widgets(), team_a()],
            "team-a",
            vec![k("q.example.test", "Queue")],
            denied(&["team-a", "widgets"], Some(k("q.example.test", "Queue"))),
        ),
        (
            "empty selector selects every namespace",
            vec![gadgets_everything()],
            "plain",
            vec![widget.clone()],
            denied(&["gadgets"], Some(widget.clone())),
        ),
        (
            "empty selector selects unseen namespaces",
            vec![gadgets_everything()],
            "new",
            vec![k("gadgets.example.test", "Gizmo")],
            Verdict::Allowed,
        ),
        (
            "wildcard is one group only",
            vec![gadgets_everything()],
            "plain",
            vec![k("example.test", "Gizmo")],
            denied(&["gadgets"], Some(k("example.test", "Gizmo"))),
        ),
        (
            "every candidate must be allowed",
            vec![team_a()],
            "team-a",
            vec![http.clone(), widget.clone()],
            denied(&["team-a"], Some(widget.clone())),
        ),
        (
            "no candidate can be told",
            vec![team_a()],
            "team-a",
            vec![],
            denied(&["team-a"], None),
        ),
        (
            "a policy allowing nothing",
            vec![rule(
                "lockdown",
                json!({"matchLabels": {"env": "prod"}}),
                &[],
            )],
            "team-a",
            vec![http.clone()],
            denied(&["lockdown"], Some(http.clone())),
        ),
        (
            "lockdown plus an allowing policy",
            vec![
                rule("lockdown", json!({"matchLabels": {"env": "prod"}}), &[]),
                team_a(),
            ],
            "team-a",
            vec![http.clone()],
            Verdict::Allowed,
        ),
    ];
    for (what, rules, namespace, candidates, want) in cases {
        assert_eq!(
            policies(rules).judge(namespace, &candidates),
            want,
            "{what}"
        );
    }
}

#[test]
fn selectors_read_as_the_api_server_reads_them() {
    let l = labels(&[("team", "a"), ("env", "prod"), ("empty", "")]);
    let cases: Vec<(serde_json::Value, bool)> = vec![
        (json!({}), true),
        (json!({"matchLabels": {"team": "a"}}), true),
        (json!({"matchLabels": {"team": "b"}}), false),
        (json!({"matchLabels": {"team": "a", "env": "dev"}}), false),
        (json!({"matchLabels": {"empty": ""}}), true),
        (json!({"matchLabels": {"missing": ""}}), false),
        (
            json!({"matchExpressions": [{"key": "team", "operator": "In", "values": ["b", "a"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "team", "operator": "In", "values": []}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "missing", "operator": "NotIn", "values": ["a"]}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": []}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "env", "operator": "Exists"}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "missing", "operator": "Exists"}]}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "missing", "operator": "DoesNotExist"}]}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]}),
            false,
        ),
        (
            json!({"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "env", "operator": "In", "values": ["dev"]}]}),
            false,
        ),
    ];
    for (selector, want) in cases {
        let parsed: NamespaceSelector = serde_json::from_value(selector.clone()).unwrap();
        assert_eq!(selects(&parsed, &l), want, "{selector}");
    }
}

#[test]
fn denials_name_the_policies_the_kind_and_the_way_out() {
    let one = denial(
        "Kustomization team-a/app",
        "team-a",
        "spec.sourceRef",
        "Widget team-a/w",
        &denied(&["team-a"], Some(k("zz.example.test", "Widget"))),
    )
    .unwrap();
    assert_eq!(
        one,
        "openflux: Kustomization team-a/app refers to Widget team-a/w in spec.sourceRef, a source of kind \
         Widget.zz.example.test, which SourcePolicy team-a (selecting namespace team-a) does not allow; use a \
         source of an allowed kind, or ask an administrator to allow Widget.zz.example.test for this namespace"
    );
    let two = denial("K ns/x", "ns", "f", "w", &denied(&["a", "b"], None)).unwrap();
    assert!(two.contains("SourcePolicies a, b"), "{two}");
    assert!(two.contains("cannot tell"), "{two}");
    assert_eq!(denial("K ns/x", "ns", "f", "w", &Verdict::Allowed), None);
    assert_eq!(
        denial("K ns/x", "ns", "f", "w", &Verdict::Unrestricted),
        None
    );
}

#[test]
fn a_namespace_not_seen_yet_is_known_only_while_no_policy_exists() {
    let none = policies(vec![]);
    assert!(none.knows("new"));
    let some = policies(vec![rule(
        "team-a",
        json!({"matchLabels": {"team": "a"}}),
        &[HTTP],
    )]);
    assert!(!some.knows("new"));
    assert!(some.knows("plain"));
}
