//! A request the webhook refuses before deciding it: too large, too many
//! in flight, unreadable, its body too slow, or not answered in time. Each is an HTTP status
//! with a plain-text reason (no AdmissionReview can answer it), counted and
//! logged as an `error` outcome.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::answer::Answer;
use super::limits::{BodyError, BODY_READ_TIMEOUT, REQUEST_TIMEOUT};

/// A request refused before it was decided.
pub(super) enum Refused {
    TooLarge,
    Busy,
    Unreadable(String),
    TimedOut,
    /// The body did not arrive within [`BODY_READ_TIMEOUT`].
    SlowBody,
}

impl Refused {
    fn status(&self) -> StatusCode {
        match self {
            Refused::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refused::Busy => StatusCode::TOO_MANY_REQUESTS,
            Refused::Unreadable(_) => StatusCode::BAD_REQUEST,
            Refused::TimedOut | Refused::SlowBody => StatusCode::REQUEST_TIMEOUT,
        }
    }

    fn message(&self) -> String {
        match self {
            Refused::TooLarge => BodyError::TooLarge.to_string(),
            Refused::Busy => "too many admission requests in flight; retry".into(),
            Refused::Unreadable(why) => why.clone(),
            Refused::TimedOut => format!("the request was not answered within {REQUEST_TIMEOUT:?}"),
            Refused::SlowBody => {
                format!(
                    "the request body did not arrive within {BODY_READ_TIMEOUT:?} of its headers"
                )
            }
        }
    }

    pub(super) fn answer(&self) -> Answer {
        Answer {
            status: self.status(),
            review: Err(self.message()),
            consumer: "unknown",
            outcome: "error",
            subject: Default::default(),
            decision: None,
        }
    }

    pub(super) fn response(&self) -> Response {
        let mut response = (self.status(), self.message()).into_response();
        if let Refused::Busy = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        response
    }
}
