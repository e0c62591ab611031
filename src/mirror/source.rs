//! A stock Flux source as the mirror reads it: [`FluxSource`] as it comes
//! off the wire (the watch needs its metadata), and [`Source`], what the
//! mirror keeps of it: its identity, the labels the mirror reads and its
//! `status.artifact` as one JSON text, nothing else.
//!
//! Thousands of sources sit in the mirror's store at once, so a kept source
//! is small: its namespace and name are shared with the wakes and the
//! backlog that name it, and it carries no `ObjectMeta` (15 fields' room,
//! about 340 bytes, to use 4). The kind a watched object belongs to is
//! shared too ([`SourceKind`]): one pointer, not the five strings of an
//! `ApiResource`.

use std::borrow::Cow;
use std::sync::Arc;

use kube::api::ObjectMeta;
use kube::core::{ApiResource, DynamicResourceScope};
use kube::Resource;
use serde::{Deserialize, Deserializer};

use crate::api::MANAGED_BY_LABEL;
use crate::shard::SHARD_LABEL;
use crate::vocabulary::marks::SHADOW_LABEL;
use crate::vocabulary::uid::Uid;

/// One stock source object as the watch reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FluxSource {
    pub metadata: ObjectMeta,
    /// `status.artifact` as JSON text; none when the source has no artifact.
    pub artifact: Option<Box<str>>,
}

/// What the mirror keeps of one stock source: everything it decides from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// Shared with the wakes and the backlog that name the source (the
    /// owner index's `Text`).
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub uid: Option<Uid>,
    pub labels: SourceLabels,
    /// `status.artifact` as JSON text; none when the source has no artifact.
    pub artifact: Option<Box<str>>,
}

/// The labels of a source the mirror reads: whether openflux made it
/// (managed-by and the shadow label) and its shard. Sources applied by Flux
/// carry labels of their own; a map of even one label costs a few hundred
/// bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceLabels {
    pub managed_by: Option<Box<str>>,
    pub shadow: bool,
    pub shard: Option<Box<str>>,
}

impl Source {
    /// What the mirror keeps of `source`, with `namespace` as the text of
    /// its namespace (shared by the store).
    pub fn in_namespace(source: &FluxSource, namespace: Arc<str>) -> Self {
        let meta = &source.metadata;
        Source {
            namespace,
            name: meta.name.as_deref().unwrap_or_default().into(),
            uid: meta.uid.as_deref().map(Uid::new),
            labels: meta
                .labels
                .as_ref()
                .map(SourceLabels::of)
                .unwrap_or_default(),
            artifact: source.artifact.clone(),
        }
    }

    /// The source's namespace and name, what tells it apart.
    pub fn key(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

impl SourceLabels {
    pub fn of(labels: &std::collections::BTreeMap<String, String>) -> Self {
        SourceLabels {
            managed_by: labels.get(MANAGED_BY_LABEL).map(|v| v.as_str().into()),
            shadow: labels.contains_key(SHADOW_LABEL),
            shard: labels.get(SHARD_LABEL).map(|v| v.as_str().into()),
        }
    }
}

impl From<&FluxSource> for Source {
    fn from(source: &FluxSource) -> Self {
        let namespace = source.metadata.namespace.as_deref().unwrap_or_default();
        Source::in_namespace(source, namespace.into())
    }
}

/// The kind of a [`FluxSource`] as the API server serves it: group,
/// version, kind and plural, shared by every reference to such a source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceKind(pub Arc<ApiResource>);

impl SourceKind {
    pub fn new(resource: ApiResource) -> Self {
        Self(Arc::new(resource))
    }
}

impl Resource for FluxSource {
    type DynamicType = SourceKind;
    type Scope = DynamicResourceScope;

    fn kind(dt: &SourceKind) -> Cow<'_, str> {
        dt.0.kind.as_str().into()
    }

    fn group(dt: &SourceKind) -> Cow<'_, str> {
        dt.0.group.as_str().into()
    }

    fn version(dt: &SourceKind) -> Cow<'_, str> {
        dt.0.version.as_str().into()
    }

    fn api_version(dt: &SourceKind) -> Cow<'_, str> {
        dt.0.api_version.as_str().into()
    }

    fn plural(dt: &SourceKind) -> Cow<'_, str> {
        dt.0.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Reads of `metadata` the identity, the labels and the resource version
/// (the watch needs it), and of the rest only `status.artifact`: the
/// managed fields, annotations, spec and other status fields are skipped
/// without being built. A status that is not an object counts as no status,
/// so one odd object cannot fail a whole list.
impl<'de> Deserialize<'de> for FluxSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            name: Option<String>,
            namespace: Option<String>,
            uid: Option<String>,
            resource_version: Option<String>,
            labels: Option<std::collections::BTreeMap<String, String>>,
        }
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Meta,
            #[serde(default)]
            status: Option<serde_json::Value>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let meta = wire.metadata;
        let artifact = wire
            .status
            .as_ref()
            .and_then(|s| s.get("artifact"))
            .filter(|a| !a.is_null())
            .map(|a| a.to_string().into_boxed_str());
        Ok(FluxSource {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                labels: meta.labels,
                ..ObjectMeta::default()
            },
            artifact,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::GroupVersionKind;
    use kube::ResourceExt;
    use serde_json::json;

    #[test]
    fn keeps_identity_labels_and_the_artifact_text_only() {
        let s: FluxSource = serde_json::from_value(json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "GitRepository",
            "metadata": {"name": "podinfo", "namespace": "apps", "uid": "u-1",
                         "resourceVersion": "7", "labels": {"a": "b"},
                         "annotations": {"c": "d"}, "generation": 3,
                         "managedFields": [{"manager": "source-controller", "fieldsV1": {"f:status": {}}}]},
            "spec": {"url": "https://example.com/podinfo.git", "interval": "1m"},
            "status": {"artifact": {"revision": "main@sha1:abc", "size": 1},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        assert_eq!(
            (s.name_any(), s.namespace(), s.uid()),
            ("podinfo".into(), Some("apps".into()), Some("u-1".into()))
        );
        assert_eq!(s.resource_version().as_deref(), Some("7"));
        assert_eq!(s.labels()["a"], "b");
        let meta = &s.metadata;
        assert_eq!(
            (&meta.annotations, &meta.managed_fields, meta.generation),
            (&None, &None, None),
            "read though the mirror never uses them"
        );
        let artifact: serde_json::Value =
            serde_json::from_str(s.artifact.as_deref().unwrap()).unwrap();
        assert_eq!(artifact, json!({"revision": "main@sha1:abc", "size": 1}));
    }

    #[test]
    fn a_kept_source_holds_what_the_mirror_reads() {
        let s: FluxSource = serde_json::from_value(json!({
            "metadata": {"name": "podinfo", "namespace": "apps", "uid": "u-1",
                         "resourceVersion": "7", "annotations": {"a": "b"},
                         "labels": {"app.kubernetes.io/managed-by": "openflux",
                                    "openflux.dev/shadow": "", "sharding.fluxcd.io/key": "s1",
                                    "kustomize.toolkit.fluxcd.io/name": "apps"}},
            "status": {"artifact": {"revision": "r"}},
        }))
        .unwrap();
        let kept = Source::from(&s);
        assert_eq!((&*kept.namespace, &*kept.name), ("apps", "podinfo"));
        assert_eq!(kept.uid, Some(Uid::new("u-1")));
        assert_eq!(kept.artifact, s.artifact);
        assert_eq!(
            kept.labels,
            SourceLabels {
                managed_by: Some("openflux".into()),
                shadow: true,
                shard: Some("s1".into()),
            }
        );
        let bare: FluxSource =
            serde_json::from_value(json!({"metadata": {"name": "n", "namespace": "ns"}})).unwrap();
        assert_eq!(Source::from(&bare).labels, SourceLabels::default());
    }

    #[test]
    fn no_or_odd_status_means_no_artifact() {
        for status in [
            json!(null),
            json!({}),
            json!({"artifact": null}),
            json!("odd"),
            json!([1]),
        ] {
            let s: FluxSource = serde_json::from_value(json!({
                "metadata": {"name": "n", "namespace": "ns"}, "status": status,
            }))
            .unwrap();
            assert_eq!(s.artifact, None, "{status}");
        }
    }

    #[test]
    fn the_kind_names_the_resource_and_is_shared() {
        let gvk = GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "GitRepository");
        let kind = SourceKind::new(ApiResource::from_gvk_with_plural(&gvk, "gitrepositories"));
        assert_eq!(
            FluxSource::url_path(&kind, Some("apps")),
            "/apis/source.toolkit.fluxcd.io/v1/namespaces/apps/gitrepositories"
        );
        let copy = kind.clone();
        assert!(Arc::ptr_eq(&copy.0, &kind.0));
        assert_eq!(
            FluxSource::api_version(&kind),
            "source.toolkit.fluxcd.io/v1"
        );
    }
}
