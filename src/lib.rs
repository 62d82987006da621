//! Native rate-limiter commands for Redis.
//!
//! - `core`: one pure file per algorithm (no Redis types).
//! - `command`: one file per command: its arguments and stored fields, wired to its core.
//! - `pipeline`: load -> decide -> store, over a storage trait (Redis, or memory in tests).
//! - `zset_store`: the same pipeline for limiters whose state is a sorted set.
//! - `args`, `stored`, `number`: shared parsing and formatting of numbers.
//! - `binding`: the thin Redis layer (key I/O, replication, replies).

// Range checks are written as plain comparisons, the way the Lua twins must write them.
#![allow(clippy::manual_range_contains)]

pub mod allocator;
pub mod args;
mod binding;
pub mod command;
pub mod core;
pub mod error;
pub mod number;
pub mod pipeline;
pub mod stats;
pub mod stored;
pub mod top;
pub mod zset_store;

use binding::on_load;

redis_module::redis_module! {
    name: "ratelimit",
    version: 1,
    allocator: (crate::allocator::ModuleAllocator, crate::allocator::ModuleAllocator),
    data_types: [],
    init: on_load,
    commands: [],
}
