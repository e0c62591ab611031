//! Static checks of the tree, one test binary: the README's compatibility
//! table against the tests it names, the committed CRDs against
//! the Rust types, the monitoring configuration, the tests docs/security.md
//! names, the layout of the source (layers, file lengths, the floors of
//! its folders and no loop between them), and the
//! versions the docs name against e2e/versions.env.

mod compatibility;
mod crds;
mod floors;
mod monitoring_config;
mod ready_reasons;
mod security_doc;
mod source_layout;
mod versions_doc;
