//! The decision path from a request body to its answer: parse, decide,
//! encode. Pure: no I/O, never panics; the HTTPS handler
//! ([`super::server`]) calls it with the body it read, and the chaos suite
//! calls it with a million generated ones.

use axum::http::StatusCode;

use super::review::{self, ReviewError};
use crate::rewrite::admission::AdmissionRequest;
use crate::rewrite::mutate::decide;
use crate::rewrite::validate;
use crate::rewrite::writer;
use crate::rewrite::{Decision, Options, View};
use crate::vocabulary::consumers;

/// What the webhook answers a body with, and what to count and log.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// The AdmissionReview answering the request, as JSON, or for a body
    /// no AdmissionReview can answer (status 400), the reason as text.
    pub review: Result<Vec<u8>, String>,
    pub consumer: &'static str,
    pub outcome: &'static str,
    /// Whom the request was about: uid, namespace, name.
    pub subject: [String; 3],
    pub decision: Option<Decision>,
}

/// The decision path, from a body to its answer: pure, no I/O, never
/// panics. The HTTPS handler calls it with the body it read.
pub fn answer(body: &[u8], view: View<'_>, options: &Options) -> Answer {
    answer_parsed(review::parse(body), view, options)
}

/// [`answer`] for a body already parsed (the server parses before it takes
/// the read locks, so a large body never holds the lock).
pub fn answer_parsed(
    parsed: Result<AdmissionRequest, ReviewError>,
    view: View<'_>,
    options: &Options,
) -> Answer {
    answer_with(parsed, view, options, mutation)
}

/// The validating webhook's answer ([`validate::decide`]) to a parsed body.
pub fn answer_validation(
    parsed: Result<AdmissionRequest, ReviewError>,
    view: View<'_>,
    options: &Options,
) -> Answer {
    answer_with(parsed, view, options, validate::decide)
}

/// The mutating webhook's decision: the rewrite, judged on the references
/// it leaves as the validating webhook will judge them.
fn mutation(request: &AdmissionRequest, view: View<'_>, options: &Options) -> Decision {
    let decision = decide(request, view, options);
    if let Decision::Rewrite { patch, .. } = &decision {
        if let Some(denied) = validate::check_rewrite(request, patch, view, options) {
            return denied;
        }
    }
    decision
}

fn answer_with(
    parsed: Result<AdmissionRequest, ReviewError>,
    view: View<'_>,
    options: &Options,
    decide: fn(&AdmissionRequest, View<'_>, &Options) -> Decision,
) -> Answer {
    let request = match parsed {
        Ok(request) => request,
        Err(ReviewError::Unanswerable(message)) => {
            return Answer {
                status: StatusCode::BAD_REQUEST,
                review: Err(message),
                consumer: "unknown",
                outcome: "error",
                subject: Default::default(),
                decision: None,
            };
        }
        Err(ReviewError::Invalid { uid, message }) => {
            return Answer {
                status: StatusCode::OK,
                review: Ok(review::refusal(&uid, 400, &message)),
                consumer: "unknown",
                outcome: "error",
                subject: [uid, String::new(), String::new()],
                decision: Some(Decision::bad_request(message)),
            };
        }
    };
    let (group, resource) = (&request.resource.group, &request.resource.resource);
    let consumer = consumers::find(group, resource)
        .map(|c| c.label())
        .or_else(|| writer::is_artifact_resource(group, resource).then_some("artifacts"))
        .unwrap_or("unknown");
    let mut decision = decide(&request, view, options);
    let review = review::response(&request.uid, &decision).unwrap_or_else(|error| {
        decision = Decision::internal(error.to_string());
        review::refusal(&request.uid, 500, &error.to_string())
    });
    // The request is done with: its strings move into the subject.
    let name = request
        .object
        .as_ref()
        .and_then(|o| o.get("metadata")?.get("name")?.as_str())
        .map(str::to_string)
        .or(request.name)
        .unwrap_or_default();
    let subject = [request.uid, request.namespace.unwrap_or_default(), name];
    Answer {
        status: StatusCode::OK,
        review: Ok(review),
        consumer,
        outcome: decision.outcome(),
        subject,
        decision: Some(decision),
    }
}
