//! Async client for the rate-limiter module, with the `lua-reference/` scripts as a fallback when
//! the module is not loaded, and a tower layer for axum.
//!
//! - [`Client`]: one connection (single node or cluster), module detection, per-call timeout,
//!   failure policy and circuit breaker.
//! - [`Limiter`]: a [`Client`] bound to one [`Algorithm`] and its parameters.
//! - [`Client::acquire`]: a slot of a [`Concurrency`] limit, held by a [`Lease`] until it is
//!   dropped, released or expires.
//! - [`Client::reserve`]: an estimate consumed up front, then a [`Reservation`] settled with the
//!   true cost once known (refunded or charged, into debt if need be).
//! - [`Client::top`]: the keys with the most denials on the server (`RL.TOP`, module only).
//! - [`middleware`]: HTTP rate limiting with the standard response headers, and shadow policies
//!   that are evaluated and reported but never deny.

mod algorithm;
mod breaker;
mod client;
mod lease;
mod local;
pub mod metrics;
pub mod middleware;
mod reservation;
mod types;

pub use algorithm::{Algorithm, Concurrency};
pub use breaker::BreakerConfig;
pub use client::{Client, Limiter};
pub use lease::{Lease, LeaseOutcome, MultiLeaseOutcome};
pub use reservation::{MultiReservationOutcome, Reservation, ReservationOutcome};
pub use types::{
    Decision, Degraded, Error, FailurePolicy, Mode, ModeChoice, MultiOutcome, Options, Outcome,
    Settlement, TopEntry,
};
