//! `CL.THROTTLE key max_burst count_per_period period [quantity]`: redis-cell's command, on the
//! shared GCRA core, in nanoseconds.
//!
//! Reply `[limited, limit, remaining, retry_after_s, reset_after_s]` with redis-cell 0.5's
//! rounding. State: a plain string key holding the theoretical arrival time in Unix nanoseconds
//! (redis-cell's format), expiring at the first millisecond from which it is equivalent to a new
//! key. Unlike redis-cell: quantity 0 and denials write nothing, the effect is replicated
//! (`SET key value PXAT ms`) rather than the command, and bad input or a stored value that is
//! not a timestamp is an error instead of a panic or a misbehaving limiter.

use std::ffi::CStr;

use crate::codec::args::{IntegerArg, MAX_INTEGER_ARG};
use crate::codec::error::{ErrorReply, WRONGTYPE};
use crate::codec::number::{G17_MAX_LEN, format_i64, parse_digits};
use crate::codec::owner::Owned;
use crate::codec::remembered::{self, Remembered};
use crate::command::descriptor::ArgKind::{Integer, Key};
use crate::command::descriptor::{Descriptor, Keys, arg, optional};
use crate::command::gcra::{COUNT, MAX_BURST, params, whole};
use crate::command::{Entry, Runner};
use crate::core::gcra;
use crate::observe::stats::CommandStats;
use crate::store::kind::{Kind, foreign, split_tag};
use crate::store::{Effect, Slot, Store};

pub const NAME: &CStr = c"CL.THROTTLE";
pub static STATS: CommandStats = CommandStats::new();

pub const ARITY_ERROR: ErrorReply =
    ErrorReply(c"ERR wrong number of arguments for 'cl.throttle' command");

pub const ENTRY: Entry = Entry {
    descriptor: &DESCRIPTOR,
    runner: Runner::Throttle,
};

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    flags: c"write fast",
    keys: Keys::One(1),
    arity: -5,
    summary: c"redis-cell compatible GCRA throttle: [limited, limit, remaining, retry_after_s, reset_after_s]",
    complexity: c"O(1)",
    args: &[
        arg(c"key", Key),
        arg(c"max_burst", Integer),
        arg(c"count_per_period", Integer),
        arg(c"period", Integer),
        optional(c"quantity", Integer),
    ],
    arity_error: ARITY_ERROR,
    // redis-cell's reply and nanosecond key format are not RL.ALL's.
    all_keyword: None,
    stats: &STATS,
};
const PERIOD: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR period must be an integer"),
    out_of_range: ErrorReply(c"ERR period must be between 1 and 1000000000000000"),
    min: 1.0,
    max: MAX_INTEGER_ARG,
};
const QUANTITY: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR quantity must be an integer"),
    out_of_range: ErrorReply(c"ERR quantity must be between 0 and 1000000000000000"),
    min: 0.0,
    max: MAX_INTEGER_ARG,
};
const TOO_FAST: ErrorReply =
    ErrorReply(c"ERR count_per_period / period must be at most 1000000 per second");
const TOO_SLOW: ErrorReply = ErrorReply(
    c"ERR (max_burst + 1) * period / count_per_period must be at most 1000000000 seconds",
);
pub const CORRUPT: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: the value is not a timestamp in nanoseconds");

/// Shortest emission interval: one microsecond. redis-cell divides by the interval in whole
/// microseconds for `remaining`, which is meaningless below that.
const MIN_INTERVAL_NS: f64 = 1e3;
/// Longest tolerance (about 31.7 years); keeps every time below `MAX_TAT_NS` and every duration
/// the Lua twin multiplies exact in doubles.
const MAX_TOLERANCE_NS: f64 = 1e18;
/// Stored times are below this (year 2261), as i64 nanoseconds always are in practice.
pub const MAX_TAT_NS: u64 = 9_200_000_000_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Args {
    /// In nanoseconds.
    pub params: gcra::Params,
    pub quantity: i64,
}

/// The last arguments that parsed (`codec::remembered`), kept by the main thread.
static REMEMBERED: Owned<Remembered<Args>> = Owned::new(Remembered::new());

/// The arguments after the key; the last ones that parsed again when they are the same bytes.
pub fn parse(args: &[&[u8]]) -> Result<Args, ErrorReply> {
    remembered::parse(&REMEMBERED, args, parse_args)
}

fn parse_args(args: &[&[u8]]) -> Result<Args, ErrorReply> {
    let (max_burst, count, period, quantity) = match args {
        [b, c, p] => (b, c, p, None),
        [b, c, p, q] => (b, c, p, Some(q)),
        _ => return Err(ARITY_ERROR),
    };
    let max_burst = MAX_BURST.parse(max_burst)?;
    let count = COUNT.parse(count)?;
    let period = PERIOD.parse(period)?;
    let quantity = match quantity {
        Some(raw) => QUANTITY.parse(raw)?,
        None => 1.0,
    };
    // redis-cell: the interval is period / count in nanoseconds, computed in doubles, truncated.
    let (interval, limit, tolerance) = params(max_burst, count, period, 1e9, f64::trunc);
    if interval < MIN_INTERVAL_NS {
        return Err(TOO_FAST);
    }
    if tolerance > MAX_TOLERANCE_NS {
        return Err(TOO_SLOW);
    }
    let (interval, limit) = (whole(interval), whole(limit));
    Ok(Args {
        params: gcra::Params {
            interval,
            limit,
            tolerance: interval.saturating_mul(limit),
        },
        quantity: whole(quantity),
    })
}

/// A stored value: decimal digits only, below `MAX_TAT_NS`. Its value is in its last 19 digits
/// (every time written before 2286 has 19 at most); any before them must be leading zeros.
pub fn decode(raw: &[u8]) -> Result<i128, ErrorReply> {
    let Some((zeros, digits)) = raw.split_at_checked(raw.len().saturating_sub(19)) else {
        return Err(CORRUPT);
    };
    match parse_digits(digits) {
        Some(v) if v < MAX_TAT_NS && zeros.iter().all(|&c| c == b'0') => Ok(i128::from(v)),
        _ => Err(CORRUPT),
    }
}

/// `[limited, limit, remaining, retry_after_s, reset_after_s]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleReply {
    pub limited: bool,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after_s: i64,
    pub reset_after_s: i64,
}

impl ThrottleReply {
    pub fn to_array(&self) -> [i64; 5] {
        [
            i64::from(self.limited),
            self.limit,
            self.remaining,
            self.retry_after_s,
            self.reset_after_s,
        ]
    }
}

/// A nanosecond duration in whole seconds as redis-cell replies it: the seconds as a double
/// (`secs + nanos / 1e9`, truncated toward zero), plus one if at least a millisecond is left over.
pub fn cell_seconds(ns: i128) -> i64 {
    let secs = gcra::div(ns, 1_000_000_000);
    let nanos = gcra::rem(ns, 1_000_000_000);
    // Both parts are below 2^53 (exact); the sum and the truncation are redis-cell's rounding.
    let mut s = (gcra::to_f64(secs) + gcra::to_f64(nanos) / 1e9) as i64;
    if gcra::div(nanos, 1_000_000) > 0 {
        s += 1;
    }
    s
}

/// redis-cell's `remaining`: `(tolerance - ttl)` over the interval, both truncated to whole
/// microseconds and divided as doubles, truncated; 0 unless `tolerance - ttl > -interval`.
pub fn cell_remaining(p: &gcra::Params, ttl: i128) -> i64 {
    let next = i128::from(p.tolerance) - ttl;
    if next <= -i128::from(p.interval) {
        return 0;
    }
    // Both below 2^54 by the tolerance bound; rounded to doubles once, as redis-cell does.
    let next_us = gcra::to_f64(gcra::div(next, 1000));
    let interval_us = (p.interval / 1000) as f64;
    (next_us / interval_us) as i64
}

/// The reply, and the value and expiry to store (only when admitted with quantity > 0).
pub fn decide(a: &Args, now_us: i64, prior: Option<i128>) -> (ThrottleReply, Option<(i128, i64)>) {
    let p = &a.params;
    let now = i128::from(now_us) * 1000;
    let out = gcra::decide(p, a.quantity, now, prior);
    let retry_after_s = match (out.allowed, out.retry_after) {
        (false, Some(ns)) => cell_seconds(ns),
        _ => -1,
    };
    let reply = ThrottleReply {
        limited: !out.allowed,
        limit: p.limit,
        remaining: cell_remaining(p, out.ttl),
        retry_after_s,
        reset_after_s: cell_seconds(out.ttl),
    };
    // The first millisecond at which the stored time is no longer in the future.
    let write = out.write.map(|tat| {
        let ms = gcra::div(tat + 999_999, 1_000_000);
        (tat, i64::try_from(ms).unwrap_or(i64::MAX))
    });
    (reply, write)
}

/// A stored value as a call with these parameters reads it at `now_us`: another limiter's state
/// is an error (a tagged value, or `RL.GCRA`'s microseconds from before values had tags: a value
/// between half and twice now's microseconds, which as nanoseconds would lie within weeks of
/// 1970). An arrival time is read as it is, however far ahead (parameters lowered since it was
/// written), so that the wait a denial replies is the one a later call finds.
pub fn read(raw: &[u8], _args: &Args, now_us: i64) -> Result<i128, ErrorReply> {
    if let Some((holder, _)) = split_tag(raw) {
        return Err(foreign(holder, Kind::Throttle));
    }
    let tat = decode(raw)?;
    let now = i128::from(now_us);
    // Microseconds of about now (from half to twice it): as nanoseconds, weeks after 1970.
    if now > 0 && 2 * tat >= now && tat < 2 * now {
        return Err(foreign(Kind::Gcra, Kind::Throttle));
    }
    Ok(tat)
}

/// Load -> decide -> store for one call whose arguments are already parsed.
pub fn apply<S: Store + ?Sized>(
    store: &mut S,
    args: &Args,
    now_us: i64,
) -> Result<ThrottleReply, ErrorReply> {
    let prior = match store.read()? {
        Slot::Empty => None,
        // redis-cell's keys are strings; no earlier layout was a hash.
        Slot::WrongType | Slot::Hash | Slot::Zset => return Err(WRONGTYPE),
        Slot::Value(raw) => Some(read(raw, args, now_us)?),
    };
    let (reply, write) = decide(args, now_us, prior);
    if let Some((tat, expire_at_ms)) = write {
        // Nanoseconds since 1970 fit an i64 until 2262; the text of a later time is allocated.
        let mut buf = [0u8; G17_MAX_LEN];
        let late;
        let text = match i64::try_from(tat) {
            Ok(ns) => {
                let len = format_i64(ns, &mut buf);
                buf.get(..len).unwrap_or_default()
            }
            Err(_) => {
                late = tat.to_string();
                late.as_bytes()
            }
        };
        store.writable()?;
        store.apply(&Effect::Set {
            value: text,
            expire_at_ms,
        })?;
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(v: &[&str]) -> Result<Args, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        parse(&raw).map_err(|e| e.message())
    }

    #[test]
    fn arguments() {
        let a = parse_str(&["15", "30", "60"]).unwrap();
        assert_eq!(
            a,
            Args {
                params: gcra::Params {
                    interval: 2_000_000_000,
                    limit: 16,
                    tolerance: 32_000_000_000
                },
                quantity: 1
            }
        );
        // 1 s / 3, truncated to whole nanoseconds as redis-cell does.
        assert_eq!(
            parse_str(&["0", "3", "1", "0"]).unwrap().params.interval,
            333_333_333
        );
        assert_eq!(
            parse_str(&["1", "2"]),
            Err("ERR wrong number of arguments for 'cl.throttle' command")
        );
        assert_eq!(
            parse_str(&["1", "1", "1.5"]),
            Err("ERR period must be an integer")
        );
        assert_eq!(
            parse_str(&["1", "1", "0"]),
            Err("ERR period must be between 1 and 1000000000000000")
        );
        assert_eq!(
            parse_str(&["1", "1", "1", "-1"]),
            Err("ERR quantity must be between 0 and 1000000000000000")
        );
        assert_eq!(
            parse_str(&["1", "1000001", "1"]),
            Err("ERR count_per_period / period must be at most 1000000 per second")
        );
        assert_eq!(
            parse_str(&["0", "1", "1000000001"]),
            Err(
                "ERR (max_burst + 1) * period / count_per_period must be at most 1000000000 seconds"
            )
        );
    }

    #[test]
    fn stored_value() {
        assert_eq!(
            decode(b"1700000000123456789"),
            Ok(1_700_000_000_123_456_789)
        );
        assert_eq!(decode(b"0000000000000000000001"), Ok(1));
        assert_eq!(
            decode(b"9199999999999999999"),
            Ok(9_199_999_999_999_999_999)
        );
        for bad in [
            &b"9200000000000000000"[..],
            b"",
            b"-1",
            b"+1",
            b"1.5",
            b"1e18",
            b" 1",
            b"x",
        ] {
            assert_eq!(decode(bad), Err(CORRUPT), "{bad:?}");
        }
        // Against the definition (digits only, leading zeros dropped, below MAX_TAT_NS) on
        // runs of every length to 24, with a stray byte now and then.
        let defined = |raw: &[u8]| {
            if raw.is_empty() || !raw.iter().all(u8::is_ascii_digit) {
                return Err(CORRUPT);
            }
            let digits = std::str::from_utf8(raw).unwrap().trim_start_matches('0');
            match digits.parse::<u128>() {
                Ok(v) if v < u128::from(MAX_TAT_NS) => Ok(v as i128),
                Ok(_) => Err(CORRUPT),
                Err(_) if digits.is_empty() => Ok(0),
                Err(_) => Err(CORRUPT),
            }
        };
        let mut state = 0x2545_F491_4F6C_DD1D_u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 25) as usize;
            let mut raw: Vec<u8> = (0..len)
                .map(|i| b'0' + ((state >> (i % 60)) % 10) as u8)
                .collect();
            if state.is_multiple_of(7) && len > 0 {
                raw[(state >> 8) as usize % len] = b"x -+."[(state >> 20) as usize % 5];
            }
            if state.is_multiple_of(5) {
                raw.iter_mut()
                    .take((state >> 30) as usize % 24)
                    .for_each(|b| *b = b'0');
            }
            assert_eq!(
                decode(&raw),
                defined(&raw),
                "{:?}",
                String::from_utf8_lossy(&raw)
            );
        }
    }

    #[test]
    fn redis_cell_rounding() {
        assert_eq!(cell_seconds(2_000_000_000), 2);
        assert_eq!(cell_seconds(1_001_000_000), 2);
        assert_eq!(
            cell_seconds(1_000_999_999),
            1,
            "less than a millisecond over"
        );
        assert_eq!(cell_seconds(0), 0);
        assert_eq!(cell_seconds(-500_000_000), 0);
        assert_eq!(cell_seconds(-1_000_000_000), -1);
    }

    #[test]
    fn readme_example() {
        let a = parse_str(&["15", "30", "60", "1"]).unwrap();
        let now = 1_700_000_000_000_000;
        let (reply, write) = decide(&a, now, None);
        assert_eq!(reply.to_array(), [0, 16, 15, -1, 2]);
        assert_eq!(write, Some((1_700_000_002_000_000_000, 1_700_000_002_000)));
        // After 16 calls the 17th waits one interval (2 s); the key resets in 32 s.
        let full = Some(1_700_000_032_000_000_000);
        assert_eq!(decide(&a, now, full).0.to_array(), [1, 16, 0, 2, 32]);
        assert_eq!(decide(&a, now, full).1, None);
    }
}
