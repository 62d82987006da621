//! One entry point per command, each a few lines of glue from arguments to a pure core.

use std::ffi::c_int;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::api::{self, StaticName};
use super::hash_limiter::{self, HashLimiter, HashWrite};
use super::{Command, clock, entry};
use crate::core::{Reply, token_bucket};
use crate::error::ErrorReply;
use crate::{args, codec};

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

static TOKENS: StaticName = StaticName::new(c"tokens");
static TS: StaticName = StaticName::new(c"ts");

struct TokenBucket;

impl HashLimiter<2> for TokenBucket {
    type Args = args::TokenBucketArgs;
    type State = token_bucket::State;
    const FIELDS: [&'static StaticName; 2] = [&TOKENS, &TS];

    fn parse(raw: &[&[u8]]) -> Result<Self::Args, ErrorReply> {
        args::token_bucket(raw)
    }

    fn decode(fields: [Option<&[u8]>; 2]) -> Result<Self::State, ErrorReply> {
        codec::decode_token_bucket(fields)
    }

    fn decide(a: &Self::Args, now_us: i64, prior: Option<Self::State>) -> (Reply, Option<HashWrite<2>>) {
        let params = token_bucket::Params { capacity: a.capacity, refill_per_sec: a.refill_per_sec };
        let out = token_bucket::decide(&params, a.cost, now_us, prior);
        let write = out.write.map(|w| HashWrite {
            values: codec::encode_token_bucket(&w.state),
            expire_at_ms: w.expire_at_ms,
        });
        (out.reply, write)
    }
}

unsafe extern "C" fn token_bucket_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, |ctx, argv| {
        let r = hash_limiter::run::<TokenBucket, 2>(ctx, argv, args::TOKEN_BUCKET_ARITY)?;
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
