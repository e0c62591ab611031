//! The tenant policy: which custom source kinds the consumers of a namespace
//! may deploy from, decided from the SourcePolicies and the namespace's
//! labels (both kept by watches, [`watch`]). Pure apart from [`watch`].
//!
//! Semantics as NetworkPolicy isolates Pods: a namespace no policy selects
//! may use every kind; a namespace selected by one or more policies may use
//! only the kinds those policies allow together (their union). The rule is
//! judged on the final reference, the export a consumer points at, whether
//! openflux's mutating webhook wrote it or a person did
//! ([`candidates`] says which source kinds an export name may stand for).

pub mod candidates;
pub mod watch;

use std::collections::BTreeMap;
use std::fmt;

use crate::api::policy::{
    AllowedKind, NamespaceSelector, SelectorOperator, SourcePolicy, ANY_KIND,
};

/// One SourcePolicy as the decision reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub selector: NamespaceSelector,
    pub allowed: Vec<AllowedKind>,
}

impl From<&SourcePolicy> for Rule {
    fn from(policy: &SourcePolicy) -> Self {
        Rule {
            name: policy.metadata.name.clone().unwrap_or_default(),
            selector: policy.spec.namespace_selector.clone(),
            allowed: policy.spec.allowed_kinds.clone(),
        }
    }
}

impl Rule {
    /// Whether this policy selects a namespace with `labels`.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        selects(&self.selector, labels)
    }

    /// Whether this policy allows `kind` of `group`. Kinds compare without
    /// regard to case (an export's name carries the kind in lower case, and
    /// Kubernetes serves no two kinds of one group that differ only so).
    pub fn allows(&self, group: &str, kind: &str) -> bool {
        self.allowed
            .iter()
            .any(|a| a.group == group && (a.kind == ANY_KIND || a.kind.eq_ignore_ascii_case(kind)))
    }
}

/// Whether `selector` selects an object with `labels`, as the API server
/// reads a `metav1.LabelSelector` (the empty selector selects everything;
/// `In` with no values selects nothing, `NotIn` with none everything).
pub fn selects(selector: &NamespaceSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().all(|r| {
            let value = labels.get(&r.key);
            match r.operator {
                SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
                SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                SelectorOperator::Exists => value.is_some(),
                SelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

/// A custom source kind a reference may stand for: `group`, and `kind` as
/// written or as an export's name spells it (lower case).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SourceKind {
    pub group: String,
    pub kind: String,
}

impl SourceKind {
    pub fn new(group: impl Into<String>, kind: impl Into<String>) -> Self {
        SourceKind {
            group: group.into(),
            kind: kind.into(),
        }
    }
}

impl fmt::Display for SourceKind {
    /// `Kind.group`, the way `kubectl` spells a resource.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.kind, self.group)
    }
}

/// What the policies say about one reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No policy selects the namespace: every kind is allowed.
    Unrestricted,
    /// The policies that select the namespace allow it.
    Allowed,
    /// The policies that select the namespace (`policies`, sorted) do not
    /// allow `kind`. `kind` is `None` when the reference's source kind could
    /// not be told at all.
    Denied {
        policies: Vec<String>,
        kind: Option<SourceKind>,
    },
}

/// The SourcePolicies and the namespaces' labels, as the watches last saw
/// them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policies {
    /// Whether both watches have listed once; until then nothing is judged.
    pub synced: bool,
    /// The SourcePolicies, by name.
    pub rules: BTreeMap<String, Rule>,
    /// Labels of each namespace, by name.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
}

/// No policies: what a webhook without watches (tests, benchmarks) judges by.
pub static NONE: Policies = Policies {
    synced: true,
    rules: BTreeMap::new(),
    namespaces: BTreeMap::new(),
};

impl Policies {
    /// The policies selecting `namespace`, by name. A namespace the watch
    /// has not seen is judged with no labels: the policies with an empty
    /// selector (or only absence requirements) still select it.
    pub fn selecting(&self, namespace: &str) -> Vec<&Rule> {
        let empty = BTreeMap::new();
        let labels = self.namespaces.get(namespace).unwrap_or(&empty);
        self.rules.values().filter(|r| r.selects(labels)).collect()
    }

    /// Whether the namespace's labels are known, or need not be (no policy
    /// exists). A namespace created a moment ago may not have reached the
    /// watch yet; judging it without its labels could miss the policies
    /// that select it, so it is not judged until it has.
    pub fn knows(&self, namespace: &str) -> bool {
        self.rules.is_empty() || self.namespaces.contains_key(namespace)
    }

    /// Whether any policy selects `namespace`: the cheap test before the
    /// candidates of a reference are worked out.
    pub fn restricts(&self, namespace: &str) -> bool {
        !self.selecting(namespace).is_empty()
    }

    /// The verdict on a reference from `namespace` whose source is one of
    /// `candidates` (empty: unknown). Every candidate must be allowed: a
    /// reference is allowed only when whatever it may stand for is.
    pub fn judge(&self, namespace: &str, candidates: &[SourceKind]) -> Verdict {
        let rules = self.selecting(namespace);
        if rules.is_empty() {
            return Verdict::Unrestricted;
        }
        let denied = |kind: Option<SourceKind>| Verdict::Denied {
            policies: rules.iter().map(|r| r.name.clone()).collect(),
            kind,
        };
        if candidates.is_empty() {
            return denied(None);
        }
        for c in candidates {
            if !rules.iter().any(|r| r.allows(&c.group, &c.kind)) {
                return denied(Some(c.clone()));
            }
        }
        Verdict::Allowed
    }
}

/// The denial of a reference to `what` from `display` (`Kind ns/name` of the
/// consumer, in `namespace`) in `field`, in the words of openflux's other
/// denials.
pub fn denial(
    display: &str,
    namespace: &str,
    field: &str,
    what: &str,
    verdict: &Verdict,
) -> Option<String> {
    let Verdict::Denied { policies, kind } = verdict else {
        return None;
    };
    let (noun, list) = match policies.as_slice() {
        [one] => ("SourcePolicy", one.clone()),
        many => ("SourcePolicies", many.join(", ")),
    };
    Some(match kind {
        Some(kind) => format!(
            "openflux: {display} refers to {what} in {field}, a source of kind {kind}, which {noun} {list} \
             (selecting namespace {namespace}) does not allow; use a source of an allowed kind, or ask an \
             administrator to allow {kind} for this namespace"
        ),
        None => format!(
            "openflux: {display} refers to {what} in {field}, whose source kind openflux cannot tell, and \
             {noun} {list} (selecting namespace {namespace}) restricts source kinds; refer to the source \
             itself instead of its export"
        ),
    })
}

#[cfg(test)]
mod tests;
