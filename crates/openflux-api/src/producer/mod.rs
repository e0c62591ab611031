//! What a source controller needs to publish artifacts Flux can consume
//! (feature `producer`).
//!
//! A source controller turns whatever it watches into a tar.gz, keeps that
//! file downloadable over HTTP and publishes an [`Artifact`](crate::Artifact)
//! naming it. The pieces, each usable alone:
//!
//! - [`archive`]: pack files or a directory into a deterministic tar.gz (the
//!   same content always gives the same bytes, so the same digest), with
//!   Flux's `.sourceignore`-style exclusions;
//! - [`unpack`]: read the files of an untrusted tar or tar.gz, rejecting
//!   unsafe entries and bounding the decompressed size;
//! - [`digest`]: `algo:hex` digests as Flux writes them, computed and
//!   verified;
//! - [`storage`]: a content-addressed store on local disk with Flux's
//!   retention (TTL and records), and the HTTP server that serves it;
//! - [`publish`]: write the Artifact by server-side apply, owned by its
//!   source (controller ownerReference with the source's UID), so
//!   Kubernetes deletes it with the source.

pub mod archive;
pub mod digest;
pub mod publish;
pub mod storage;
pub mod unpack;

#[cfg(test)]
mod testutil;

pub use archive::{pack, pack_dir, ArchiveError, File, IgnoreRules, Packed};
pub use digest::{Algorithm, Digest, DigestError};
pub use publish::{artifact_for, exported_ref, owner_reference, PublishError, Publisher};
pub use storage::{Retention, Storage};
