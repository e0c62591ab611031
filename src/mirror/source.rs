//! A stock Flux source as the mirror keeps it: its identity, the labels the
//! mirror reads and its `status.artifact` as one JSON text, nothing else.
//!
//! Thousands of sources sit in the mirror's cache and in its controller's
//! queue at once, so the object is small and the kind it belongs to is
//! shared ([`SourceKind`]): a reference to a source costs its name,
//! namespace and one pointer, not the five strings of an `ApiResource`.

use std::borrow::Cow;
use std::sync::Arc;

use kube::api::ObjectMeta;
use kube::core::{ApiResource, DynamicResourceScope};
use kube::Resource;
use serde::{Deserialize, Deserializer};

/// One stock source object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FluxSource {
    pub metadata: ObjectMeta,
    /// `status.artifact` as JSON text; none when the source has no artifact.
    pub artifact: Option<Box<str>>,
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

/// Reads `metadata` whole (the watch needs the resource version) and of the
/// rest only `status.artifact`: the spec and the other status fields are
/// skipped without being kept. A status that is not an object counts as no
/// status, so one odd object cannot fail a whole list.
impl<'de> Deserialize<'de> for FluxSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            status: Option<serde_json::Value>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let artifact = wire
            .status
            .as_ref()
            .and_then(|s| s.get("artifact"))
            .filter(|a| !a.is_null())
            .map(|a| a.to_string().into_boxed_str());
        Ok(FluxSource {
            metadata: wire.metadata,
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
                         "resourceVersion": "7", "labels": {"a": "b"}},
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
        let artifact: serde_json::Value =
            serde_json::from_str(s.artifact.as_deref().unwrap()).unwrap();
        assert_eq!(artifact, json!({"revision": "main@sha1:abc", "size": 1}));
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
