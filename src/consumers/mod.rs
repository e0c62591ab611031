//! The Flux objects that consume sources.
//!
//! - [`references`]: which exported objects the consumers refer to (pure);
//! - [`repoint`]: where a consumer openflux rewrote should point now (pure);
//! - [`controller`]: the leader's watches of the consumers, which keep the
//!   references and re-point (the shell).

pub mod controller;
pub mod references;
pub mod repoint;
