//! The command table: every command the module registers, and the generic entry points that
//! connect a command's definition (`crate::command`) to Redis.

use std::ffi::{CStr, c_int};

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::{Command, api, clock, entry, string_key, zset_key};
use crate::command::all;
use crate::command::fixed_window::FixedWindow;
use crate::command::gcra::Gcra;
use crate::command::leaky_bucket::LeakyBucket;
use crate::command::sliding_log;
use crate::command::sliding_window::SlidingWindow;
use crate::command::token_bucket::TokenBucket;
use crate::pipeline::FieldsLimiter;

/// Flags of every limiter command: it may write and runs in constant time. Not `deny-oom`: under
/// memory pressure Redis would then refuse every call, denials and peeks included; instead the
/// module refuses with the same OOM error only the calls that would write (`api::check_memory`).
pub(super) const LIMITER_FLAGS: &CStr = c"write fast";

/// A limiter whose state is a few numbers in one string: the pipeline in `string_key`.
const fn fields_limiter<L: FieldsLimiter<N>, const N: usize>() -> Command {
    Command {
        name: L::NAME,
        handler: fields_command::<L, N>,
        flags: LIMITER_FLAGS,
        keys: (1, 1, 1),
        stats: Some(L::STATS),
    }
}

pub const ALL: [Command; 8] = [
    fields_limiter::<TokenBucket, 2>(),
    fields_limiter::<LeakyBucket, 2>(),
    fields_limiter::<FixedWindow, 2>(),
    fields_limiter::<SlidingWindow, 3>(),
    fields_limiter::<Gcra, 1>(),
    SLIDING_LOG,
    string_key::THROTTLE,
    Command {
        name: all::NAME,
        handler: all_command,
        // Redis 7.0 routes cluster calls (and checks CROSSSLOT) with the keys a command reports
        // through the getkeys API, not with key specs; the key spec is still set for tools.
        flags: c"write fast getkeys-api",
        keys: (0, 0, 0),
        stats: Some(&all::STATS),
    },
];

pub const TEST_CLOCK: Command = Command {
    name: c"RL.TESTCLOCK",
    handler: test_clock_command,
    flags: c"readonly fast",
    keys: (0, 0, 0),
    stats: None,
};

unsafe extern "C" fn fields_command<L: FieldsLimiter<N>, const N: usize>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, |ctx, argv| {
        let outcome = string_key::run_fields::<L, N>(ctx, argv);
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

/// `RL.ALL`: `[allowed, denied_by, [reply of limit 1], [reply of limit 2], ...]`.
unsafe extern "C" fn all_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, |ctx, argv| {
        if api::is_keys_position_request(ctx) {
            return Ok(api::report_key_positions(
                ctx,
                all::key_positions(argv.len(), |i| {
                    // SAFETY: argv strings live for the whole call.
                    argv.get(i).map(|s| unsafe { api::string_bytes(*s) })
                }),
            ));
        }
        let outcome = string_key::run_all(ctx, argv);
        all::STATS.record_decision(outcome.as_ref().map(|r| r.allowed).ok());
        let r = outcome?;
        let head = [
            i64::from(r.allowed),
            i64::try_from(r.denied_by).unwrap_or(0),
        ];
        let nested: Vec<[i64; 5]> = r.replies.iter().map(|x| x.to_array()).collect();
        Ok(api::reply_nested(ctx, &head, &nested))
    })
}

/// `RL.SLIDINGLOG`: its state is a sorted set, handled by `zset_key`.
const SLIDING_LOG: Command = Command {
    name: sliding_log::NAME,
    handler: sliding_log_command,
    // Not `fast`: a call reads every entry of the key (up to the limit bound). Not `deny-oom`,
    // as for every limiter (see LIMITER_FLAGS).
    flags: c"write",
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
