//! The owner index: which Artifacts a source owns, and each Artifact by name.
//!
//! Changed by the Artifact watch through [`IndexChange`]s the event router
//! decides on (apply, delete, and a reset when the watch has listed every
//! Artifact again), and read by the webhook and the export controller. Pure
//! data: no I/O, no clock, so it is tested by feeding objects.

mod entry;
pub mod small_set;

pub use entry::{ArtifactKey, IndexedArtifact, MirroredState, Owner, SourceKey, Text};

use entry::{default_among, ArtifactKeyRef, KindKeyRef, SourceKeyRef};
use hashbrown::{HashMap, HashSet};

use crate::api::Artifact;
use crate::index::small_set::SmallSet;
use crate::names::identity;
use crate::vocabulary::uid::Uid;
/// One change to the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexChange {
    /// Add or update one Artifact.
    Apply(IndexedArtifact),
    /// Remove one Artifact.
    Delete(ArtifactKey),
    /// A new list of every Artifact began: drop what an earlier one set
    /// aside.
    Listing,
    /// Set one Artifact of the list in progress aside, unseen by readers.
    Listed(IndexedArtifact),
    /// Replace the whole content with these and the Artifacts set aside:
    /// the watch listed every Artifact again, so Artifacts deleted while it
    /// was down disappear at once, and readers never see a half-listed
    /// index.
    Reset(Vec<IndexedArtifact>),
}

/// Why a lookup by kind alone failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// Several API groups have a source of this kind, namespace and name.
    #[error("{kind} {namespace}/{name} is ambiguous: {} match; set apiVersion in the reference to pick one", candidates.join(", "))]
    Ambiguous {
        kind: String,
        namespace: String,
        name: String,
        /// Each candidate as `Kind.group`, sorted.
        candidates: Vec<String>,
    },
}

/// The result of looking a source up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceMatch {
    pub source: SourceKey,
    /// Names of the Artifacts the source owns, sorted; never empty.
    pub artifacts: Vec<String>,
}

/// The owner index.
#[derive(Debug, Default)]
pub struct OwnerIndex {
    /// Each entry boxed: the table holds a key and a pointer per slot, so
    /// growing it, or holding a list's entries beside it, copies and holds
    /// 40 bytes per Artifact rather than 230.
    artifacts: HashMap<ArtifactKey, Box<IndexedArtifact>>,
    by_source: HashMap<SourceKey, SmallSet<Text>>,
    /// (kind, namespace, name) -> groups that have such a source with Artifacts.
    by_kind: HashMap<(Text, Text, Text), SmallSet<Text>>,
    /// Namespaces, groups, kinds and apiVersions, each kept once. Emptied
    /// with the rest on a reset, so it holds no more than the words of the
    /// Artifacts seen since the last complete list.
    words: HashSet<Text>,
    /// The Artifacts of a list in progress, set aside until it ends: a
    /// list's Artifacts wait here rather than as whole objects. Boxed as
    /// the table's entries are: they move into it when the list ends, and
    /// the vector grows by pointers.
    #[allow(clippy::vec_box, reason = "the boxes move into the table as they are")]
    listed: Vec<Box<IndexedArtifact>>,
    synced: bool,
}

impl OwnerIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the index has seen a complete list of Artifacts at least once.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Number of Artifacts indexed.
    pub fn len(&self) -> usize {
        self.artifacts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.artifacts.is_empty()
    }

    /// Makes one change.
    pub fn change(&mut self, change: IndexChange) {
        match change {
            IndexChange::Apply(entry) => self.insert(Box::new(entry)),
            IndexChange::Delete(key) => self.remove(&key),
            IndexChange::Listing => self.listed = Vec::new(),
            IndexChange::Listed(entry) => self.listed.push(Box::new(entry)),
            IndexChange::Reset(entries) => {
                let listed = std::mem::take(&mut self.listed);
                self.replace(entries.into_iter().map(Box::new).chain(listed));
            }
        }
    }

    /// The Artifacts set aside by the list in progress.
    pub fn listed(&self) -> impl ExactSizeIterator<Item = &IndexedArtifact> {
        self.listed.iter().map(|entry| &**entry)
    }

    /// Adds or updates one Artifact.
    pub fn apply(&mut self, artifact: &Artifact) {
        if let Some(entry) = IndexedArtifact::from_artifact(artifact) {
            self.insert(Box::new(entry));
        }
    }

    /// Removes one Artifact.
    pub fn delete(&mut self, artifact: &Artifact) {
        if let Some(key) = ArtifactKey::of(artifact) {
            self.remove(&key);
        }
    }

    /// Replaces the whole content.
    pub fn reset(&mut self, entries: impl IntoIterator<Item = IndexedArtifact>) {
        self.replace(entries.into_iter().map(Box::new));
    }

    fn replace(&mut self, entries: impl Iterator<Item = Box<IndexedArtifact>>) {
        self.artifacts.clear();
        self.by_source.clear();
        self.by_kind.clear();
        self.words.clear();
        // Sized once for the whole list: growing step by step would hold
        // the old table and the new one at each step.
        let n = entries.size_hint().0;
        self.artifacts.reserve(n);
        self.by_source.reserve(n);
        for entry in entries {
            self.insert(entry);
        }
        self.synced = true;
    }

    /// The one copy of `text` the index keeps.
    fn word(&mut self, text: &Text) -> Text {
        match self.words.get(&**text) {
            Some(kept) => kept.clone(),
            None => {
                self.words.insert(text.clone());
                text.clone()
            }
        }
    }

    fn insert(&mut self, mut entry: Box<IndexedArtifact>) {
        if self.artifacts.get(&entry.key) == Some(&entry) {
            return;
        }
        self.remove(&entry.key);
        entry.key.namespace = self.word(&entry.key.namespace);
        if let Some(owner) = &mut entry.owner {
            owner.source.namespace = entry.key.namespace.clone();
            owner.source.group = self.word(&owner.source.group);
            owner.source.kind = self.word(&owner.source.kind);
            owner.api_version = self.word(&owner.api_version);
            let names = self.by_source.entry(owner.source.clone()).or_default();
            names.insert(entry.key.name.clone());
            self.by_kind
                .entry(kind_key(&owner.source))
                .or_default()
                .insert(owner.source.group.clone());
        }
        self.artifacts.insert(entry.key.clone(), entry);
    }

    fn remove(&mut self, key: &ArtifactKey) {
        let Some(old) = self.artifacts.remove(key) else {
            return;
        };
        let Some(owner) = old.owner else {
            return;
        };
        if let Some(names) = self.by_source.get_mut(&owner.source) {
            names.remove(&key.name);
            if names.is_empty() {
                self.by_source.remove(&owner.source);
                let kk = kind_key(&owner.source);
                if let Some(groups) = self.by_kind.get_mut(&kk) {
                    groups.remove(&owner.source.group);
                    if groups.is_empty() {
                        self.by_kind.remove(&kk);
                    }
                }
            }
        }
    }

    /// Records the trust check's verdict on the Artifact `key` whose uid is
    /// `uid` (ignored when the index holds another object of that name);
    /// returns whether it changed.
    pub fn record_verdict(&mut self, key: &ArtifactKey, uid: &Uid, trusted: bool) -> bool {
        match self.artifacts.get_mut(key) {
            Some(entry) if entry.uid == *uid && entry.untrusted == trusted => {
                entry.untrusted = !trusted;
                true
            }
            _ => false,
        }
    }

    /// One Artifact by namespace and name.
    pub fn artifact(&self, namespace: &str, name: &str) -> Option<&IndexedArtifact> {
        self.artifacts
            .get(&ArtifactKeyRef { namespace, name })
            .map(|entry| &**entry)
    }

    /// The Artifacts of a source. `group: None` matches by kind alone, which
    /// fails when several groups have a source of that kind and name.
    /// `Ok(None)`: no Artifact of such a source is known.
    pub fn lookup_source(
        &self,
        group: Option<&str>,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<SourceMatch>, LookupError> {
        let Some(source) = self.find_source(group, kind, namespace, name)? else {
            return Ok(None);
        };
        Ok(self.by_source.get(source).map(|names| SourceMatch {
            artifacts: names.iter().map(|n| n.to_string()).collect(),
            source: source.clone(),
        }))
    }

    /// The key of a source that has Artifacts, as [`Self::lookup_source`]
    /// finds it, without copying anything: what the webhook asks on every
    /// request.
    pub fn find_source(
        &self,
        group: Option<&str>,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<&SourceKey>, LookupError> {
        let group = match group {
            Some(g) => g,
            None => {
                let Some(groups) = self.by_kind.get(&KindKeyRef(kind, namespace, name)) else {
                    return Ok(None);
                };
                if groups.len() > 1 {
                    return Err(LookupError::Ambiguous {
                        kind: kind.to_string(),
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        candidates: groups.iter().map(|g| format!("{kind}.{g}")).collect(),
                    });
                }
                match groups.iter().next() {
                    Some(g) => &**g,
                    None => return Ok(None),
                }
            }
        };
        let source = SourceKeyRef {
            group,
            kind,
            namespace,
            name,
        };
        Ok(self.by_source.get_key_value(&source).map(|(key, _)| key))
    }

    /// The default Artifact of a source: the one that fills the source's
    /// export (see [`identity::default_order`]), among its Artifacts the
    /// trust check did not refuse: an Artifact whose writer may not speak
    /// for the source, labelled default or older, neither takes the export
    /// nor keeps it from the source's own Artifacts.
    pub fn default_of(&self, source: &SourceKey) -> Option<&IndexedArtifact> {
        default_among(self.of_source(source))
    }

    /// The default Artifact of `entry`'s source before and after `entry`
    /// changes to what it is now (or goes, when `gone`), with this index
    /// as it was before: the Artifacts whose export name such a change can
    /// move. The others keep theirs, however many the source has.
    pub fn defaults_around<'a>(
        &'a self,
        entry: &'a IndexedArtifact,
        gone: bool,
    ) -> [Option<&'a ArtifactKey>; 2] {
        let Some(owner) = &entry.owner else {
            return [None, None];
        };
        let before = default_among(self.of_source(&owner.source));
        let others = self.of_source(&owner.source).filter(|a| a.key != entry.key);
        let after = match gone {
            true => default_among(others),
            false => default_among(others.chain(std::iter::once(entry))),
        };
        [before.map(|a| &a.key), after.map(|a| &a.key)]
    }

    /// The Artifacts of a source, in no order.
    fn of_source<'a, 's>(
        &'a self,
        source: &'s SourceKey,
    ) -> impl Iterator<Item = &'a IndexedArtifact> + Clone + 's
    where
        'a: 's,
    {
        self.by_source
            .get(source)
            .into_iter()
            .flatten()
            .filter_map(|n| self.artifact(&source.namespace, n))
    }

    /// Name of the object an Artifact is exported as: its source's export
    /// when it is the source's default Artifact, otherwise its own.
    pub fn export_name(&self, artifact: &IndexedArtifact) -> String {
        match &artifact.owner {
            Some(owner) if self.is_default(artifact) => identity::source_export_name(
                &owner.source.group,
                &owner.source.kind,
                &owner.source.name,
            ),
            _ => identity::artifact_export_name(&artifact.key.name),
        }
    }

    /// Whether `artifact` is its source's default Artifact.
    pub fn is_default(&self, artifact: &IndexedArtifact) -> bool {
        artifact.owner.as_ref().is_some_and(|owner| {
            self.default_of(&owner.source)
                .is_some_and(|d| d.key == artifact.key)
        })
    }

    /// The sources that have Artifacts, in no order.
    pub fn sources(&self) -> impl Iterator<Item = &SourceKey> {
        self.by_source.keys()
    }
}

fn kind_key(source: &SourceKey) -> (Text, Text, Text) {
    (
        source.kind.clone(),
        source.namespace.clone(),
        source.name.clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ArtifactSpec;
    use crate::vocabulary::marks::DEFAULT_ARTIFACT_LABEL;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use std::sync::Arc;

    fn artifact(ns: &str, name: &str, owner: Option<(&str, &str, &str, &str)>) -> Artifact {
        let mut a = Artifact::new(
            name,
            ArtifactSpec {
                url: "http://x/a.tar.gz".into(),
                revision: "r1".into(),
                ..Default::default()
            },
        );
        a.metadata.namespace = Some(ns.into());
        a.metadata.uid = Some(format!("uid-{ns}-{name}"));
        a.metadata.owner_references = owner.map(|(api_version, kind, oname, uid)| {
            vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: oname.into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        });
        a
    }

    const HTTP: &str = "sources.openflux.dev/v1alpha1";

    #[test]
    fn add_and_lookup_by_group_and_by_kind() {
        let mut idx = OwnerIndex::new();
        idx.apply(&artifact(
            "ns",
            "a1",
            Some((HTTP, "HttpSource", "web", "u1")),
        ));
        let by_group = idx
            .lookup_source(Some("sources.openflux.dev"), "HttpSource", "ns", "web")
            .unwrap()
            .unwrap();
        assert_eq!(by_group.artifacts, vec!["a1"]);
        let by_kind = idx
            .lookup_source(None, "HttpSource", "ns", "web")
            .unwrap()
            .unwrap();
        assert_eq!(by_kind, by_group);
        assert_eq!(
            idx.lookup_source(None, "HttpSource", "other", "web"),
            Ok(None)
        );
        assert_eq!(
            idx.lookup_source(Some("x.io"), "HttpSource", "ns", "web"),
            Ok(None)
        );
    }

    #[test]
    fn borrowed_lookups_find_every_entry_and_words_are_kept_once() {
        let mut idx = OwnerIndex::new();
        let mut entries = Vec::new();
        for n in 0..50 {
            let (ns, name, src) = (format!("ns-{}", n % 7), format!("a{n}"), format!("s{n}"));
            let owner = (n % 3 != 0).then_some((HTTP, "HttpSource", src.as_str(), "u"));
            let a = artifact(&ns, &name, owner);
            entries.push(IndexedArtifact::from_artifact(&a).unwrap());
        }
        idx.reset(entries.clone());
        for e in &entries {
            // Looked up by &str: hashes as the owned key does.
            let found = idx.artifact(&e.key.namespace, &e.key.name).unwrap();
            assert_eq!(found, e);
            if let Some(o) = &e.owner {
                let s = &o.source;
                let key = idx.find_source(Some(&s.group), &s.kind, &s.namespace, &s.name);
                assert_eq!(key, Ok(Some(s)));
                let key = idx.find_source(None, &s.kind, &s.namespace, &s.name);
                assert_eq!(key, Ok(Some(s)));
                // Interned: the namespace of the key and of the owner are
                // one string, and so are the kinds of all owners.
                let kept = idx.artifact(&e.key.namespace, &e.key.name).unwrap();
                let owner = kept.owner.as_ref().unwrap();
                assert!(Arc::ptr_eq(&kept.key.namespace, &owner.source.namespace));
                let first = idx.artifact("ns-1", "a1").unwrap().owner.as_ref().unwrap();
                assert!(Arc::ptr_eq(&first.source.kind, &owner.source.kind));
            }
        }
        assert!(idx.artifact("ns-1", "a2").is_none());
        assert_eq!(idx.find_source(None, "HttpSource", "ns-1", "s2"), Ok(None));
    }

    #[test]
    fn update_is_idempotent_and_owner_change_moves_the_entry() {
        let mut idx = OwnerIndex::new();
        let a = artifact("ns", "a1", Some((HTTP, "HttpSource", "web", "u1")));
        idx.apply(&a);
        idx.apply(&a);
        assert_eq!(idx.len(), 1);
        let moved = artifact("ns", "a1", Some((HTTP, "HttpSource", "other", "u2")));
        idx.apply(&moved);
        assert_eq!(idx.lookup_source(None, "HttpSource", "ns", "web"), Ok(None));
        assert_eq!(
            idx.lookup_source(None, "HttpSource", "ns", "other")
                .unwrap()
                .unwrap()
                .artifacts,
            vec!["a1"]
        );
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn delete_removes_every_trace() {
        let mut idx = OwnerIndex::new();
        let a = artifact("ns", "a1", Some((HTTP, "HttpSource", "web", "u1")));
        idx.apply(&a);
        idx.delete(&a);
        assert!(idx.is_empty());
        assert_eq!(idx.lookup_source(None, "HttpSource", "ns", "web"), Ok(None));
        assert!(idx.artifact("ns", "a1").is_none());
        assert!(idx.by_kind.is_empty() && idx.by_source.is_empty());
        // Deleting what is not there changes nothing.
        idx.delete(&a);
        assert!(idx.is_empty());
    }

    #[test]
    fn reset_replaces_the_content_and_marks_the_index_synced() {
        let mut idx = OwnerIndex::new();
        assert!(!idx.is_synced());
        idx.apply(&artifact(
            "ns",
            "gone",
            Some((HTTP, "HttpSource", "old", "u0")),
        ));
        let listed = artifact("ns", "a1", Some((HTTP, "HttpSource", "web", "u1")));
        idx.change(IndexChange::Reset(
            IndexedArtifact::from_artifact(&listed)
                .into_iter()
                .collect(),
        ));
        assert!(idx.is_synced());
        assert!(idx.artifact("ns", "gone").is_none());
        assert!(idx.artifact("ns", "a1").is_some());
        assert_eq!(idx.lookup_source(None, "HttpSource", "ns", "old"), Ok(None));
    }

    #[test]
    fn same_kind_in_two_groups_is_ambiguous_without_group() {
        let mut idx = OwnerIndex::new();
        idx.apply(&artifact(
            "ns",
            "a1",
            Some((HTTP, "HttpSource", "web", "u1")),
        ));
        idx.apply(&artifact(
            "ns",
            "a2",
            Some(("other.io/v1", "HttpSource", "web", "u2")),
        ));
        let err = idx
            .lookup_source(None, "HttpSource", "ns", "web")
            .unwrap_err();
        let LookupError::Ambiguous { candidates, .. } = &err;
        assert_eq!(
            candidates,
            &vec!["HttpSource.other.io", "HttpSource.sources.openflux.dev"]
        );
        assert!(err.to_string().contains("set apiVersion"));
        // With a group it resolves.
        assert_eq!(
            idx.lookup_source(Some("other.io"), "HttpSource", "ns", "web")
                .unwrap()
                .unwrap()
                .artifacts,
            vec!["a2"]
        );
    }

    #[test]
    fn artifact_as_key_and_export_names() {
        let mut idx = OwnerIndex::new();
        idx.apply(&artifact("ns", "standalone", None));
        idx.apply(&artifact(
            "ns",
            "a1",
            Some((HTTP, "HttpSource", "web", "u1")),
        ));
        let standalone = idx.artifact("ns", "standalone").unwrap().clone();
        assert!(standalone.owner.is_none());
        assert_eq!(
            idx.export_name(&standalone),
            identity::artifact_export_name("standalone")
        );
        let a1 = idx.artifact("ns", "a1").unwrap().clone();
        let web = identity::source_export_name("sources.openflux.dev", "HttpSource", "web");
        assert_eq!(idx.export_name(&a1), web);
        // A second Artifact of the same source does not move the first one's
        // export: the first stays the default (same creation time: by name).
        idx.apply(&artifact(
            "ns",
            "a2",
            Some((HTTP, "HttpSource", "web", "u1")),
        ));
        assert_eq!(idx.export_name(&a1), web);
        let a2 = idx.artifact("ns", "a2").unwrap().clone();
        assert_eq!(idx.export_name(&a2), identity::artifact_export_name("a2"));
        // The producer's label picks the default.
        let mut labelled = artifact("ns", "a3", Some((HTTP, "HttpSource", "web", "u1")));
        labelled.metadata.labels =
            Some([(DEFAULT_ARTIFACT_LABEL.to_string(), "true".to_string())].into());
        idx.apply(&labelled);
        let a3 = idx.artifact("ns", "a3").unwrap().clone();
        assert_eq!(idx.export_name(&a3), web);
        assert_eq!(idx.export_name(&a1), identity::artifact_export_name("a1"));
        idx.delete(&labelled);
        assert_eq!(
            idx.lookup_source(None, "HttpSource", "ns", "web")
                .unwrap()
                .unwrap()
                .artifacts,
            vec!["a1", "a2"]
        );
        // The labelled default gone, the first (here: by name) takes the
        // source's export back.
        let a1 = idx.artifact("ns", "a1").unwrap().clone();
        assert_eq!(idx.export_name(&a1), web);
    }

    /// An Artifact the trust check refused, labelled default (or older),
    /// neither takes its source's export nor keeps it from the source's own
    /// Artifact; the verdict counts whether the export controller recorded it
    /// or the Artifact's `Ready` condition carries it.
    #[test]
    fn a_refused_artifact_is_never_its_sources_default() {
        let owner = Some((HTTP, "HttpSource", "web", "u1"));
        let web = identity::source_export_name("sources.openflux.dev", "HttpSource", "web");
        let key = |name: &str| ArtifactKey {
            namespace: "ns".into(),
            name: name.into(),
        };
        let mut forged = artifact("ns", "forged", owner);
        forged.metadata.labels =
            Some([(DEFAULT_ARTIFACT_LABEL.to_string(), "true".to_string())].into());
        let genuine = artifact("ns", "genuine", owner);
        let mut idx = OwnerIndex::new();
        idx.apply(&forged);
        idx.apply(&genuine);
        let name_of =
            |idx: &OwnerIndex, name: &str| idx.export_name(idx.artifact("ns", name).unwrap());
        // Not checked yet: the label decides.
        assert_eq!(name_of(&idx, "forged"), web);
        assert_eq!(
            name_of(&idx, "genuine"),
            identity::artifact_export_name("genuine")
        );
        // Refused: the source's own Artifact gets the export.
        assert!(idx.record_verdict(&key("forged"), &Uid::new("uid-ns-forged"), false));
        assert!(!idx.record_verdict(&key("forged"), &Uid::new("uid-ns-forged"), false));
        assert_eq!(name_of(&idx, "genuine"), web);
        assert_eq!(
            name_of(&idx, "forged"),
            identity::artifact_export_name("forged")
        );
        // A verdict on another object of that name is not this one's.
        assert!(!idx.record_verdict(&key("genuine"), &Uid::new("uid-elsewhere"), false));
        assert_eq!(name_of(&idx, "genuine"), web);
        // After a restart the verdict comes from the Artifact's condition.
        forged.status = serde_json::from_value(serde_json::json!({"conditions": [{
            "type": "Ready", "status": "False", "reason": "Untrusted", "message": "refused",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
        .unwrap();
        let mut idx = OwnerIndex::new();
        idx.reset([&forged, &genuine].map(|a| IndexedArtifact::from_artifact(a).unwrap()));
        assert!(idx.artifact("ns", "forged").unwrap().untrusted);
        assert_eq!(name_of(&idx, "genuine"), web);
        // Written again by someone who may speak for the source: trusted,
        // and its label counts again.
        assert!(idx.record_verdict(&key("forged"), &Uid::new("uid-ns-forged"), true));
        assert_eq!(name_of(&idx, "forged"), web);
        // Every Artifact refused: none is the default (none is exported).
        idx.record_verdict(&key("forged"), &Uid::new("uid-ns-forged"), false);
        idx.record_verdict(&key("genuine"), &Uid::new("uid-ns-genuine"), false);
        assert!(idx
            .default_of(
                &idx.artifact("ns", "genuine")
                    .unwrap()
                    .owner
                    .clone()
                    .unwrap()
                    .source
            )
            .is_none());
    }
}
