//! Generated AdmissionReview bodies for the chaos runs: valid reviews of
//! every consumer, and the same broken in every way a client could break
//! them (truncated, wrong types, deep nesting, huge strings, odd unicode,
//! not JSON at all). Deterministic from a seed.
#![allow(dead_code)]

use serde_json::{json, Value};

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const ODD: &[&str] = &[
    "",
    "web",
    "é",
    "\u{0}",
    "\u{202e}rtl",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "a\"b\\c",
    "\u{feff}bom",
    "\u{fffd}",
    "x/y",
    "..",
    "%00",
    "ExternalArtifact",
    "GitRepository",
    "Artifact",
    "HttpSource",
];

fn odd_value(rng: &mut Rng, depth: u32) -> Value {
    match rng.below(if depth > 3 { 6 } else { 9 }) {
        0 => Value::Null,
        1 => json!(rng.next().is_multiple_of(2)),
        2 => json!(rng.next() as i64),
        3 => json!(f64::from_bits(rng.next() & 0x7fef_ffff_ffff_ffff)),
        4 | 5 => json!(*rng.pick(ODD)),
        6 => Value::Array(
            (0..rng.below(4))
                .map(|_| odd_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut map = serde_json::Map::new();
            for _ in 0..rng.below(4) {
                map.insert(rng.pick(ODD).to_string(), odd_value(rng, depth + 1));
            }
            Value::Object(map)
        }
    }
}

const CONSUMERS: &[(&str, &str, &str)] = &[
    (
        "kustomize.toolkit.fluxcd.io",
        "kustomizations",
        "Kustomization",
    ),
    ("helm.toolkit.fluxcd.io", "helmreleases", "HelmRelease"),
    (
        "source.extensions.fluxcd.io",
        "artifactgenerators",
        "ArtifactGenerator",
    ),
    ("openflux.dev", "artifacts", "Artifact"),
    ("", "pods", "Pod"),
];

fn reference(rng: &mut Rng) -> Value {
    let kind = *rng.pick(&[
        "HttpSource",
        "GitRepository",
        "Artifact",
        "ExternalArtifact",
        "Bucket",
    ]);
    let mut r = json!({"kind": kind, "name": *rng.pick(&["web", "app", "é"])});
    if rng.below(2) == 0 {
        r["apiVersion"] = json!(*rng.pick(&[
            "sources.openflux.dev/v1alpha1",
            "source.toolkit.fluxcd.io/v1",
            "openflux.dev/v1alpha1",
        ]));
    }
    if rng.below(4) == 0 {
        r["namespace"] = json!(*rng.pick(&["apps", "other"]));
    }
    r
}

/// A well-formed review of a random consumer.
pub fn valid(rng: &mut Rng) -> Value {
    let (group, resource, kind) = *rng.pick(CONSUMERS);
    let spec = match kind {
        "Kustomization" => json!({"sourceRef": reference(rng), "path": "./", "interval": "1m"}),
        "HelmRelease" => json!({"chartRef": reference(rng), "values": {"a": [1, 2, 3]}}),
        "ArtifactGenerator" => json!({"sources": [
            {"alias": "one", "kind": "HttpSource", "name": "web"},
            {"alias": "two", "kind": "GitRepository", "name": "repo"}
        ]}),
        "Artifact" => {
            json!({"url": "http://127.0.0.1:1/a.tar.gz", "revision": *rng.pick(&["v1", "v2"]),
                             "digest": "sha256:00"})
        }
        _ => json!({"containers": []}),
    };
    let operation = *rng.pick(&["CREATE", "UPDATE", "DELETE", "CONNECT"]);
    let object = json!({
        "apiVersion": format!("{group}/v1"), "kind": kind,
        "metadata": {"name": "obj", "namespace": "apps", "annotations": {"x": "y"}},
        "spec": spec,
    });
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{}", rng.next()),
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "namespace": "apps", "operation": operation,
            "userInfo": {"username": "chaos"},
            "object": object.clone(),
            "oldObject": if operation == "UPDATE" { object } else { Value::Null },
            "dryRun": rng.below(2) == 0,
        }
    })
}

/// Replaces a random node of `value` with an odd value.
fn mutate(rng: &mut Rng, value: &mut Value, depth: u32) {
    let descend = depth < 6 && rng.below(3) != 0;
    match value {
        Value::Object(map) if descend && !map.is_empty() => {
            let key = map
                .keys()
                .nth(rng.below(map.len() as u64) as usize)
                .cloned();
            if let Some(child) = key.and_then(|k| map.get_mut(&k)) {
                return mutate(rng, child, depth + 1);
            }
        }
        Value::Array(items) if descend && !items.is_empty() => {
            let i = rng.below(items.len() as u64) as usize;
            return mutate(rng, &mut items[i], depth + 1);
        }
        _ => {}
    }
    *value = odd_value(rng, 0);
}

/// One body: valid or broken in one of many ways. At most `max` bytes
/// (huge strings stay under it).
pub fn body(rng: &mut Rng, max: usize) -> Vec<u8> {
    let mut review = valid(rng);
    let kind = rng.below(10);
    match kind {
        0..=2 => {}
        3 | 4 => {
            for _ in 0..=rng.below(3) {
                mutate(rng, &mut review, 0);
            }
        }
        5 => {
            let bytes = serde_json::to_vec(&review).unwrap_or_default();
            let cut = rng.below(bytes.len() as u64 + 1) as usize;
            return bytes[..cut].to_vec();
        }
        6 => {
            let depth = 1 + rng.below(4000) as usize;
            let open = if rng.below(2) == 0 { "[" } else { "{\"a\":" };
            let nested = format!(
                "{}1{}",
                open.repeat(depth),
                if open == "[" { "]" } else { "}" }.repeat(depth)
            );
            let at = *rng.pick(&[
                "/request/object/spec/sourceRef",
                "/request/object/spec/values",
                "/request/object/metadata",
            ]);
            let text = serde_json::to_string(&review).unwrap_or_default();
            let marker = "\"__nested__\"";
            if let Some(slot) = review.pointer_mut(at) {
                *slot = json!("__nested__");
            }
            let text = serde_json::to_string(&review).unwrap_or(text);
            return text.replacen(marker, &nested, 1).into_bytes();
        }
        7 => {
            let len = rng.below((max / 2) as u64) as usize;
            let huge = rng.pick(&["a", "é", "\u{1F600}", "\\"]).repeat(len / 4);
            let at = *rng.pick(&[
                "/request/uid",
                "/request/object/metadata/name",
                "/request/object/spec/values",
                "/request/object/spec/sourceRef/name",
            ]);
            if let Some(slot) = review.pointer_mut(at) {
                *slot = json!(huge);
            }
        }
        8 => {
            // Raw bytes: invalid UTF-8, lone surrogates, control characters.
            let raw: &[&[u8]] = &[
                b"\xff\xfe",
                b"\"\\ud800\"",
                b"\x00\x01",
                b"{\"request\":",
                b"nul",
                b"[]",
            ];
            let mut bytes = serde_json::to_vec(&review).unwrap_or_default();
            let at = rng.below(bytes.len() as u64) as usize;
            let piece = rng.pick(raw);
            bytes.splice(at..at, piece.iter().copied());
            return bytes;
        }
        _ => {
            let odd = odd_value(rng, 0);
            return serde_json::to_vec(&odd).unwrap_or_default();
        }
    }
    let bytes = serde_json::to_vec(&review).unwrap_or_default();
    bytes[..bytes.len().min(max)].to_vec()
}

/// What an answer to `request` (the body sent) must be: a plain 400, or an
/// AdmissionReview that allows or refuses, echoes the request's uid, and
/// whose patch, if any, is a JSON patch that applies to the object sent.
pub fn check(request: &[u8], status: u16, body: &[u8]) -> Result<&'static str, String> {
    if status == 400 {
        return Ok("400");
    }
    if status != 200 {
        return Err(format!("status {status}"));
    }
    let review: Value =
        serde_json::from_slice(body).map_err(|e| format!("answer is not JSON: {e}"))?;
    let response = &review["response"];
    // A request serde_json cannot read (nested deeper than its limit, where
    // openflux skips what it does not read) is checked on its text: the uid
    // must be the one it carries, the patch must at least be a JSON patch.
    let sent: Option<Value> = serde_json::from_slice(request).ok();
    let sent = sent.as_ref().map(|r| &r["request"]);
    let Some(uid) = response["uid"].as_str() else {
        return Err(format!("no uid in {review}"));
    };
    match sent.map(|r| r["uid"].as_str()) {
        Some(Some(expected)) if uid != expected => {
            return Err(format!("uid {uid:?} answers request {expected:?}"));
        }
        Some(_) => {}
        None => {
            let quoted = serde_json::to_string(uid).unwrap_or_default();
            let text = String::from_utf8_lossy(request);
            if !text.contains(&format!("\"uid\":{quoted}")) {
                return Err(format!("uid {uid:?} is not the request's"));
            }
        }
    }
    if let Some(patch) = response.get("patch").filter(|p| !p.is_null()) {
        if response["patchType"] != "JSONPatch" {
            return Err(format!("a patch without patchType JSONPatch: {review}"));
        }
        use base64::Engine as _;
        let bytes = patch
            .as_str()
            .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p).ok())
            .ok_or_else(|| format!("the patch is not base64: {patch}"))?;
        let ops: json_patch::Patch = serde_json::from_slice(&bytes)
            .map_err(|e| format!("the patch is not a JSON patch: {e}"))?;
        if let Some(sent) = sent {
            let mut object = sent["object"].clone();
            json_patch::patch(&mut object, &ops)
                .map_err(|e| format!("the patch does not apply to the object: {e}"))?;
        }
    }
    match response["allowed"].as_bool() {
        Some(true) => Ok("allowed"),
        Some(false) => Ok("denied"),
        None => Err(format!("no allowed in {review}")),
    }
}
