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
//! - `binding`: the only FFI: module load and unload, the entry point of every command, a key as
//!   a `Store` (the one applier of `Effect`), replies and replication.
//!
//! Here: the entry points the server looks up, and the allocator. They are declared by hand
//! rather than by `redis_module!`, whose load also keeps a thread-safe context for the module's
//! life that no unload can free.

// Range checks are written as plain comparisons, the way the Lua twins must write them.
#![allow(clippy::manual_range_contains)]

mod binding;
pub mod codec;
pub mod command;
pub mod core;
pub mod observe;
pub mod store;

use std::ffi::c_int;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

/// Every allocation of the module goes through Redis's allocator inside redis-server, so
/// `INFO memory` counts it (the system allocator elsewhere: tests, benches).
#[global_allocator]
static ALLOCATOR: binding::allocator::ModuleAllocator = binding::allocator::ModuleAllocator;

/// Called by the server to load the module (`loadmodule`, `MODULE LOAD`).
///
/// # Safety
/// Called by the server only, with a valid context and `argc` valid strings in `argv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: forwarded unchanged.
    unsafe { binding::on_load(ctx, argv, argc) }
}

/// Called by the server on `MODULE UNLOAD`, before it unloads the module.
///
/// # Safety
/// Called by the server only, with a valid context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RedisModule_OnUnload(ctx: *mut RedisModuleCtx) -> c_int {
    binding::on_unload(ctx)
}
