//! How deep an object may nest for openflux's controllers to read it as
//! the API server serves it. Pure constants, measured once: the decoder's
//! limit and how much deeper the API server's copy of an object's fields
//! in `metadata.managedFields` goes.

/// The deepest nesting serde_json decodes, which openflux's controllers
/// read every object with: a value inside 128 objects or lists (the
/// outermost counted) fails with "recursion limit exceeded". The API server
/// stores deeper objects where a schema leaves a field open
/// (`x-kubernetes-preserve-unknown-fields`, as `spec.exportedInputs`).
pub const DECODER_DEPTH: usize = 127;

/// How much deeper than an object's own nesting its
/// `metadata.managedFields` go: the API server records each field an
/// object has in `fieldsV1`, a copy of the object's maps inside
/// `metadata`, the list, its entry and `fieldsV1` itself, and a field of
/// the object's innermost map is one more object there. Measured on
/// kube-apiserver 1.36: an Artifact 132 levels deep is served 137 deep.
pub const MANAGED_FIELDS_DEPTH: usize = 5;

/// The deepest an Artifact may nest (the Artifact itself counted as 1,
/// its `spec` as 2) for openflux's controllers to decode it as the API
/// server serves it, managed fields and all: the webhook refuses deeper
/// ones, which the controllers would otherwise skip.
pub const MAX_DEPTH: usize = DECODER_DEPTH - MANAGED_FIELDS_DEPTH;
