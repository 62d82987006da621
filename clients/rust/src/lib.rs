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
//! - [`Client::check_upto`]: a partial grant, as many units as are left up to `n`.
//! - [`Client::with_batching`]: leased batches for hot keys, admitted in the process from one
//!   partial grant; [`Client::with_deny_cache`]: denials repeated in the process until their
//!   `retry_after_ms` has passed.
//! - [`Client::sentinel`]: a client that follows the master a set of Sentinels name across
//!   failovers ([`SentinelConnection`]); [`Client::cluster`]: a Redis Cluster client that
//!   follows redirections and failovers ([`FollowingClusterConnection`]).
//! - [`Client::with_durability`]: admissions acknowledged by replicas (`WAIT`) before they admit.
//! - [`Client::top`]: the keys with the most denials on the server (`RL.TOP`, module only).
//! - [`middleware`]: HTTP rate limiting with the standard response headers, and shadow policies
//!   that are evaluated and reported but never deny.

mod algorithm;
mod batch;
mod breaker;
mod client;
mod cluster;
mod deny;
mod durable;
mod flight;
mod lease;
mod local;
mod lru;
pub mod metrics;
pub mod middleware;
mod reservation;
mod sentinel;
mod text;
mod types;

pub use algorithm::{Algorithm, Concurrency};
pub use batch::{BatchStats, Batching};
pub use breaker::BreakerConfig;
pub use client::{Client, Limiter};
pub use cluster::FollowingClusterConnection;
pub use lease::{Lease, LeaseOutcome, MultiLeaseOutcome};
pub use reservation::{MultiReservationOutcome, Reservation, ReservationOutcome};
pub use sentinel::SentinelConnection;
pub use types::{
    Decision, Degraded, Durability, DurabilityStats, Error, FailurePolicy, LocalAnswer, Mode,
    ModeChoice, MultiOutcome, Options, Outcome, Settlement, ShortAck, TopEntry,
};
