//! What a decision answers, and the switches that change the answer. Plain
//! data, shared by the rewrite ([`super`]), the webhook that answers
//! admission requests with it and the consumer re-pointer.

use json_patch::Patch;

/// Switches that change decisions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Deny references to a source in another namespace, as Flux's
    /// `--no-cross-namespace-refs` does.
    pub no_cross_namespace_refs: bool,
}

/// What the webhook answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Admit the object as it is.
    Unchanged,
    /// Admit the object with this JSON patch (RFC 6902) applied.
    Rewrite {
        patch: Patch,
        /// Admission warnings shown to the person applying the object.
        warnings: Vec<String>,
    },
    /// Refuse the object; the message says what to change.
    Deny { message: String },
    /// Refuse the object: it refers to a kind no API of the cluster serves,
    /// as far as openflux's last reading of the cluster knows. Answered as
    /// [`Decision::Deny`]; the server first has the cluster read again and
    /// decides once more (the kind's CRD may be a moment old).
    NotServed { message: String },
    /// The request cannot be decided: malformed (400), openflux not ready
    /// (503), or an internal error (500).
    Error { code: u16, message: String },
}

impl Decision {
    /// The value of the `outcome` metric label.
    pub fn outcome(&self) -> &'static str {
        match self {
            Decision::Unchanged => "unchanged",
            Decision::Rewrite { .. } => "rewritten",
            Decision::Deny { .. } | Decision::NotServed { .. } => "denied",
            Decision::Error { .. } => "error",
        }
    }

    /// The request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Decision::Error {
            code: 400,
            message: message.into(),
        }
    }

    /// openflux reached a state its own code rules out; the request is
    /// refused rather than admitted with a guess.
    pub fn internal(message: impl Into<String>) -> Self {
        Decision::Error {
            code: 500,
            message: message.into(),
        }
    }
}
