//! Native rate-limiter commands for Redis and Valkey. The layers, lowest first; each folder is
//! one layer and imports only from the layers above it in this list (`tests/layers.rs` checks it
//! against `docs/architecture.md`):
//!
//! - `codec`: bytes to values and back: error replies, numbers as `%.17g`, arguments, the checks
//!   on stored numbers.
//! - `core`: one pure file per algorithm: state and time (µs) in, decision and new state out.
//! - `observe`: what calls came to: the counters of `INFO ratelimit` and `RL.TOP`'s most-denied
//!   keys.
//! - `store`: the `Store` trait over one open key, the `Effect` a decision writes, and the
//!   pipelines over it, one per shape of stored state (`string`, `zset`) and one for several
//!   limits at once (`all`).
//! - `command`: one file per command: its descriptor, arguments, error texts and wiring to its
//!   core and its pipeline; `registry` lists them.
//! - `binding`: the only FFI: module load, the entry point of every command, a key as a `Store`
//!   (the one applier of `Effect`), replies and replication.

// Range checks are written as plain comparisons, the way the Lua twins must write them.
#![allow(clippy::manual_range_contains)]

mod binding;
pub mod codec;
pub mod command;
pub mod core;
pub mod observe;
pub mod store;

use binding::on_load;

redis_module::redis_module! {
    name: "ratelimit",
    version: 1,
    allocator: (crate::binding::allocator::ModuleAllocator, crate::binding::allocator::ModuleAllocator),
    data_types: [],
    init: on_load,
    commands: [],
}
