//! `RL.SLIDINGLOG key limit window_sec [cost]`; state: a sorted set of admitted requests, one
//! member `<t>:<i>` per unit of cost at score `t` (the call time in Unix microseconds).

use std::ffi::CStr;

use crate::args::{COST, IntegerArg};
use crate::command::descriptor::ArgKind::{Double, Integer, Key};
use crate::command::descriptor::{COST_ARG, Descriptor, Keys, arg};
use crate::command::{Entry, Runner};
use crate::core::{Operation, lua_integer, sliding_log};
use crate::error::ErrorReply;
use crate::number::{parse_decimal, parse_integer};
use crate::pipeline::Request;
use crate::stats::CommandStats;
use crate::stored::MAX_TIMESTAMP_US;

/// Largest `limit`: every admitted unit is one sorted-set entry of about 120 bytes (see the
/// README), so a full key of this limit holds about 12 MB, and one call adds at most this many.
pub const MAX_LIMIT: f64 = 100_000.0;
/// Longest window in seconds.
pub const MAX_WINDOW_SECONDS: f64 = 1e10;

/// A parsed call: the log's limit and window, and what the call asks (a cost of 0 is a peek).
pub type SlidingLogRequest = Request<sliding_log::Params>;

pub const NAME: &CStr = c"RL.SLIDINGLOG";
pub static STATS: CommandStats = CommandStats::new();

pub const ARITY_ERROR: ErrorReply =
    ErrorReply(c"ERR wrong number of arguments for 'rl.slidinglog' command");

pub const ENTRY: Entry = Entry {
    descriptor: &DESCRIPTOR,
    runner: Runner::OneKey {
        run: crate::zset_store::run,
        limit: crate::zset_store::build_limit,
        settle: Some(crate::zset_store::build_settle),
    },
};

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    // Not `deny-oom`, as for every limiter (see binding::commands).
    flags: c"write fast",
    keys: Keys::One(1),
    arity: -4,
    summary:
        c"Sliding log: exactly at most limit in any window, one sorted-set entry per admitted unit",
    complexity: c"O(log N + cost) where N is the number of entries in the key (at most limit)",
    args: &[
        arg(c"key", Key),
        arg(c"limit", Integer),
        arg(c"window_sec", Double),
        COST_ARG,
    ],
    arity_error: ARITY_ERROR,
    all_keyword: Some("SLIDINGLOG"),
    stats: &STATS,
};
const LIMIT: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR limit must be an integer"),
    out_of_range: ErrorReply(c"ERR limit must be between 1 and 100000"),
    min: 1.0,
    max: MAX_LIMIT,
};
const WINDOW_NOT_NUMBER: ErrorReply = ErrorReply(c"ERR window_sec must be a number");
const WINDOW_OUT_OF_RANGE: ErrorReply =
    ErrorReply(c"ERR window_sec must be greater than 0 and at most 10000000000");
const WINDOW_TOO_SHORT: ErrorReply = ErrorReply(c"ERR window_sec must be at least 1 millisecond");

pub const CORRUPT_SCORE: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: sorted set score is not a valid timestamp");
pub const CORRUPT_MEMBER: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: sorted set member is not '<score>:<n>'");

/// Arguments after the key.
pub fn parse(args: &[&[u8]]) -> Result<SlidingLogRequest, ErrorReply> {
    let (limit, window, cost) = match args {
        [l, w] => (l, w, None),
        [l, w, c] => (l, w, Some(c)),
        _ => return Err(ARITY_ERROR),
    };
    let limit = LIMIT.parse(limit)?;
    let window_sec = parse_decimal(window).ok_or(WINDOW_NOT_NUMBER)?;
    if !(window_sec > 0.0 && window_sec <= MAX_WINDOW_SECONDS) {
        return Err(WINDOW_OUT_OF_RANGE);
    }
    // Millisecond resolution, rounded half up; 0.0004 rounds to nothing.
    let window_ms = (window_sec * 1000.0 + 0.5).floor();
    if window_ms < 1.0 {
        return Err(WINDOW_TOO_SHORT);
    }
    let cost = match cost {
        Some(raw) => COST.parse(raw)?,
        None => 1.0,
    };
    Ok(Request {
        params: sliding_log::Params {
            limit: lua_integer(limit),
            window_ms,
            window_us: window_ms * 1000.0,
        },
        op: Operation::from_cost(cost),
    })
}

/// One stored entry: an integer score in `[0, 2^53]` and the member `<digits>:<digits>` whose
/// first part is that score.
pub fn check_entry(member: &[u8], score: f64) -> Result<(), ErrorReply> {
    if !(score >= 0.0 && score <= MAX_TIMESTAMP_US && score == score.trunc()) {
        return Err(CORRUPT_SCORE);
    }
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    let at = member.iter().position(|&c| c == b':');
    let (time, index) = match at {
        Some(at) => (member.get(..at), member.get(at + 1..)),
        None => (None, None),
    };
    match (time, index) {
        (Some(time), Some(index))
            if digits(time) && digits(index) && parse_integer(time) == Some(score) =>
        {
            Ok(())
        }
        _ => Err(CORRUPT_MEMBER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(v: &[&str]) -> Result<SlidingLogRequest, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        parse(&raw).map_err(|e| e.message())
    }

    #[test]
    fn arguments() {
        let a = parse_str(&["10", "1.5"]).unwrap();
        assert_eq!(a.params.limit, 10);
        assert_eq!(
            (a.params.window_ms, a.params.window_us),
            (1500.0, 1_500_000.0)
        );
        assert_eq!(a.op, Operation::Consume(1.0));
        assert_eq!(
            parse_str(&["10", "0.0005", "0"]).map(|a| (a.params.window_ms, a.op)),
            Ok((1.0, Operation::Peek))
        );
        assert_eq!(
            parse_str(&["10", "1e10"]).map(|a| a.params.window_ms),
            Ok(1e13)
        );
        let arity = "ERR wrong number of arguments for 'rl.slidinglog' command";
        assert_eq!(parse_str(&["10"]), Err(arity));
        assert_eq!(parse_str(&["10", "1", "1", "1"]), Err(arity));
        assert_eq!(
            parse_str(&["1.5", "1"]),
            Err("ERR limit must be an integer")
        );
        assert_eq!(
            parse_str(&["0", "1"]),
            Err("ERR limit must be between 1 and 100000")
        );
        assert_eq!(
            parse_str(&["100001", "1"]),
            Err("ERR limit must be between 1 and 100000")
        );
        assert_eq!(
            parse_str(&["100000", "1"]).map(|a| a.params.limit),
            Ok(100_000)
        );
        assert_eq!(
            parse_str(&["10", "nan"]),
            Err("ERR window_sec must be a number")
        );
        let window = "ERR window_sec must be greater than 0 and at most 10000000000";
        for bad in ["0", "-1", "1e999", "10000000000.001"] {
            assert_eq!(parse_str(&["10", bad]), Err(window), "{bad}");
        }
        assert_eq!(
            parse_str(&["10", "0.0004"]),
            Err("ERR window_sec must be at least 1 millisecond")
        );
        assert_eq!(
            parse_str(&["10", "1", "x"]),
            Err("ERR cost must be an integer")
        );
        assert_eq!(
            parse_str(&["10", "1", "1000000000000001"]),
            Err("ERR cost must be between 0 and 1000000000000000")
        );
        assert_eq!(
            parse_str(&["10", "1", "1000000000000000"]).map(|a| a.op),
            Ok(Operation::Consume(1e15))
        );
    }

    #[test]
    fn stored_entries() {
        assert_eq!(check_entry(b"1700000000000000:0", 1.7e15), Ok(()));
        assert_eq!(check_entry(b"0:12", -0.0), Ok(()));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1.5, 9_007_199_254_740_994.0] {
            assert_eq!(check_entry(b"1:0", bad), Err(CORRUPT_SCORE), "{bad}");
        }
        for bad in [
            &b"17:0"[..],
            b"1",
            b"1:",
            b":0",
            b"1:0:0",
            b"1:x",
            b"+1:0",
            b" 1:0",
            b"1:-0",
        ] {
            assert_eq!(
                check_entry(bad, 1.0),
                Err(CORRUPT_MEMBER),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
