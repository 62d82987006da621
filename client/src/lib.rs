//! Async client for the rate-limiter module, with the `lua-reference/` scripts as a fallback when
//! the module is not loaded, and a tower layer for axum.
//!
//! - [`Client`]: one connection (single node or cluster), module detection, per-call timeout,
//!   failure policy and circuit breaker.
//! - [`Limiter`]: a [`Client`] bound to one [`Algorithm`] and its parameters.
//! - [`middleware`]: HTTP rate limiting with the standard response headers.

mod algorithm;
mod breaker;
mod client;
mod local;
pub mod metrics;
pub mod middleware;

pub use algorithm::Algorithm;
pub use breaker::BreakerConfig;
pub use client::{
    Client, Decision, Degraded, Error, FailurePolicy, Limiter, Mode, ModeChoice, MultiOutcome,
    Options, Outcome,
};
