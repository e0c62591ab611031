//! The webhook's server and its endpoints in this process, no cluster:
//! limits and load, TLS, and the health and metrics endpoints.

mod accept_any;
#[path = "../common/attack.rs"]
mod attack;
mod endpoints;
mod webhook_fairness;
mod webhook_limits;
mod webhook_tls;
