//! Records the commit openflux-http-source is built from, for
//! `openflux-http-source --version`: the workspace's own build script.

include!("../../build.rs");
