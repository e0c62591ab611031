//! What openflux knows of the cluster, and the export target each consumer
//! kind gets from it.
//!
//! - [`target`]: the two export targets and the rule that picks one for a
//!   consumer kind (pure);
//! - [`evidence`]: what the consumers' CRDs and the Flux controllers'
//!   Deployments say, read from their JSON (pure);
//! - [`listers`]: controllers that find ExternalArtifacts by name or
//!   labels (flux-operator), for which an ExternalArtifact is exported
//!   whatever the gates say (pure);
//! - [`facts`]: everything read, decided into one choice per consumer kind
//!   (pure);
//! - [`survey`]: the shell that reads the cluster and keeps the facts where
//!   the webhook and the export controller read them;
//! - [`gate`]: the shell that notices consumers refused for lack of the
//!   `ExternalArtifact` feature gate.

pub mod evidence;
pub mod facts;
pub mod gate;
pub mod listers;
pub mod survey;
pub mod target;
