//! openflux: opens upstream Flux to custom source types.
//!
//! See the README for the user's view; each module's documentation says what
//! it is responsible for.

pub use openflux_api as api;
pub mod adopt;
pub mod certs;
pub mod controller;
pub mod evidence;
pub mod export;
pub mod facts;
pub mod gate;
pub mod identity;
pub mod index;
pub mod locks;
pub mod mirror;
pub mod naming;
pub mod references;
pub mod runtime;
pub mod shadow;
pub mod shard;
pub mod small_set;
pub mod target;
pub mod telemetry;
pub mod trust;
pub mod webhook;
