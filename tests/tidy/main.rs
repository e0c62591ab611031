//! Static checks of the tree, one test binary: the committed CRDs against
//! the Rust types, the monitoring configuration, the tests docs/security.md
//! names, and the layout of the source (layers, file lengths).

mod crds;
mod floors;
mod monitoring_config;
mod readme_reasons;
mod security_doc;
mod source_layout;
