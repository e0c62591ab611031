//! The answering AdmissionReview, written straight to bytes: typed structs
//! borrowing the request's uid and the decision's strings, serialized once,
//! with no JSON tree in between. The only allocations are the output and
//! the patch's own encoding.

use base64::Engine as _;
use serde::Serialize;

use crate::webhook::decision::Decision;

/// `apiVersion` of the AdmissionReview openflux speaks.
pub const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
/// `kind` of an AdmissionReview.
pub const ADMISSION_KIND: &str = "AdmissionReview";

/// A decision that cannot be put on the wire: the JSON patch openflux built
/// does not serialize. openflux's own code rules this out, so it is an
/// internal error, answered as such and never as an empty patch.
#[derive(Debug, thiserror::Error)]
#[error("openflux cannot encode the JSON patch it decided on: {0}")]
pub struct EncodeError(#[from] serde_json::Error);

#[derive(Serialize)]
struct Review<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    response: Response<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    /// The JSON patch, base64 as the API server reads `[]byte`.
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

#[derive(Serialize)]
struct Status<'a> {
    status: &'static str,
    code: u16,
    reason: &'static str,
    message: &'a str,
}

fn write(response: Response<'_>) -> Vec<u8> {
    let review = Review {
        api_version: ADMISSION_API_VERSION,
        kind: ADMISSION_KIND,
        response,
    };
    let mut out = Vec::with_capacity(256);
    // Strings, numbers and booleans into a Vec: serializing cannot fail.
    serde_json::to_writer(&mut out, &review).unwrap_or_else(|_| out.clear());
    out
}

/// The AdmissionReview answering request `uid` with `decision`, as JSON.
pub fn response(uid: &str, decision: &Decision) -> Result<Vec<u8>, EncodeError> {
    match decision {
        Decision::Unchanged => Ok(write(Response {
            uid,
            allowed: true,
            status: None,
            patch_type: None,
            patch: None,
            warnings: &[],
        })),
        Decision::Rewrite { patch, warnings } => {
            let bytes = serde_json::to_vec(patch)?;
            Ok(write(Response {
                uid,
                allowed: true,
                status: None,
                patch_type: Some("JSONPatch"),
                patch: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
                warnings,
            }))
        }
        Decision::Deny { message } => Ok(refusal(uid, 403, message)),
        Decision::Error { code, message } => Ok(refusal(uid, *code, message)),
    }
}

/// The AdmissionReview refusing request `uid` with HTTP status `code`
/// (403: denied; 400, 500, 503: not decided) and `message`, as JSON.
pub fn refusal(uid: &str, code: u16, message: &str) -> Vec<u8> {
    let reason = match code {
        400 => "BadRequest",
        403 => "Forbidden",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    write(Response {
        uid,
        allowed: false,
        status: Some(Status {
            status: "Failure",
            code,
            reason,
            message,
        }),
        patch_type: None,
        patch: None,
        warnings: &[],
    })
}
