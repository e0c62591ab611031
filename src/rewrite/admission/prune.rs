//! Reading an admission request's objects without building the whole JSON
//! tree: only what the decision reads is kept (the identity and the
//! openflux annotations under `metadata`, and each consumer's reference
//! fields, whole); everything else is skipped as it is parsed. A 3 MiB
//! HelmRelease whose values the decision never looks at costs no tree.
//!
//! What is kept answers every question the decision asks exactly as the
//! full object would: a kept field is the same value; an object on the way
//! to a kept field keeps only the fields on the way; any other value on the
//! way keeps its type's answers (`null` stays null, a scalar stays itself,
//! a list becomes an empty list, so `get`, `is_object` and `is_null` say
//! the same).
//!
//! One exception, so that reading never fails on depth: a kept value is
//! kept down to one level past [`MAX_DEPTH`] of its object (the object
//! itself being level 1), and an object or list at that level is kept
//! empty. An object kept so nests deeper than any object openflux's
//! controllers can decode, which the decision refuses for an Artifact
//! ([`crate::rewrite::writer`]); without the cut serde_json would stop at
//! its own limit (counted from the AdmissionReview, two levels above the
//! object) and the request could not be read at all.

use std::fmt;
use std::sync::OnceLock;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::api::SOURCE_REF_ANNOTATION;
use crate::export::trust::EXPORT_INPUTS;
use crate::vocabulary::consumers::CONSUMERS;
use crate::vocabulary::marks::WRITER_ANNOTATION;
use crate::watch::depth::MAX_DEPTH;

/// Which parts of a value to keep.
#[derive(Debug, Default)]
pub struct Keep {
    /// Keep the value as it is.
    whole: bool,
    /// Otherwise keep these fields of an object: a handful, so a list
    /// whose names are compared length first finds a key (or its absence)
    /// with fewer comparisons than a map.
    fields: Vec<(&'static str, Keep)>,
}

impl Keep {
    fn path(&mut self, path: &[&'static str]) {
        let Some((first, rest)) = path.split_first() else {
            self.whole = true;
            return;
        };
        let at = match self.fields.iter().position(|(name, _)| name == first) {
            Some(at) => at,
            None => {
                self.fields.push((first, Keep::default()));
                self.fields.len() - 1
            }
        };
        self.fields[at].1.path(rest);
    }

    /// The field `name` is kept as, if it is.
    fn field(&self, name: &str) -> Option<(&'static str, &Keep)> {
        self.fields
            .iter()
            .find(|(kept, _)| kept.len() == name.len() && *kept == name)
            .map(|(kept, keep)| (*kept, keep))
    }
}

/// What the decision reads of an object: derived from the consumer table,
/// so a consumer added there is read whole where its references are.
pub fn object_keep() -> &'static Keep {
    static KEEP: OnceLock<Keep> = OnceLock::new();
    KEEP.get_or_init(|| {
        let mut keep = Keep::default();
        for field in ["name", "namespace", "generateName", "deletionTimestamp"] {
            keep.path(&["metadata", field]);
        }
        keep.path(&["metadata", "annotations", SOURCE_REF_ANNOTATION]);
        // An Artifact's recorded writer (the webhook overwrites it), and
        // what an export of it is made of (a change records a new writer):
        // small fields, named by no consumer's schema but the Artifact's.
        keep.path(&["metadata", "annotations", WRITER_ANNOTATION]);
        for path in EXPORT_INPUTS {
            keep.path(path);
        }
        for consumer in &CONSUMERS {
            keep.path(consumer.refs.path);
            if let Some(forbidden) = &consumer.forbidden {
                keep.path(forbidden.field.path);
            }
        }
        keep
    })
}

/// Deserializes an object keeping what `Keep` says.
pub struct Pruned<'k>(pub &'k Keep);

impl<'de> DeserializeSeed<'de> for Pruned<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        Within {
            keep: self.0,
            level: 1,
        }
        .deserialize(deserializer)
    }
}

/// [`Pruned`] for a value at `level` of its object (the object is 1).
struct Within<'k> {
    keep: &'k Keep,
    level: usize,
}

impl<'de> DeserializeSeed<'de> for Within<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        if self.keep.whole {
            return Bounded(self.level).deserialize(deserializer);
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Within<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::Array(Vec::new()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut kept = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed(self.keep))? {
            match key {
                Some((name, keep)) => {
                    let value = map.next_value_seed(Within {
                        keep,
                        level: self.level + 1,
                    })?;
                    kept.insert(name.to_string(), value);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(kept))
    }
}

/// A value kept whole, read as `serde_json::Value` reads it, except that
/// an object or list past [`MAX_DEPTH`] is kept empty (its contents
/// skipped, which serde_json does without recursing).
struct Bounded(usize);

impl<'de> DeserializeSeed<'de> for Bounded {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut kept = Vec::new();
        if self.0 > MAX_DEPTH {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(Value::Array(kept));
        }
        while let Some(value) = seq.next_element_seed(Bounded(self.0 + 1))? {
            kept.push(value);
        }
        Ok(Value::Array(kept))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut kept = Map::new();
        if self.0 > MAX_DEPTH {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(Value::Object(kept));
        }
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(Bounded(self.0 + 1))?;
            kept.insert(key, value);
        }
        Ok(Value::Object(kept))
    }
}

/// Reads an object key and looks it up among the fields to keep, without
/// copying it: a key the decision does not read costs no allocation.
struct KeySeed<'k>(&'k Keep);

impl<'de, 'k> DeserializeSeed<'de> for KeySeed<'k> {
    type Value = Option<(&'static str, &'k Keep)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'k> Visitor<'_> for KeySeed<'k> {
    type Value = Option<(&'static str, &'k Keep)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.field(v))
    }
}

/// What openflux reads of `request.userInfo`: who wrote an Artifact
/// ([`crate::export::trust::Writer::from_user_info`]). The rest (`extra`,
/// a service account's credential and Pod) is skipped.
pub fn user_keep() -> &'static Keep {
    static KEEP: OnceLock<Keep> = OnceLock::new();
    KEEP.get_or_init(|| {
        let mut keep = Keep::default();
        for field in ["username", "uid", "groups"] {
            keep.path(&[field]);
        }
        keep
    })
}

/// `serde(deserialize_with)` for an optional object read through
/// [`object_keep`].
pub fn pruned_object<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Value>, D::Error> {
    optional(deserializer, object_keep())
}

/// `serde(deserialize_with)` for an optional `userInfo` read through
/// [`user_keep`].
pub fn pruned_user<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    optional(deserializer, user_keep())
}

/// `null` or absent: `None`; anything else pruned by `keep`.
fn optional<'de, D: Deserializer<'de>>(
    deserializer: D,
    keep: &'static Keep,
) -> Result<Option<Value>, D::Error> {
    struct Optional(&'static Keep);
    impl<'de> Visitor<'de> for Optional {
        type Value = Option<Value>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object or null")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            Pruned(self.0).deserialize(d).map(Some)
        }
    }
    deserializer.deserialize_option(Optional(keep))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prune(value: &Value) -> Value {
        Pruned(object_keep()).deserialize(value.clone()).unwrap()
    }

    #[test]
    fn keeps_what_the_decision_reads_and_nothing_else() {
        let object = json!({
            "apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
            "metadata": {"name": "a", "namespace": "b", "labels": {"x": "y"},
                         "annotations": {"openflux.dev/source-ref": "{}", "big": "zzzz"}},
            "spec": {"values": {"huge": [1, 2, 3]}, "chartRef": {"kind": "X", "name": "y", "extra": [1]},
                     "chart": {"spec": {"chart": "c", "sourceRef": {"kind": "HelmRepository", "name": "r"}}}},
            "status": {"anything": true}
        });
        assert_eq!(
            prune(&object),
            json!({
                "metadata": {"name": "a", "namespace": "b", "labels": {},
                             "annotations": {"openflux.dev/source-ref": "{}"}},
                "spec": {"chartRef": {"kind": "X", "name": "y", "extra": [1]},
                         "chart": {"spec": {"sourceRef": {"kind": "HelmRepository", "name": "r"}}}}
            })
        );
    }

    #[test]
    fn other_values_on_the_way_keep_their_answers() {
        for (spec, kept) in [
            (json!(null), json!(null)),
            (json!("text"), json!("text")),
            (json!(7), json!(7)),
            (json!([{"sourceRef": 1}]), json!([])),
        ] {
            assert_eq!(prune(&json!({"spec": spec})), json!({"spec": kept}));
        }
        assert_eq!(prune(&json!([1, 2])), json!([]));
    }
}

#[cfg(test)]
mod depth_tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    /// An AdmissionReview's two levels above its object, as the webhook
    /// reads them.
    #[derive(Deserialize)]
    struct Review {
        request: Request,
    }
    #[derive(Deserialize)]
    struct Request {
        #[serde(deserialize_with = "pruned_object")]
        object: Option<Value>,
    }

    /// Objects or lists on the deepest path of `value`.
    fn depth(value: &Value) -> usize {
        match value {
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// A kept value nested past what the controllers read is kept to one
    /// level more, the object there empty, and reading never fails on
    /// depth, however deep the text: serde_json alone would stop at its
    /// limit (two levels sooner in a review than in the object alone).
    #[test]
    fn a_kept_value_is_kept_to_one_level_past_what_the_controllers_read() {
        for levels in [
            MAX_DEPTH - 3,
            MAX_DEPTH - 2,
            MAX_DEPTH - 1,
            126,
            200,
            100_000,
        ] {
            for (open, close) in [("{\"l\":", "}"), ("[", "]")] {
                let inputs = format!("{}1{}", open.repeat(levels), close.repeat(levels));
                let text = format!(
                    r#"{{"request": {{"object": {{"metadata": {{"name": "a", "managedFields": [{inputs}]}},
                       "spec": {{"url": "u", "exportedInputs": {inputs}}}}}}}}}"#
                );
                let review: Review = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{levels} levels of {open}: {e}"));
                let object = review.request.object.unwrap();
                // The object, spec, then the inputs.
                assert_eq!(
                    depth(&object),
                    (levels + 2).min(MAX_DEPTH + 1),
                    "{levels} levels of {open}"
                );
                assert_eq!(object["spec"]["url"], json!("u"));
                assert_eq!(object["metadata"], json!({"name": "a"}));
                if levels + 2 <= MAX_DEPTH {
                    let whole: Value = serde_json::from_str(&inputs).unwrap();
                    assert_eq!(object["spec"]["exportedInputs"], whole);
                }
            }
        }
    }
}

#[cfg(test)]
mod user_tests {
    use super::*;
    use serde_json::json;

    fn read(json: &str) -> Option<Value> {
        pruned_user(&mut serde_json::Deserializer::from_str(json)).unwrap()
    }

    #[test]
    fn keeps_who_the_user_is_and_skips_the_rest() {
        let user = r#"{"username": "system:serviceaccount:a:b", "uid": "u", "groups": ["g1", "g2"],
                       "extra": {"authentication.kubernetes.io/pod-name": ["p"], "deep": [[[[{"x": "\u00e9"}]]]]}}"#;
        assert_eq!(
            read(user),
            Some(
                json!({"username": "system:serviceaccount:a:b", "uid": "u", "groups": ["g1", "g2"]})
            )
        );
        assert_eq!(read("null"), None);
        assert_eq!(read(r#""text""#), Some(json!("text")));
        assert_eq!(read("{}"), Some(json!({})));
        // What is kept is kept whole, whatever its type.
        assert_eq!(
            read(r#"{"username": {"a": [1]}, "groups": "g"}"#),
            Some(json!({"username": {"a": [1]}, "groups": "g"}))
        );
        for broken in [
            r#"{"username": "a""#,
            r#"{"extra": [}"#,
            r#"{"extra": "\q"}"#,
        ] {
            assert!(
                pruned_user(&mut serde_json::Deserializer::from_str(broken)).is_err(),
                "{broken}"
            );
        }
    }
}
