//! The labels and annotations openflux writes, `openflux.dev/*`. Those a
//! producer reads or writes too are in the API crate ([`crate::api`]:
//! `SOURCE_REF_ANNOTATION`, the source and artifact labels).

/// Annotation holding the identity that last wrote an Artifact's spec.
pub const WRITER_ANNOTATION: &str = "openflux.dev/written-by";

/// Annotation on an Artifact openflux adopted from Open Flux: the writer of
/// the Open Flux Artifact it stands for (openflux itself writes the adopted
/// one).
pub const ADOPTED_WRITER_ANNOTATION: &str = "openflux.dev/adopted-written-by";

/// Label on an adopted Artifact: the API group of the Open Flux Artifact it
/// stands for.
pub const ADOPTED_FROM_LABEL: &str = "openflux.dev/adopted-from";

/// Label on every shadow (besides the managed-by label).
pub const SHADOW_LABEL: &str = "openflux.dev/shadow";

/// Annotation on a consumer openflux re-pointed: the exported objects it
/// pointed at before, which openflux keeps until the consumer has
/// reconciled the move (a JSON list of `consumers::repoint::ObjectKey`).
pub const MOVED_FROM_ANNOTATION: &str = "openflux.dev/moved-from";

/// Label a producer sets on the Artifact that speaks for its source.
pub const DEFAULT_ARTIFACT_LABEL: &str = "openflux.dev/default-artifact";
