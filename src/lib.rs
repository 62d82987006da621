//! Native rate-limiter commands for Redis.
//!
//! - `core`: one pure file per algorithm (no Redis types).
//! - `args`, `codec`, `number`: command arguments and stored state, as bytes <-> numbers.
//! - `binding`: the thin Redis layer (key I/O, replication, replies).

pub mod allocator;
pub mod args;
mod binding;
pub mod codec;
pub mod core;
pub mod error;
pub mod number;

use binding::on_load;

redis_module::redis_module! {
    name: "ratelimit",
    version: 1,
    allocator: (crate::allocator::ModuleAllocator, crate::allocator::ModuleAllocator),
    data_types: [],
    init: on_load,
    commands: [],
}
