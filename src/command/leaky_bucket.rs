//! `RL.LEAKYBUCKET key capacity leak_per_sec [cost]`; state: one string `<level> <ts>`.

use crate::codec::args::{BucketArgs, IntegerArg, MAX_INTEGER_ARG, RateArg};
use crate::codec::error::ErrorReply;
use crate::codec::owner::Owned;
use crate::codec::remembered::Remembered;
use crate::codec::stored::{amount, timestamp, within_skew};
use crate::command::descriptor::ArgKind::{Double, Integer, Key};
use crate::command::descriptor::{COST_ARG, Descriptor, Keys, UPTO_ARG, arg};
use crate::core::{Operation, Reply, leaky_bucket};
use crate::observe::stats::CommandStats;
use crate::store::kind::Kind;
use crate::store::string::{FieldsLimiter, FieldsWrite};
use crate::store::{FieldName, Request};

pub type Args = Request<leaky_bucket::Params>;

/// The last arguments that parsed (`FieldsLimiter::remembered`).
static REMEMBERED: Owned<Remembered<Args>> = Owned::new(Remembered::new());

const CAPACITY: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR capacity must be an integer"),
    out_of_range: ErrorReply(c"ERR capacity must be between 1 and 1000000000000000"),
    min: 1.0,
    max: MAX_INTEGER_ARG,
};
const RATE: RateArg = RateArg {
    not_number: ErrorReply(c"ERR leak_per_sec must be a number"),
    out_of_range: ErrorReply(
        c"ERR leak_per_sec must be greater than 0 and at most 1000000000000000",
    ),
};
const TOO_SLOW: ErrorReply =
    ErrorReply(c"ERR capacity / leak_per_sec must be at most 10000000000 seconds");

const BUCKET: BucketArgs = BucketArgs {
    capacity: CAPACITY,
    rate: RATE,
    too_slow: TOO_SLOW,
};

pub const CORRUPT_LEVEL: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'level' is not a valid number");
pub const CORRUPT_TS: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'ts' is not a valid timestamp");
pub const TS_AHEAD: ErrorReply = ErrorReply(
    c"ERR corrupt rate limiter state: field 'ts' is ahead of the server's clock by more than 60 seconds",
);

pub static LEVEL: FieldName = FieldName::new(c"level");
pub static TS: FieldName = FieldName::new(c"ts");

pub struct LeakyBucket;

static STATS: CommandStats = CommandStats::new();

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: c"RL.LEAKYBUCKET",
    flags: c"write fast",
    keys: Keys::One(1),
    arity: -4,
    summary: c"Leaky bucket (policing): admits cost if the level stays within capacity; drains continuously",
    complexity: c"O(1)",
    args: &[arg(c"key", Key), arg(c"capacity", Integer), arg(c"leak_per_sec", Double), COST_ARG, UPTO_ARG],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.leakybucket' command"),
    all_keyword: Some("LEAKYBUCKET"),
    stats: &STATS,
};

impl FieldsLimiter<2> for LeakyBucket {
    type Params = leaky_bucket::Params;
    type State = leaky_bucket::State;
    const ARITY_ERROR: ErrorReply = DESCRIPTOR.arity_error;
    const PARAMS: usize = 2;
    const KIND: Kind = Kind::LeakyBucket;
    const FIELDS: [&'static FieldName; 2] = [&LEVEL, &TS];

    fn remembered() -> &'static Owned<Remembered<Args>> {
        &REMEMBERED
    }

    fn parse(args: &[&[u8]]) -> Result<Args, ErrorReply> {
        let (capacity, leak_per_sec, cost) = BUCKET.parse(args, DESCRIPTOR.arity_error)?;
        Ok(Args {
            params: leaky_bucket::Params {
                capacity,
                leak_per_sec,
            },
            op: Operation::from_cost(cost),
        })
    }

    #[inline(always)]
    fn decode(
        [level, ts]: [Option<&[u8]>; 2],
        _: &Args,
        now_us: i64,
    ) -> Result<leaky_bucket::State, ErrorReply> {
        let level = amount(level).ok_or(CORRUPT_LEVEL)?;
        let ts_us = within_skew(timestamp(ts).ok_or(CORRUPT_TS)?, now_us).ok_or(TS_AHEAD)?;
        Ok(leaky_bucket::State { level, ts_us })
    }

    fn decide(
        a: &Args,
        now_us: i64,
        prior: Option<leaky_bucket::State>,
    ) -> (Reply, Option<FieldsWrite<2>>) {
        let out = leaky_bucket::decide(&a.params, a.op.units(), now_us, prior);
        (out.reply, out.write.map(stored))
    }

    fn settle(
        a: &Args,
        delta: f64,
        now_us: i64,
        prior: Option<leaky_bucket::State>,
    ) -> Option<(leaky_bucket::State, FieldsWrite<2>)> {
        leaky_bucket::settle(&a.params, delta, now_us, prior).map(|w| (w.state, stored(w)))
    }
}

/// The numbers a write stores, in `FIELDS` order.
fn stored(w: leaky_bucket::Write) -> FieldsWrite<2> {
    FieldsWrite {
        values: [w.state.level, w.state.ts_us],
        expire_at_ms: w.expire_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Args, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        LeakyBucket::parse(&raw).map_err(|e| e.message())
    }

    #[test]
    fn arguments() {
        assert_eq!(
            parse(&["10", "5"]),
            Ok(Args {
                params: leaky_bucket::Params {
                    capacity: 10.0,
                    leak_per_sec: 5.0
                },
                op: Operation::Consume(1.0)
            })
        );
        assert_eq!(
            parse(&["10", "0.5", "0"]).map(|a| a.op),
            Ok(Operation::Peek)
        );
        assert_eq!(
            parse(&["10", "5", "1", "1"]),
            Err("ERR wrong number of arguments for 'rl.leakybucket' command")
        );
        assert_eq!(parse(&["1.5", "1"]), Err("ERR capacity must be an integer"));
        assert_eq!(
            parse(&["0", "1"]),
            Err("ERR capacity must be between 1 and 1000000000000000")
        );
        assert_eq!(
            parse(&["10", "x"]),
            Err("ERR leak_per_sec must be a number")
        );
        assert_eq!(
            parse(&["10", "0"]),
            Err("ERR leak_per_sec must be greater than 0 and at most 1000000000000000")
        );
        assert_eq!(
            parse(&["10", "1", "1.0"]),
            Err("ERR cost must be an integer")
        );
        assert_eq!(
            parse(&["100", "1e-9"]),
            Err("ERR capacity / leak_per_sec must be at most 10000000000 seconds")
        );
    }

    #[test]
    fn stored_fields() {
        let a = LeakyBucket::parse(&[b"10", b"1"]).unwrap();
        let now = 1_800_000_000_000_000;
        let d = |l: Option<&[u8]>, t: Option<&[u8]>| LeakyBucket::decode([l, t], &a, now);
        assert_eq!(
            d(Some(b"2.5"), Some(b"17")),
            Ok(leaky_bucket::State {
                level: 2.5,
                ts_us: 17.0
            })
        );
        assert_eq!(d(None, Some(b"1")), Err(CORRUPT_LEVEL));
        assert_eq!(d(Some(b"inf"), Some(b"1")), Err(CORRUPT_LEVEL));
        assert_eq!(d(Some(b"1"), Some(b"-1")), Err(CORRUPT_TS));
        assert_eq!(d(Some(b"1"), None), Err(CORRUPT_TS));
        let ts = |t: &[u8]| d(Some(b"1"), Some(t)).map(|s| s.ts_us);
        assert_eq!(ts(b"1800000060000000"), Ok(1.80000006e15));
        assert_eq!(ts(b"1800000060000001"), Err(TS_AHEAD));
    }
}
