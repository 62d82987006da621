//! `RL.TOKENBUCKET key capacity refill_per_sec [cost]`; state: one string `<tokens> <ts>`.

use crate::codec::args::{BucketArgs, IntegerArg, MAX_INTEGER_ARG, RateArg};
use crate::codec::error::ErrorReply;
use crate::codec::owner::Owned;
use crate::codec::remembered::Remembered;
use crate::codec::stored::{balance, timestamp, within_skew};
use crate::command::descriptor::ArgKind::{Double, Integer, Key};
use crate::command::descriptor::{COST_ARG, Descriptor, Keys, UPTO_ARG, arg};
use crate::core::{Operation, Reply, token_bucket};
use crate::observe::stats::CommandStats;
use crate::store::kind::Kind;
use crate::store::string::{FieldsLimiter, FieldsWrite};
use crate::store::{FieldName, Request};

pub type Args = Request<token_bucket::Params>;

/// The last arguments that parsed (`FieldsLimiter::remembered`).
static REMEMBERED: Owned<Remembered<Args>> = Owned::new(Remembered::new());

const CAPACITY: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR capacity must be an integer"),
    out_of_range: ErrorReply(c"ERR capacity must be between 1 and 1000000000000000"),
    min: 1.0,
    max: MAX_INTEGER_ARG,
};
const RATE: RateArg = RateArg {
    not_number: ErrorReply(c"ERR refill_per_sec must be a number"),
    out_of_range: ErrorReply(
        c"ERR refill_per_sec must be greater than 0 and at most 1000000000000000",
    ),
};
const TOO_SLOW: ErrorReply =
    ErrorReply(c"ERR capacity / refill_per_sec must be at most 10000000000 seconds");

const BUCKET: BucketArgs = BucketArgs {
    capacity: CAPACITY,
    rate: RATE,
    too_slow: TOO_SLOW,
};

pub const CORRUPT_TOKENS: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'tokens' is not a valid number");
pub const CORRUPT_TS: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'ts' is not a valid timestamp");
pub const TS_AHEAD: ErrorReply = ErrorReply(
    c"ERR corrupt rate limiter state: field 'ts' is ahead of the server's clock by more than 60 seconds",
);

pub static TOKENS: FieldName = FieldName::new(c"tokens");
pub static TS: FieldName = FieldName::new(c"ts");

pub struct TokenBucket;

static STATS: CommandStats = CommandStats::new();

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: c"RL.TOKENBUCKET",
    flags: c"write fast",
    keys: Keys::One(1),
    arity: -4,
    summary: c"Token bucket: admits cost if that many tokens are left; refills continuously",
    complexity: c"O(1)",
    args: &[
        arg(c"key", Key),
        arg(c"capacity", Integer),
        arg(c"refill_per_sec", Double),
        COST_ARG,
        UPTO_ARG,
    ],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.tokenbucket' command"),
    all_keyword: Some("TOKENBUCKET"),
    stats: &STATS,
};

impl FieldsLimiter<2> for TokenBucket {
    type Params = token_bucket::Params;
    type State = token_bucket::State;
    const ARITY_ERROR: ErrorReply = DESCRIPTOR.arity_error;
    const PARAMS: usize = 2;
    const KIND: Kind = Kind::TokenBucket;
    const FIELDS: [&'static FieldName; 2] = [&TOKENS, &TS];

    fn remembered() -> &'static Owned<Remembered<Args>> {
        &REMEMBERED
    }

    fn parse(args: &[&[u8]]) -> Result<Args, ErrorReply> {
        let (capacity, refill_per_sec, cost) = BUCKET.parse(args, DESCRIPTOR.arity_error)?;
        Ok(Args {
            params: token_bucket::Params {
                capacity,
                refill_per_sec,
            },
            op: Operation::from_cost(cost),
        })
    }

    #[inline(always)]
    fn decode(
        [tokens, ts]: [Option<&[u8]>; 2],
        _: &Args,
        now_us: i64,
    ) -> Result<token_bucket::State, ErrorReply> {
        let tokens = balance(tokens).ok_or(CORRUPT_TOKENS)?;
        let ts_us = within_skew(timestamp(ts).ok_or(CORRUPT_TS)?, now_us).ok_or(TS_AHEAD)?;
        Ok(token_bucket::State { tokens, ts_us })
    }

    fn decide(
        a: &Args,
        now_us: i64,
        prior: Option<token_bucket::State>,
    ) -> (Reply, Option<FieldsWrite<2>>) {
        let out = token_bucket::decide(&a.params, a.op.units(), now_us, prior);
        (out.reply, out.write.map(stored))
    }

    fn settle(
        a: &Args,
        delta: f64,
        now_us: i64,
        prior: Option<token_bucket::State>,
    ) -> Option<(token_bucket::State, FieldsWrite<2>)> {
        token_bucket::settle(&a.params, delta, now_us, prior).map(|w| (w.state, stored(w)))
    }
}

/// The numbers a write stores, in `FIELDS` order.
fn stored(w: token_bucket::Write) -> FieldsWrite<2> {
    FieldsWrite {
        values: [w.state.tokens, w.state.ts_us],
        expire_at_ms: w.expire_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Args, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        TokenBucket::parse(&raw).map_err(|e| e.message())
    }

    #[test]
    fn arguments() {
        let p = |capacity, refill_per_sec| token_bucket::Params {
            capacity,
            refill_per_sec,
        };
        assert_eq!(
            parse(&["10", "5"]),
            Ok(Args {
                params: p(10.0, 5.0),
                op: Operation::Consume(1.0)
            })
        );
        assert_eq!(
            parse(&["10", "0.0166667", "0"]).map(|a| a.op),
            Ok(Operation::Peek)
        );
        assert_eq!(
            parse(&["10"]),
            Err("ERR wrong number of arguments for 'rl.tokenbucket' command")
        );
        assert_eq!(parse(&["1.5", "1"]), Err("ERR capacity must be an integer"));
        assert_eq!(
            parse(&["0", "1"]),
            Err("ERR capacity must be between 1 and 1000000000000000")
        );
        assert_eq!(
            parse(&["1000000000000001", "1e9"]),
            Err("ERR capacity must be between 1 and 1000000000000000")
        );
        assert_eq!(
            parse(&["10", "nan"]),
            Err("ERR refill_per_sec must be a number")
        );
        assert_eq!(
            parse(&["10", "1e999"]),
            Err("ERR refill_per_sec must be greater than 0 and at most 1000000000000000")
        );
        assert_eq!(
            parse(&["10", "1", "-1"]),
            Err("ERR cost must be between 0 and 1000000000000000")
        );
        assert_eq!(parse(&["10", "1", "x"]), Err("ERR cost must be an integer"));
        assert_eq!(
            parse(&["100", "1e-9"]),
            Err("ERR capacity / refill_per_sec must be at most 10000000000 seconds")
        );
    }

    #[test]
    fn stored_fields() {
        let a = TokenBucket::parse(&[b"10", b"1"]).unwrap();
        let now = 1_800_000_000_000_000;
        let d = |t: Option<&[u8]>, s: Option<&[u8]>| TokenBucket::decode([t, s], &a, now);
        assert_eq!(
            d(Some(b"4.5"), Some(b"17")),
            Ok(token_bucket::State {
                tokens: 4.5,
                ts_us: 17.0
            })
        );
        assert_eq!(d(None, Some(b"1")), Err(CORRUPT_TOKENS));
        // A debt (RL.SETTLE) is stored as negative tokens.
        assert_eq!(d(Some(b"-1"), Some(b"1")).map(|s| s.tokens), Ok(-1.0));
        assert_eq!(d(Some(b"-inf"), Some(b"1")), Err(CORRUPT_TOKENS));
        assert_eq!(d(Some(b"1"), Some(b"1.5")), Err(CORRUPT_TS));
        assert_eq!(d(Some(b"1"), None), Err(CORRUPT_TS));
        // No call writes a debt deeper than the largest capacity.
        assert_eq!(d(Some(b"-1e15"), Some(b"1")).map(|s| s.tokens), Ok(-1e15));
        assert_eq!(d(Some(b"-1e308"), Some(b"1")), Err(CORRUPT_TOKENS));
        let ts = |t: &[u8]| d(Some(b"1"), Some(t)).map(|s| s.ts_us);
        assert_eq!(ts(b"1800000000000000"), Ok(1.8e15));
        assert_eq!(ts(b"1800000060000000"), Ok(1.80000006e15));
        assert_eq!(ts(b"1800000060000001"), Err(TS_AHEAD));
        assert_eq!(ts(b"1800003600000000"), Err(TS_AHEAD));
    }
}
