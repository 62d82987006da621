//! The rate limit service for Envoy: `envoy.service.ratelimit.v3.RateLimitService` on the
//! rate-limiter module, reading envoyproxy/ratelimit's configuration and environment.
//!
//! - [`settings`]: every environment variable and its default.
//! - [`config`]: the YAML files, checked and built into descriptor trees; the lookup.
//! - [`limiter`]: a request's limits decided through `ratelimit-client`, all or none.
//! - [`metrics`]: the Prometheus counters, with envoyproxy/ratelimit's names and labels.
//! - [`service`]: the `ShouldRateLimit` call.
//! - [`watch`]: the configuration directory looked at again, and reloaded on a change.
//! - [`server`]: the gRPC, health and metrics listeners.

pub mod config;
pub mod limiter;
pub mod metrics;
pub mod server;
pub mod service;
pub mod settings;
pub mod watch;
