//! `RL.GCRA key max_burst count_per_period period_sec [cost]`; state: one string `<tat>` (µs).
//!
//! `max_burst + 1` calls at once, then one per emission interval `period_sec / count_per_period`,
//! rounded up to a whole microsecond so that every time is an exact integer, here and in the Lua
//! twin, and the sustained rate is never above the configured one.

use crate::codec::args::{COST, IntegerArg, MAX_INTEGER_ARG, RateArg};
use crate::codec::error::ErrorReply;
use crate::codec::number::parse_integer;
use crate::codec::owner::Owned;
use crate::codec::remembered::Remembered;
use crate::command::descriptor::ArgKind::{Double, Integer, Key};
use crate::command::descriptor::{COST_ARG, Descriptor, Keys, UPTO_ARG, arg};
use crate::core::{Operation, Reply, gcra};
use crate::observe::stats::CommandStats;
use crate::store::kind::{Kind, foreign};
use crate::store::string::{FieldsLimiter, FieldsWrite};
use crate::store::{FieldName, Request};

pub type Args = Request<gcra::Params>;

/// The last arguments that parsed (`FieldsLimiter::remembered`).
static REMEMBERED: Owned<Remembered<Args>> = Owned::new(Remembered::new());

pub const MAX_BURST: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR max_burst must be an integer"),
    out_of_range: ErrorReply(c"ERR max_burst must be between 0 and 1000000000000000"),
    min: 0.0,
    max: MAX_INTEGER_ARG,
};
pub const COUNT: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR count_per_period must be an integer"),
    out_of_range: ErrorReply(c"ERR count_per_period must be between 1 and 1000000000000000"),
    min: 1.0,
    max: MAX_INTEGER_ARG,
};
const PERIOD: RateArg = RateArg {
    not_number: ErrorReply(c"ERR period_sec must be a number"),
    out_of_range: ErrorReply(c"ERR period_sec must be greater than 0 and at most 1000000000000000"),
};
const TOO_FAST: ErrorReply =
    ErrorReply(c"ERR count_per_period / period_sec must be at most 1000000 per second");
const TOO_SLOW: ErrorReply = ErrorReply(
    c"ERR (max_burst + 1) * period_sec / count_per_period must be at most 1000000000 seconds",
);

/// Longest tolerance, in microseconds (about 31.7 years). With stored times below
/// `MAX_TAT_US` every time computed stays below 2^53, exact in the Lua twin's doubles.
pub const MAX_TOLERANCE_US: f64 = 1e15;
/// Largest stored theoretical arrival time (year 2223).
pub const MAX_TAT_US: f64 = 8e15;

pub const CORRUPT_TAT: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'tat' is not a valid timestamp");

pub static TAT: FieldName = FieldName::new(c"tat");

pub struct Gcra;

static STATS: CommandStats = CommandStats::new();

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: c"RL.GCRA",
    flags: c"write fast",
    keys: Keys::One(1),
    arity: -5,
    summary: c"GCRA: max_burst + 1 at once, then evenly spaced at count_per_period per period",
    complexity: c"O(1)",
    args: &[
        arg(c"key", Key),
        arg(c"max_burst", Integer),
        arg(c"count_per_period", Integer),
        arg(c"period_sec", Double),
        COST_ARG,
        UPTO_ARG,
    ],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.gcra' command"),
    all_keyword: Some("GCRA"),
    stats: &STATS,
};

/// A double already checked to be a whole number inside i64.
pub(crate) fn whole(x: f64) -> i64 {
    x as i64
}

/// `(interval, limit, tolerance)` in ticks (`ticks_per_sec`: 1e6 for microseconds, 1e9 for
/// nanoseconds) from validated arguments, computed in doubles in the Lua twins' order; the
/// interval is rounded by `round` (up here; truncated for redis-cell).
pub fn params(
    max_burst: f64,
    count: f64,
    period: f64,
    ticks_per_sec: f64,
    round: fn(f64) -> f64,
) -> (f64, f64, f64) {
    let interval = round(period * ticks_per_sec / count);
    let limit = max_burst + 1.0;
    (interval, limit, interval * limit)
}

impl FieldsLimiter<1> for Gcra {
    type Params = gcra::Params;
    type State = i128;
    const ARITY_ERROR: ErrorReply = DESCRIPTOR.arity_error;
    const PARAMS: usize = 3;
    const KIND: Kind = Kind::Gcra;
    const FIELDS: [&'static FieldName; 1] = [&TAT];

    fn remembered() -> &'static Owned<Remembered<Args>> {
        &REMEMBERED
    }

    fn parse(args: &[&[u8]]) -> Result<Args, ErrorReply> {
        let (max_burst, count, period, cost) = match args {
            [b, c, p] => (b, c, p, None),
            [b, c, p, k] => (b, c, p, Some(k)),
            _ => return Err(DESCRIPTOR.arity_error),
        };
        let max_burst = MAX_BURST.parse(max_burst)?;
        let count = COUNT.parse(count)?;
        let period = PERIOD.parse(period)?;
        let cost = match cost {
            Some(raw) => COST.parse(raw)?,
            None => 1.0,
        };
        if period * 1e6 / count < 1.0 {
            return Err(TOO_FAST);
        }
        let (interval, limit, tolerance) = params(max_burst, count, period, 1e6, f64::ceil);
        if tolerance > MAX_TOLERANCE_US {
            return Err(TOO_SLOW);
        }
        Ok(Args {
            params: gcra::Params {
                interval: whole(interval),
                limit: whole(limit),
                tolerance: whole(tolerance),
            },
            op: Operation::from_cost(cost),
        })
    }

    #[inline(always)]
    fn decode([tat]: [Option<&[u8]>; 1], _: &Args, now_us: i64) -> Result<i128, ErrorReply> {
        let v = tat.and_then(parse_integer).ok_or(CORRUPT_TAT)?;
        if v > MAX_TAT_US && now_us > 0 && v >= 500.0 * now_us as f64 {
            // Nanoseconds of about now: CL.THROTTLE's (redis-cell's) value, which has no tag.
            return Err(foreign(Kind::Throttle, Kind::Gcra));
        }
        if !(v >= 0.0 && v <= MAX_TAT_US) {
            return Err(CORRUPT_TAT);
        }
        // As it is, however far ahead (parameters lowered since it was written): a denial's
        // wait counts from it, and a time read as nearer than it is would be a wait that a later
        // call, reading it again, does not keep.
        Ok(i128::from(whole(v)))
    }

    fn decide(a: &Args, now_us: i64, prior: Option<i128>) -> (Reply, Option<FieldsWrite<1>>) {
        let p = &a.params;
        let out = gcra::decide(p, whole(a.op.units()), i128::from(now_us), prior);
        let ceil_ms = |us: i128| {
            let us = if us < 0 { 0 } else { us };
            narrow(gcra::div(us + 999, 1000))
        };
        let retry_after_ms = match (out.allowed, out.retry_after) {
            (true, _) => 0,
            (false, None) => -1,
            (false, Some(us)) => ceil_ms(us),
        };
        let reply = Reply {
            allowed: out.allowed,
            remaining: narrow(gcra::remaining(p, out.ttl)),
            retry_after_ms,
            reset_after_ms: ceil_ms(out.ttl),
            limit: p.limit,
            granted: None,
        };
        (reply, out.write.map(stored))
    }

    fn settle(
        a: &Args,
        delta: f64,
        now_us: i64,
        prior: Option<i128>,
    ) -> Option<(i128, FieldsWrite<1>)> {
        gcra::settle(&a.params, whole(delta), i128::from(now_us), prior).map(|t| (t, stored(t)))
    }
}

/// The theoretical arrival time as stored, with the key's expiry at that time.
fn stored(tat: i128) -> FieldsWrite<1> {
    FieldsWrite {
        values: [exact_f64(tat)],
        expire_at_ms: narrow(gcra::div(tat.max(0) + 999, 1000)),
    }
}

/// Reply values are bounded by argument and state validation; saturate rather than wrap.
fn narrow(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// A time below 2^53, exact as a double (the stored form, as in the Lua twin).
fn exact_f64(v: i128) -> f64 {
    gcra::to_f64(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Args, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        Gcra::parse(&raw).map_err(|e| e.message())
    }

    #[test]
    fn arguments() {
        let p = |interval, limit| gcra::Params {
            interval,
            limit,
            tolerance: interval * limit,
        };
        assert_eq!(
            parse(&["4", "10", "1"]),
            Ok(Args {
                params: p(100_000, 5),
                op: Operation::Consume(1.0)
            })
        );
        // 1/3 s rounds up to 333334 us.
        assert_eq!(
            parse(&["0", "3", "1", "0"]).map(|a| (a.params, a.op)),
            Ok((p(333_334, 1), Operation::Peek))
        );
        assert_eq!(
            parse(&["1", "1"]),
            Err("ERR wrong number of arguments for 'rl.gcra' command")
        );
        assert_eq!(
            parse(&["x", "1", "1"]),
            Err("ERR max_burst must be an integer")
        );
        assert_eq!(
            parse(&["-1", "1", "1"]),
            Err("ERR max_burst must be between 0 and 1000000000000000")
        );
        assert_eq!(
            parse(&["1", "0", "1"]),
            Err("ERR count_per_period must be between 1 and 1000000000000000")
        );
        assert_eq!(
            parse(&["1", "1", "inf"]),
            Err("ERR period_sec must be a number")
        );
        assert_eq!(
            parse(&["1", "1", "0"]),
            Err("ERR period_sec must be greater than 0 and at most 1000000000000000")
        );
        assert_eq!(
            parse(&["1", "1", "1", "1.5"]),
            Err("ERR cost must be an integer")
        );
        assert_eq!(
            parse(&["1", "1000001", "1"]),
            Err("ERR count_per_period / period_sec must be at most 1000000 per second")
        );
        assert!(parse(&["1", "1000000", "1"]).is_ok());
        assert_eq!(
            parse(&["0", "1", "1000000001"]),
            Err(
                "ERR (max_burst + 1) * period_sec / count_per_period must be at most 1000000000 seconds"
            )
        );
        assert!(parse(&["0", "1", "1000000000"]).is_ok());
    }

    #[test]
    fn stored_field() {
        // Tolerance 5 s (4 + 1 calls, one a second).
        let a = parse(&["4", "1", "1"]).unwrap();
        let now = 1_800_000_000_000_000;
        let d = |t: Option<&[u8]>| Gcra::decode([t], &a, now);
        assert_eq!(d(Some(b"1700000000000001")), Ok(1_700_000_000_000_001));
        // As it is, however far ahead (parameters lowered since): a denial's wait counts from it.
        assert_eq!(d(Some(b"1800000070000000")), Ok(1_800_000_070_000_000));
        assert_eq!(d(Some(b"1800000070000001")), Ok(1_800_000_070_000_001));
        assert_eq!(d(Some(b"8000000000000000")), Ok(8_000_000_000_000_000));
        for bad in [&b"8000000000000001"[..], b"-1", b"1.5", b"abc", b"", b"1e3"] {
            assert_eq!(d(Some(bad)), Err(CORRUPT_TAT), "{bad:?}");
        }
        assert_eq!(d(None), Err(CORRUPT_TAT));
        assert_eq!(
            d(Some(b"1800000000000000000")),
            Err(foreign(Kind::Throttle, Kind::Gcra))
        );
    }

    #[test]
    fn replies_and_writes() {
        let a = parse(&["4", "10", "1"]).unwrap();
        let now = 1_700_000_000_000_001;
        let (reply, write) = Gcra::decide(&a, now, None);
        assert_eq!(reply.to_array(), [1, 4, 0, 100, 5]);
        let w = write.unwrap();
        assert_eq!(w.values, [1_700_000_000_100_001.0]);
        assert_eq!(w.expire_at_ms, 1_700_000_000_101);
        let full = Some(i128::from(now) + 500_000);
        let (reply, write) = Gcra::decide(&a, now, full);
        assert_eq!(reply.to_array(), [0, 0, 100, 500, 5]);
        assert_eq!(write, None);
        let big = Args {
            op: Operation::Consume(6.0),
            ..a
        };
        assert_eq!(
            Gcra::decide(&big, now, full).0.to_array(),
            [0, 0, -1, 500, 5]
        );
    }
}
