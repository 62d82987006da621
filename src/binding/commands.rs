//! One entry point per command, each a few lines of glue from arguments to a pure core.

use std::ffi::c_int;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::{Command, api, clock, entry, hash_key};
use crate::command::token_bucket::TokenBucket;
use crate::core::Reply;

/// Flags of every limiter command: it may write, must not write when out of memory, and runs in
/// constant time. One key, at position 1.
const LIMITER_FLAGS: &std::ffi::CStr = c"write deny-oom fast";

pub const ALL: [Command; 1] = [Command {
    name: c"RL.TOKENBUCKET",
    handler: token_bucket_command,
    flags: LIMITER_FLAGS,
    keys: (1, 1, 1),
}];

pub const TEST_CLOCK: Command = Command {
    name: c"RL.TESTCLOCK",
    handler: test_clock_command,
    flags: c"readonly fast",
    keys: (0, 0, 0),
};

fn reply(ctx: *mut RedisModuleCtx, reply: Reply) -> c_int {
    api::reply_integers(ctx, &reply.to_array())
}

unsafe extern "C" fn token_bucket_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, |ctx, argv| {
        let r = hash_key::run::<TokenBucket, 2>(ctx, argv)?;
        Ok(reply(ctx, r))
    })
}

unsafe extern "C" fn test_clock_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, clock::test_clock_command)
}
