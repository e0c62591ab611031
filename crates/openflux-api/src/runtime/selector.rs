//! Label selectors as `--watch-label-selector` takes them (the string form
//! of Kubernetes' `labels.Parse`): parsed once, then matched against an
//! object's labels in memory, as the API server would select it.
//!
//! A controller that watches some kinds through the selector and others
//! whole (a sharded controller that must see every object of a kind but
//! reconcile only its own) decides with [`LabelSelector::matches`] what the
//! API server decided for the filtered watches.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// `key`: the label is set.
    Exists(String),
    /// `!key`: the label is not set.
    DoesNotExist(String),
    /// `key=value`, `key==value`, `key in (a,b)`.
    In(String, Vec<String>),
    /// `key!=value`, `key notin (a,b)`: the label is absent or has another
    /// value.
    NotIn(String, Vec<String>),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
        }
    }
}

/// A parsed label selector: every requirement must hold. The empty selector
/// selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    text: String,
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Whether an object with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this is the empty selector (everything is selected).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The selector as it was written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for LabelSelector {
    type Err = String;

    /// Comma separated `key`, `!key`, `key=value`, `key==value`,
    /// `key!=value`, `key in (a,b)` and `key notin (a,b)`, as
    /// `metav1.ParseToLabelSelector` accepts them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |why: String| format!("invalid label selector {s:?}: {why}");
        let requirements = split_requirements(s)
            .into_iter()
            .map(|r| parse_requirement(r.trim()).map_err(invalid))
            .collect::<Result<_, _>>()?;
        Ok(LabelSelector {
            text: s.trim().to_string(),
            requirements,
        })
    }
}

/// Splits at the commas outside parentheses.
fn split_requirements(s: &str) -> Vec<&str> {
    if s.trim().is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_requirement(r: &str) -> Result<Requirement, String> {
    if let Some(key) = r.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok(Requirement::DoesNotExist(key.to_string()));
    }
    for op in ["==", "!=", "="] {
        if let Some((key, value)) = r.split_once(op) {
            let (key, value) = (key.trim(), value.trim());
            check_key(key)?;
            check_value(value)?;
            let values = vec![value.to_string()];
            return Ok(match op {
                "!=" => Requirement::NotIn(key.to_string(), values),
                _ => Requirement::In(key.to_string(), values),
            });
        }
    }
    for op in [" notin ", " in "] {
        if let Some((key, values)) = r.split_once(op) {
            let key = key.trim();
            check_key(key)?;
            let values = values.trim();
            let inner = values
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| format!("{op:?} needs a parenthesized list of values"))?;
            let values = inner
                .split(',')
                .map(|v| check_value(v.trim()).map(|()| v.trim().to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(match op {
                " notin " => Requirement::NotIn(key.to_string(), values),
                _ => Requirement::In(key.to_string(), values),
            });
        }
    }
    if r.contains(['<', '>', '(', ')', ' ']) {
        return Err(format!("cannot parse requirement {r:?}"));
    }
    check_key(r)?;
    Ok(Requirement::Exists(r.to_string()))
}

fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(format!("key prefix {prefix:?} is not a DNS subdomain"));
        }
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!("key {key:?} is not a valid label key"));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_value(value) {
        Ok(())
    } else {
        Err(format!("value {value:?} is not a valid label value"))
    }
}

/// 63 characters at most, alphanumerics with `-`, `_` and `.` inside.
fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        selector
            .parse::<LabelSelector>()
            .unwrap()
            .matches(&labels(pairs))
    }

    #[test]
    fn matches_as_the_api_server_selects() {
        const KEY: &str = "sharding.fluxcd.io/key";
        let none: &[(&str, &str)] = &[];
        let shard1 = &[(KEY, "shard1")];
        let shard2 = &[(KEY, "shard2")];
        // The selectors of Flux's sharding guide.
        assert!(selects("sharding.fluxcd.io/key=shard1", shard1));
        assert!(!selects("sharding.fluxcd.io/key=shard1", shard2));
        assert!(!selects("sharding.fluxcd.io/key=shard1", none));
        assert!(selects("!sharding.fluxcd.io/key", none));
        assert!(!selects("!sharding.fluxcd.io/key", shard1));
        assert!(selects(
            "sharding.fluxcd.io/key in (shard1, shard2)",
            shard2
        ));
        assert!(!selects("sharding.fluxcd.io/key in (shard1)", shard2));
        assert!(selects("sharding.fluxcd.io/key notin (shard1)", shard2));
        assert!(selects("sharding.fluxcd.io/key notin (shard1)", none));
        assert!(selects("sharding.fluxcd.io/key!=shard1", none));
        assert!(!selects("sharding.fluxcd.io/key!=shard1", shard1));
        assert!(selects("sharding.fluxcd.io/key==shard1", shard1));
        assert!(selects("sharding.fluxcd.io/key", shard2));
        assert!(!selects("sharding.fluxcd.io/key", none));
        // Every requirement must hold; the empty selector selects all.
        assert!(selects("a=1, !b", &[("a", "1")]));
        assert!(!selects("a=1,!b", &[("a", "1"), ("b", "")]));
        assert!(selects("", shard1));
        assert!("".parse::<LabelSelector>().unwrap().is_empty());
        assert_eq!(
            " a = 1 ".parse::<LabelSelector>().unwrap().requirements(),
            [Requirement::In("a".into(), vec!["1".into()])]
        );
    }

    #[test]
    fn rejects_what_kubernetes_rejects() {
        for bad in ["a b", "a in b", "a in (b c)", "-a=b", "a=-b", "a/=b", "a>1"] {
            let err = bad.parse::<LabelSelector>().unwrap_err();
            assert!(err.contains("invalid label selector"), "{bad:?}: {err}");
        }
    }
}
