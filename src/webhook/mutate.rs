//! The mutating webhook's decision for one admission request: the writer
//! stamp for an Artifact ([`super::writer`]), and for a consumer the
//! rewrite ([`crate::rewrite::decide`]) of the consumer the request is
//! about ([`super::consumer::read`]). Pure.

use super::consumer::{self, Webhook};
use super::review::AdmissionRequest;
use super::writer;
use crate::rewrite::{self, Decision, Options, View};

/// Decides one admission request. Never panics and makes no I/O.
pub fn decide(request: &AdmissionRequest, view: View<'_>, options: &Options) -> Decision {
    if let Some(decision) = writer::stamp(request) {
        return decision;
    }
    match consumer::read(request, Webhook::Mutating) {
        Ok(Some(input)) => rewrite::decide(input, view, options),
        Ok(None) => Decision::Unchanged,
        Err(stop) => stop,
    }
}

#[cfg(test)]
mod tests;
