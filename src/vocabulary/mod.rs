//! openflux's vocabulary, at the ground floor: what every feature agrees on
//! and none decides.
//!
//! - [`consumers`]: the Flux consumer kinds, where their source references
//!   live and which stock kinds each field accepts (read by the webhook,
//!   the survey, the gate scan and the re-pointer alike);
//! - [`marks`]: the labels and annotations openflux writes (`openflux.dev/*`),
//!   beside those of the API crate ([`crate::api`]);
//! - [`mirrored`]: what marks the mirror of a stock Flux source, and its
//!   fingerprint (written by the mirror, kept by the owner index);
//! - [`uid`]: an object's uid as the index and the mirror keep it.

pub mod consumers;
pub mod marks;
pub mod mirrored;
pub mod uid;
