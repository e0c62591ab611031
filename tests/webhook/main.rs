//! The webhook's server and its endpoints in this process, no cluster:
//! limits and load, TLS, and the health and metrics endpoints.

mod accept_any;
mod endpoints;
mod webhook_limits;
mod webhook_tls;
