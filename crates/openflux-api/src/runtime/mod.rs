//! Flux runtime conventions (feature `runtime`).
