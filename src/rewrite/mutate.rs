//! The mutating webhook's decision for one admission request: the writer
//! stamp for an Artifact ([`super::writer`]), and for a consumer the
//! rewrite ([`super::decide`]) of the consumer the request is about
//! ([`AdmissionRequest::consumer`]). Pure.

use super::admission::{AdmissionRequest, Webhook};
use super::{writer, Decision, Options, View};

/// Decides one admission request. Never panics and makes no I/O.
pub fn decide(request: &AdmissionRequest, view: View<'_>, options: &Options) -> Decision {
    if let Some(decision) = writer::stamp(request) {
        return decision;
    }
    match request.consumer(Webhook::Mutating) {
        Ok(Some(input)) => super::decide(input, view, options),
        Ok(None) => Decision::Unchanged,
        Err(stop) => stop,
    }
}

#[cfg(test)]
mod tests;
