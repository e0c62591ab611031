//! Events, as Flux controllers emit them: a Kubernetes Event on the object
//! and, when `--events-addr` is set, the same event posted to
//! notification-controller, which turns it into alerts (Slack, Teams, a Git
//! commit status...).
//!
//! The body posted is the `Event` of `fluxcd/pkg/apis/event/v1beta1`
//! ([`NotificationEvent`]): `involvedObject`, `severity` (`info` for a
//! Normal event, `error` for a Warning), `timestamp`, `message`, `reason`,
//! `metadata`, `reportingController` and `reportingInstance`. As Flux's
//! recorder does, metadata keys are prefixed with the API group of the
//! involved object (a new revision carries `<group>/revision` and
//! `<group>/digest`; notification-controller keeps `<group>/*` keys and
//! drops the digest), and the object's annotations prefixed with
//! `event.toolkit.fluxcd.io/` are added. Posting never blocks a reconcile:
//! events are queued (bounded; when full, new ones are dropped with a log
//! line) and posted by one background task with a 5s timeout and up to 4
//! retries on connection errors and 5xx answers, backing off 1s, 2s, 4s, 8s,
//! as Flux's retrying HTTP client does. A 429 answer is
//! notification-controller's "duplicate event" and is not retried.
//!
//! # Custom kinds and Alerts
//!
//! notification-controller matches an event to an Alert by the kind, name
//! and namespace of `involvedObject`, and the Alert API (`v1beta3` in Flux
//! 2.7 to 2.9) restricts `spec.eventSources[].kind` to an enum of Flux's
//! own kinds (`Bucket`, `GitRepository`, `Kustomization`, `HelmRelease`,
//! `HelmChart`, `HelmRepository`, `ImageRepository`, `ImagePolicy`,
//! `ImageUpdateAutomation`, `OCIRepository`, `ArtifactGenerator`, and from
//! Flux 2.8 `ExternalArtifact`). An Alert naming a custom kind such as
//! `HttpSource` is rejected by the API server, so an event about the custom
//! object itself reaches notification-controller but can never be alerted
//! on.
//!
//! Decision: [`EventRecorder::publish`] takes an optional *alert target*,
//! the object notification-controller is told the event is about. A
//! producer passes the object openflux exported its Artifact to (the
//! Artifact's `status.exportedRef`, an `ExternalArtifact` named
//! `<kind>-<name>` whose `spec.sourceRef` names the custom source, or a
//! stock-kind shadow where ExternalArtifact is not available): that kind is
//! in the enum, so an Alert with `eventSources: [{kind: ExternalArtifact,
//! name: '*'}]` (or the exported name) delivers the custom source's events.
//! Until the Artifact is exported the event is posted about the custom
//! object itself (accepted, not alertable). The Kubernetes Event is always
//! on the custom object itself, where `kubectl describe` shows it.

mod notifier;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};

pub use notifier::{NotificationEvent, Notifier, NotifyError, RetryPolicy};

/// The API group of Flux's event API; object annotations under it travel
/// with events.
pub const EVENT_GROUP: &str = "event.toolkit.fluxcd.io";
/// Metadata key of the source revision an event is about.
pub const META_REVISION: &str = "revision";
/// Metadata key of the artifact digest an event is about.
pub const META_DIGEST: &str = "digest";

/// An event about an object, before it is sent anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxEvent {
    /// A Warning (severity `error`) rather than a Normal event (`info`).
    pub warning: bool,
    /// CamelCase reason, e.g. `NewArtifact`.
    pub reason: String,
    pub message: String,
    /// Keys without group, e.g. [`META_REVISION`]: the group of the object
    /// the event is posted about is prepended.
    pub metadata: BTreeMap<String, String>,
    /// The events.k8s.io action, e.g. `Reconcile`.
    pub action: String,
}

impl FluxEvent {
    pub fn normal(reason: impl Into<String>, message: impl Into<String>) -> Self {
        FluxEvent {
            warning: false,
            reason: reason.into(),
            message: message.into(),
            metadata: BTreeMap::new(),
            action: "Reconcile".into(),
        }
    }

    pub fn warning(reason: impl Into<String>, message: impl Into<String>) -> Self {
        FluxEvent {
            warning: true,
            ..FluxEvent::normal(reason, message)
        }
    }

    /// Adds a metadata key (without group).
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// `info` or `error`.
    pub fn severity(&self) -> &'static str {
        if self.warning {
            "error"
        } else {
            "info"
        }
    }
}

/// The notification of `event` about `involved` (its group prefixes the
/// metadata keys), carrying the `event.toolkit.fluxcd.io/` annotations of
/// the object the event is on.
pub fn notification(
    involved: &ObjectReference,
    annotations: &BTreeMap<String, String>,
    event: &FluxEvent,
    reporter: &Reporter,
    now: Time,
) -> NotificationEvent {
    let group = involved
        .api_version
        .as_deref()
        .map(|v| crate::split_api_version(v).0)
        .unwrap_or_default();
    let prefix = format!("{EVENT_GROUP}/");
    let mut metadata: BTreeMap<String, String> = annotations
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in &event.metadata {
        metadata.insert(format!("{group}/{key}"), value.clone());
    }
    NotificationEvent {
        involved_object: involved.clone(),
        severity: event.severity().to_string(),
        timestamp: now,
        message: event.message.clone(),
        reason: event.reason.clone(),
        metadata,
        reporting_controller: reporter.controller.clone(),
        reporting_instance: reporter.instance.clone().unwrap_or_default(),
    }
}

/// The longest note the API server takes on an Event (bytes).
pub const MAX_NOTE: usize = 1024;

/// `message` as an Event's note: cut, at a character boundary, to end in
/// `...` within [`MAX_NOTE`] bytes when longer (the API server refuses the
/// whole Event otherwise). Notifications keep the whole message.
pub fn event_note(message: &str) -> String {
    if message.len() <= MAX_NOTE {
        return message.to_string();
    }
    let mut end = MAX_NOTE - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// Emits Kubernetes Events and, with a [`Notifier`], notifications.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    reporter: Reporter,
    notifier: Option<Notifier>,
}

impl EventRecorder {
    /// `reporter.controller` is the reporting controller (e.g.
    /// `source-controller`); `reporter.instance` the pod name.
    pub fn new(client: Client, reporter: Reporter, notifier: Option<Notifier>) -> Self {
        EventRecorder {
            client,
            reporter,
            notifier,
        }
    }

    /// Whether events are also posted to notification-controller.
    pub fn notifies(&self) -> bool {
        self.notifier.is_some()
    }

    /// Emits `event` on `obj` as a Kubernetes Event (awaited; a failure is
    /// logged) and queues its notification, about `alert_target` when
    /// given (see the module documentation), else about `obj`.
    pub async fn publish<K>(
        &self,
        obj: &K,
        event: &FluxEvent,
        alert_target: Option<&ObjectReference>,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.publish_on(obj.object_ref(&()), obj.annotations(), event, alert_target)
            .await;
    }

    /// [`Self::publish`] on the object `reference` names (of a kind known
    /// only at run time), whose annotations are `annotations`.
    pub async fn publish_on(
        &self,
        reference: ObjectReference,
        annotations: &BTreeMap<String, String>,
        event: &FluxEvent,
        alert_target: Option<&ObjectReference>,
    ) {
        let k8s_event = Event {
            type_: if event.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: event.reason.clone(),
            note: Some(event_note(&event.message)),
            action: event.action.clone(),
            secondary: None,
        };
        // A Recorder a publish: a shared one would fold Events of the same
        // reason into one series that keeps the first message.
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        if let Err(e) = recorder.publish(&k8s_event, &reference).await {
            tracing::warn!(error = %e, reason = %event.reason, "cannot publish event");
        }
        if let Some(notifier) = &self.notifier {
            let involved = alert_target.unwrap_or(&reference);
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            notifier.send(notification(
                involved,
                annotations,
                event,
                &self.reporter,
                now,
            ));
        }
    }
}

#[cfg(test)]
mod tests;
