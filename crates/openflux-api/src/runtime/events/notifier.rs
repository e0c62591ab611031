//! Posting notifications to notification-controller in the background.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// The body notification-controller receives (`fluxcd/pkg/apis/event`
/// `v1beta1.Event`, same JSON names).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NotificationEvent {
    pub involved_object: ObjectReference,
    pub severity: String,
    pub timestamp: Time,
    pub message: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    pub reporting_controller: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reporting_instance: String,
}

/// Events waiting to be posted; beyond this, new ones are dropped.
pub const QUEUE: usize = 256;

/// Timeout and retries of one post (Flux's: a 5s timeout, 4 retries,
/// waiting 1s, 2s, 4s, 8s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub timeout: Duration,
    pub retries: u32,
    pub min_wait: Duration,
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            timeout: Duration::from_secs(5),
            retries: 4,
            min_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry `attempt` (0 for the first retry).
    pub fn wait(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.min_wait.saturating_mul(factor).min(self.max_wait)
    }
}

/// Why a notification was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("encoding the event: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("posting the event failed after {attempts} attempt(s): {last}")]
    Failed { attempts: u32, last: String },
    #[error("notification-controller refused the event: {0}")]
    Refused(StatusCode),
}

/// What one attempt came to.
enum Attempt {
    Delivered,
    /// notification-controller already has this event.
    Duplicate,
    Retry(String),
    Refused(StatusCode),
}

/// Posts one event, retrying as [`RetryPolicy`] says.
pub async fn post(
    http: &reqwest::Client,
    url: &Url,
    event: &NotificationEvent,
    policy: RetryPolicy,
) -> Result<(), NotifyError> {
    let body = serde_json::to_vec(event)?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let sent = http
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(policy.timeout)
            .body(body.clone())
            .send()
            .await;
        let attempt = match sent {
            Ok(response) => judge(response.status()),
            Err(e) => Attempt::Retry(e.to_string()),
        };
        match attempt {
            Attempt::Delivered | Attempt::Duplicate => return Ok(()),
            Attempt::Refused(status) => return Err(NotifyError::Refused(status)),
            Attempt::Retry(last) if attempts > policy.retries => {
                return Err(NotifyError::Failed { attempts, last })
            }
            Attempt::Retry(_) => tokio::time::sleep(policy.wait(attempts - 1)).await,
        }
    }
}

/// Flux's retry policy: 2xx delivers, 429 is a duplicate (not retried), 5xx
/// but 501 is retried, anything else is refused.
fn judge(status: StatusCode) -> Attempt {
    if status.is_success() {
        Attempt::Delivered
    } else if status == StatusCode::TOO_MANY_REQUESTS {
        Attempt::Duplicate
    } else if status.is_server_error() && status != StatusCode::NOT_IMPLEMENTED {
        Attempt::Retry(format!("answered {status}"))
    } else {
        Attempt::Refused(status)
    }
}

/// Queues notifications and posts them from one background task.
#[derive(Clone)]
pub struct Notifier {
    tx: mpsc::Sender<NotificationEvent>,
    url: Url,
}

impl Notifier {
    /// Starts the task posting to `url` (needs a Tokio runtime).
    pub fn spawn(url: Url, http: reqwest::Client, policy: RetryPolicy) -> Self {
        let (tx, mut rx) = mpsc::channel::<NotificationEvent>(QUEUE);
        let target = url.clone();
        tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                if let Err(e) = post(&http, &target, &event, policy).await {
                    tracing::warn!(
                        error = %e,
                        reason = %event.reason,
                        url = %target,
                        "unable to record event"
                    );
                }
            }
        });
        Notifier { tx, url }
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Queues `event` without waiting; false (and a log line) when the
    /// queue is full.
    pub fn send(&self, event: NotificationEvent) -> bool {
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(e) => {
                let event = match &e {
                    mpsc::error::TrySendError::Full(ev) | mpsc::error::TrySendError::Closed(ev) => {
                        ev
                    }
                };
                tracing::warn!(
                    reason = %event.reason,
                    url = %self.url,
                    "dropping an event for notification-controller: the queue is full"
                );
                false
            }
        }
    }
}
