//! The command table: every command the module registers, and the generic entry points that
//! connect a command's definition (`crate::command`) to Redis.

use std::ffi::c_int;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::{Answer, Command, Sent, api, clock, entry, key};
use crate::command::all;
use crate::command::fixed_window::FixedWindow;
use crate::command::gcra::Gcra;
use crate::command::leaky_bucket::LeakyBucket;
use crate::command::sliding_log;
use crate::command::sliding_window::SlidingWindow;
use crate::command::token_bucket::TokenBucket;
use crate::core::Reply;
use crate::pipeline::{AllReply, FieldsLimiter};

// No limiter is `deny-oom`: under memory pressure Redis would then refuse every call, denials
// and peeks included; instead the module refuses with the same OOM error only the calls that would
// write (`api::check_memory`).

/// A limiter whose state is a few numbers in one string (`crate::pipeline`).
const fn fields_limiter<L: FieldsLimiter<N>, const N: usize>() -> Command {
    Command {
        descriptor: L::DESCRIPTOR,
        handler: fields_command::<L, N>,
    }
}

/// Every command of `crate::command::DESCRIPTORS`, in the same order, with its handler.
pub const ALL: [Command; 8] = [
    fields_limiter::<TokenBucket, 2>(),
    fields_limiter::<LeakyBucket, 2>(),
    fields_limiter::<FixedWindow, 2>(),
    fields_limiter::<SlidingWindow, 3>(),
    fields_limiter::<Gcra, 1>(),
    Command {
        descriptor: &sliding_log::DESCRIPTOR,
        handler: sliding_log_command,
    },
    key::THROTTLE,
    Command {
        descriptor: &all::DESCRIPTOR,
        handler: all_command,
    },
];

pub const TEST_CLOCK: Command = Command {
    descriptor: &clock::DESCRIPTOR,
    handler: test_clock_command,
};

impl Answer for Reply {
    fn decision(&self) -> Option<bool> {
        Some(self.allowed)
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        api::reply_integers(ctx, &self.to_array())
    }
}

/// `RL.ALL`: `[allowed, denied_by, [reply of limit 1], [reply of limit 2], ...]`.
impl Answer for AllReply {
    fn decision(&self) -> Option<bool> {
        Some(self.allowed)
    }
    /// The key of the limit that denied (argv: name, numkeys, keys...); the first when admitted.
    fn key_index(&self) -> usize {
        1 + self.denied_by.max(1)
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        let head = [
            i64::from(self.allowed),
            i64::try_from(self.denied_by).unwrap_or(0),
        ];
        let nested: Vec<[i64; 5]> = self.replies.iter().map(|x| x.to_array()).collect();
        api::reply_nested(ctx, &head, &nested)
    }
}

/// The cluster's key-position request, or a decision.
enum AllAnswer {
    KeyPositions(c_int),
    Decided(AllReply),
}

impl Answer for AllAnswer {
    fn decision(&self) -> Option<bool> {
        match self {
            AllAnswer::KeyPositions(_) => None,
            AllAnswer::Decided(r) => r.decision(),
        }
    }
    fn key_index(&self) -> usize {
        match self {
            AllAnswer::KeyPositions(_) => 1,
            AllAnswer::Decided(r) => r.key_index(),
        }
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        match self {
            AllAnswer::KeyPositions(status) => *status,
            AllAnswer::Decided(r) => r.send(ctx),
        }
    }
}

unsafe extern "C" fn fields_command<L: FieldsLimiter<N>, const N: usize>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, L::DESCRIPTOR, key::run_fields::<L, N>)
}

unsafe extern "C" fn test_clock_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, &clock::DESCRIPTOR, |ctx, argv| {
        clock::test_clock_command(ctx, argv).map(Sent)
    })
}

unsafe extern "C" fn all_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, &all::DESCRIPTOR, |ctx, argv| {
        if api::is_keys_position_request(ctx) {
            return Ok(AllAnswer::KeyPositions(api::report_key_positions(
                ctx,
                all::key_positions(argv.len(), |i| {
                    // SAFETY: argv strings live for the whole call.
                    argv.get(i).map(|s| unsafe { api::string_bytes(*s) })
                }),
            )));
        }
        key::run_all(ctx, argv).map(AllAnswer::Decided)
    })
}

/// `RL.SLIDINGLOG`: its state is a sorted set (`crate::zset_store`).
unsafe extern "C" fn sliding_log_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(
        ctx,
        argv,
        argc,
        &sliding_log::DESCRIPTOR,
        key::run_sliding_log,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_described_command_is_registered_once_in_order() {
        let registered: Vec<&str> = ALL
            .iter()
            .map(|c| c.descriptor.name.to_str().unwrap())
            .collect();
        let described: Vec<&str> = crate::command::DESCRIPTORS
            .iter()
            .map(|d| d.name.to_str().unwrap())
            .collect();
        assert_eq!(registered, described);
    }
}
