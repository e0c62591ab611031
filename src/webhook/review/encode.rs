//! The answering AdmissionReview, written straight to bytes: the fixed
//! parts as they are, the request's uid and the decision's strings escaped
//! as JSON strings, with no JSON tree in between. The only allocations are
//! the output (sized once) and the patch's own encoding.

use base64::Engine as _;

use crate::rewrite::Decision;

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

/// The start of every answer, up to the uid's value.
const HEAD: &str =
    r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;

/// Room for the envelope, the uid and the small fields around the patch.
const ENVELOPE_BYTES: usize = 160;

/// `value` as a JSON string (escaped as serde_json escapes) onto `out`.
fn string(out: &mut Vec<u8>, value: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// The answer: the envelope, `"uid"` and `"allowed"`, then `rest` (the
/// fields after them, each starting with a comma), closed. Field names and
/// order are those of `admission.k8s.io/v1`'s AdmissionResponse.
fn write(uid: &str, allowed: bool, capacity: usize, rest: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE_BYTES + uid.len() + capacity);
    out.extend_from_slice(HEAD.as_bytes());
    string(&mut out, uid);
    out.extend_from_slice(if allowed {
        br#","allowed":true"#.as_slice()
    } else {
        br#","allowed":false"#.as_slice()
    });
    rest(&mut out);
    out.extend_from_slice(b"}}");
    out
}

/// The AdmissionReview answering request `uid` with `decision`, as JSON.
/// The patch is encoded once into a buffer of its expected size and its
/// base64 written straight into the answer (base64 needs no escaping).
pub fn response(uid: &str, decision: &Decision) -> Result<Vec<u8>, EncodeError> {
    match decision {
        Decision::Unchanged => Ok(write(uid, true, 0, |_| {})),
        Decision::Rewrite { patch, warnings } => {
            let mut json = Vec::with_capacity(PATCH_BYTES * patch.0.len().max(1));
            serde_json::to_writer(&mut json, patch)?;
            let base64 = base64::encoded_len(json.len(), true).unwrap_or(0);
            let warned: usize = warnings.iter().map(|w| w.len() + 8).sum();
            Ok(write(uid, true, base64 + warned + 64, |out| {
                out.extend_from_slice(br#","patchType":"JSONPatch","patch":""#);
                let start = out.len();
                out.resize(start + base64, 0);
                let written = base64::engine::general_purpose::STANDARD
                    .encode_slice(&json, &mut out[start..])
                    .unwrap_or(0);
                out.truncate(start + written);
                out.push(b'"');
                if !warnings.is_empty() {
                    out.extend_from_slice(br#","warnings":["#);
                    for (i, warning) in warnings.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        string(out, warning);
                    }
                    out.push(b']');
                }
            }))
        }
        Decision::Deny { message } | Decision::NotServed { message } => {
            Ok(refusal(uid, 403, message))
        }
        Decision::Error { code, message } => Ok(refusal(uid, *code, message)),
    }
}

/// Bytes of one patch operation as openflux writes them (a reference and
/// its annotation), so the patch is encoded without growing its buffer.
const PATCH_BYTES: usize = 256;

/// The AdmissionReview refusing request `uid` with HTTP status `code`
/// (403: denied; 400, 500, 503: not decided) and `message`, as JSON.
pub fn refusal(uid: &str, code: u16, message: &str) -> Vec<u8> {
    let reason = match code {
        400 => "BadRequest",
        403 => "Forbidden",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    write(uid, false, message.len() + 96, |out| {
        out.extend_from_slice(br#","status":{"status":"Failure","code":"#);
        out.extend_from_slice(code.to_string().as_bytes());
        out.extend_from_slice(br#","reason":""#);
        out.extend_from_slice(reason.as_bytes());
        out.extend_from_slice(br#"","message":"#);
        string(out, message);
        out.push(b'}');
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use serde_json::json;

    /// The typed structs the answer was serialized from before it was
    /// written by hand: the oracle of the bytes.
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

    fn oracle(uid: &str, decision: &Decision) -> Vec<u8> {
        let mut response = Response {
            uid,
            allowed: true,
            status: None,
            patch_type: None,
            patch: None,
            warnings: &[],
        };
        let refused = |code: u16, message| Status {
            status: "Failure",
            code,
            reason: match code {
                400 => "BadRequest",
                403 => "Forbidden",
                503 => "ServiceUnavailable",
                _ => "InternalError",
            },
            message,
        };
        match decision {
            Decision::Unchanged => {}
            Decision::Rewrite { patch, warnings } => {
                let bytes = serde_json::to_vec(patch).unwrap();
                response.patch_type = Some("JSONPatch");
                response.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
                response.warnings = warnings;
            }
            Decision::Deny { message } | Decision::NotServed { message } => {
                response.allowed = false;
                response.status = Some(refused(403, message));
            }
            Decision::Error { code, message } => {
                response.allowed = false;
                response.status = Some(refused(*code, message));
            }
        }
        serde_json::to_vec(&Review {
            api_version: ADMISSION_API_VERSION,
            kind: ADMISSION_KIND,
            response,
        })
        .unwrap()
    }

    #[test]
    fn answers_are_the_bytes_the_typed_structs_wrote() {
        let patch = |value: serde_json::Value| -> json_patch::Patch {
            serde_json::from_value(json!([
                {"op": "replace", "path": "/spec/sourceRef", "value": value},
                {"op": "add", "path": "/metadata/annotations/openflux.dev~1source-ref",
                 "value": "{\"kind\":\"Web\",\"name\":\"a \\\"b\\\"\"}"}
            ]))
            .unwrap()
        };
        let long = "x".repeat(10_000);
        let decisions = [
            Decision::Unchanged,
            Decision::Rewrite {
                patch: patch(json!({"kind": "ExternalArtifact", "name": "web"})),
                warnings: vec![],
            },
            Decision::Rewrite {
                patch: patch(json!({"kind": "K", "name": long})),
                warnings: vec!["one \"quoted\"\n".into(), "two\u{1}\\".into(), "é ☃".into()],
            },
            Decision::Rewrite {
                patch: json_patch::Patch(vec![]),
                warnings: vec![String::new()],
            },
            Decision::Deny {
                message: "say \"no\"\n\t</script>".into(),
            },
            Decision::Error {
                code: 400,
                message: String::new(),
            },
            Decision::Error {
                code: 503,
                message: "later".into(),
            },
            Decision::internal(long.clone()),
        ];
        for uid in ["u-1", "", "a\"b\\c\u{0}\u{7f}é", &long] {
            for decision in &decisions {
                let written = response(uid, decision).unwrap();
                assert_eq!(
                    String::from_utf8(written).unwrap(),
                    String::from_utf8(oracle(uid, decision)).unwrap(),
                    "{decision:?}"
                );
            }
        }
        for code in [400, 403, 500, 503, 418] {
            assert_eq!(
                refusal("u", code, "m"),
                oracle(
                    "u",
                    &Decision::Error {
                        code,
                        message: "m".into()
                    }
                )
            );
        }
    }
}
