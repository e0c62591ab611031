//! openflux: opens upstream Flux to custom source types.
//!
//! See the README for the user's view; each module's documentation says what
//! it is responsible for.

pub use openflux_api as api;
pub mod adopt;
pub mod certs;
pub mod cluster;
pub mod consumers;
pub mod control;
pub mod export;
pub mod index;
pub mod locks;
pub mod mirror;
pub mod names;
pub mod policy;
pub mod registration;
pub mod rewrite;
pub mod runtime;
pub mod shard;
pub mod telemetry;
pub mod vocabulary;
pub mod watch;
pub mod webhook;
