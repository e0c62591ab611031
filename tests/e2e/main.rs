//! The end-to-end tests on the local control plane and the Flux matrix
//! cells: one test binary, a module per feature. The tests of one module
//! run beside each other; a module's tests never run beside another
//! module's, as some install objects the whole cluster sees or stop the
//! API server (`openflux_testkit::turns`, taken by `cluster()` and
//! `cell()`). `cargo test --test e2e e2e_core::` runs one module.

// The chaos scenarios, shared with `make chaos` (benches/chaos).
#[path = "../chaos/failover.rs"]
mod failover;
#[path = "../chaos/restart.rs"]
mod restart;

// The webhook's misbehaving clients, shared with tests/webhook.
#[path = "../webhook/accept_any.rs"]
mod accept_any;
#[path = "../common/attack.rs"]
mod attack;

mod e2e_cells;
mod e2e_certs;
mod e2e_compat;
mod e2e_core;
mod e2e_failover;
mod e2e_harness;
mod e2e_install;
mod e2e_lockdown;
mod e2e_matrix;
mod e2e_monitoring;
mod e2e_operator;
mod e2e_policy;
mod e2e_privilege;
mod e2e_restart;
mod e2e_roles;
mod e2e_shards;
mod e2e_source_policy;
mod e2e_upstream;
mod e2e_versions;
mod e2e_webhook;
