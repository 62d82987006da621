//! The command table: every command the module registers, and the generic entry points that
//! connect a command's definition (`crate::command`) to Redis.

use std::ffi::{CStr, c_int};

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::{Command, api, clock, entry, hash_key, zset_key};
use crate::command::sliding_log;
use crate::command::token_bucket::TokenBucket;
use crate::pipeline::HashLimiter;

/// Flags of every limiter command: it may write, must not write when out of memory, and runs in
/// constant time. One key, at position 1.
const LIMITER_FLAGS: &CStr = c"write deny-oom fast";

/// A limiter whose state is one hash: the pipeline in `hash_key`.
const fn hash_limiter<L: HashLimiter<N>, const N: usize>() -> Command {
    Command {
        name: L::NAME,
        handler: hash_command::<L, N>,
        flags: LIMITER_FLAGS,
        keys: (1, 1, 1),
        stats: Some(L::STATS),
    }
}

pub const ALL: [Command; 2] = [hash_limiter::<TokenBucket, 2>(), SLIDING_LOG];

pub const TEST_CLOCK: Command = Command {
    name: c"RL.TESTCLOCK",
    handler: test_clock_command,
    flags: c"readonly fast",
    keys: (0, 0, 0),
    stats: None,
};

unsafe extern "C" fn hash_command<L: HashLimiter<N>, const N: usize>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, |ctx, argv| {
        let outcome = hash_key::run::<L, N>(ctx, argv);
        L::STATS.record(&outcome);
        Ok(api::reply_integers(ctx, &outcome?.to_array()))
    })
}

unsafe extern "C" fn test_clock_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, clock::test_clock_command)
}

/// `RL.SLIDINGLOG`: its state is a sorted set, handled by `zset_key`.
const SLIDING_LOG: Command = Command {
    name: sliding_log::NAME,
    handler: sliding_log_command,
    // Not `fast`: a call reads every entry of the key (up to the limit bound).
    flags: c"write deny-oom",
    keys: (1, 1, 1),
    stats: Some(&sliding_log::STATS),
};

unsafe extern "C" fn sliding_log_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, |ctx, argv| {
        let outcome = zset_key::run_sliding_log(ctx, argv);
        sliding_log::STATS.record(&outcome);
        Ok(api::reply_integers(ctx, &outcome?.to_array()))
    })
}
