//! `RL.SLIDINGLOG key limit window_sec [cost]`; state: a sorted set of admitted requests, one
//! member `<t>:<i>` per unit of cost at score `t` (the call time in Unix microseconds).

use std::ffi::CStr;

use crate::codec::args::{IntegerArg, split_upto, upto_arg, with_last};
use crate::codec::error::ErrorReply;
use crate::codec::number::{floor, parse_decimal};
use crate::codec::owner::Owned;
use crate::codec::remembered::{self, Remembered};
use crate::command::descriptor::ArgKind::{Double, Integer, Key};
use crate::command::descriptor::{COST_ARG, Descriptor, Keys, UPTO_ARG, arg};
use crate::command::{Entry, PerCall, Runner};
use crate::core::{Operation, Reply, lua_integer, sliding_log};
use crate::observe::stats::CommandStats;
use crate::store::zset::{
    self, LogLimit, LogSettle, MAX_ENTRIES_PER_CALL, MAX_SET_LIMIT, SlidingLogRequest,
};
use crate::store::{Limit, OpenStore, Request};

/// Largest `limit`: every admitted unit is one sorted-set entry of about 120 bytes, so a full
/// key of this limit holds about 1.2 MB (see `store::zset::MAX_SET_LIMIT`).
pub const MAX_LIMIT: f64 = MAX_SET_LIMIT;
/// Longest window in seconds.
pub const MAX_WINDOW_SECONDS: f64 = 1e10;

pub const NAME: &CStr = c"RL.SLIDINGLOG";
pub static STATS: CommandStats = CommandStats::new();

pub const ARITY_ERROR: ErrorReply =
    ErrorReply(c"ERR wrong number of arguments for 'rl.slidinglog' command");

pub const ENTRY: Entry = Entry {
    descriptor: &DESCRIPTOR,
    runner: Runner::OneKey {
        run,
        limit: build_limit,
        settle: Some(build_settle),
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
        UPTO_ARG,
    ],
    arity_error: ARITY_ERROR,
    all_keyword: Some("SLIDINGLOG"),
    stats: &STATS,
};
const LIMIT: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR limit must be an integer"),
    out_of_range: ErrorReply(c"ERR limit must be between 1 and 10000"),
    min: 1.0,
    max: MAX_LIMIT,
};
/// A sliding log's cost: one entry per unit, at most `MAX_ENTRIES_PER_CALL` per call.
const COST: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR cost must be an integer"),
    out_of_range: ErrorReply(
        c"ERR cost must be between 0 and 1000 for a sliding log (one entry per unit)",
    ),
    min: 0.0,
    max: MAX_ENTRIES_PER_CALL as f64,
};
/// A partial grant takes at most as many entries as a cost.
const UPTO: IntegerArg = upto_arg(
    ErrorReply(c"ERR UPTO must be between 1 and 1000 for a sliding log (one entry per unit)"),
    MAX_ENTRIES_PER_CALL as f64,
);
/// A settlement of more units than a call adds or removes.
pub const DELTA_TOO_LARGE: ErrorReply =
    ErrorReply(c"ERR DELTA must be between -1000 and 1000 for a sliding log (one entry per unit)");
const WINDOW_NOT_NUMBER: ErrorReply = ErrorReply(c"ERR window_sec must be a number");
const WINDOW_OUT_OF_RANGE: ErrorReply =
    ErrorReply(c"ERR window_sec must be greater than 0 and at most 10000000000");
const WINDOW_TOO_SHORT: ErrorReply = ErrorReply(c"ERR window_sec must be at least 1 millisecond");

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
    let window_ms = floor(window_sec * 1000.0 + 0.5);
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

/// The last arguments that parsed (`codec::remembered`), kept by the main thread.
static REMEMBERED: Owned<Remembered<SlidingLogRequest>> = Owned::new(Remembered::new());

/// The arguments after the key, ending with a cost or with `UPTO n` in its place (parsed with a
/// cost of 1 there, so that a call with both has one argument too many); the last ones that
/// parsed again when they are the same bytes.
pub fn parse_call(args: &[&[u8]]) -> Result<SlidingLogRequest, ErrorReply> {
    remembered::parse(&REMEMBERED, args, parse_args)
}

fn parse_args(args: &[&[u8]]) -> Result<SlidingLogRequest, ErrorReply> {
    match split_upto(args, &UPTO)? {
        // `UPTO n` stands in for the cost, never for a parameter (`limit window_sec`).
        (params, Some(_)) if params.len() != 2 => Err(ARITY_ERROR),
        (params, Some(n)) => with_last(params, b"1", ARITY_ERROR, parse).map(|r| Request {
            op: Operation::UpTo(n),
            ..r
        }),
        (_, None) => parse(args),
    }
}

/// One `RL.SLIDINGLOG` call: the arguments after the key, then its key.
pub fn run(args: &[&[u8]], key: &mut dyn OpenStore, now_us: i64) -> Result<Reply, ErrorReply> {
    let request = parse_call(args)?;
    zset::apply(key.open()?, &request, now_us)
}

/// `params` of `RL.ALL`'s sliding-log limit (without the cost).
fn limit_request(params: &[&[u8]], cost: &[u8]) -> Result<SlidingLogRequest, ErrorReply> {
    let [limit, window] = params else {
        return Err(ARITY_ERROR);
    };
    parse(&[*limit, *window, cost])
}

/// `RL.ALL`'s sliding-log limit.
pub fn build_limit(params: &[&[u8]], call: &PerCall<'_>) -> Result<Box<dyn Limit>, ErrorReply> {
    let Some(n) = call.upto else {
        return Ok(Box::new(LogLimit::new(limit_request(params, call.cost)?)));
    };
    let request = limit_request(params, b"1")?;
    if n > UPTO.max {
        return Err(UPTO.out_of_range);
    }
    Ok(Box::new(LogLimit::new(Request {
        op: Operation::UpTo(n),
        ..request
    })))
}

/// `RL.SETTLE`'s sliding-log limit.
pub fn build_settle(params: &[&[u8]], delta: f64) -> Result<Box<dyn Limit>, ErrorReply> {
    let request = limit_request(params, b"0")?;
    if delta.abs() > MAX_ENTRIES_PER_CALL as f64 {
        return Err(DELTA_TOO_LARGE);
    }
    Ok(Box::new(LogSettle::new(request, delta)))
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
            Err("ERR limit must be between 1 and 10000")
        );
        assert_eq!(
            parse_str(&["10001", "1"]),
            Err("ERR limit must be between 1 and 10000")
        );
        assert_eq!(
            parse_str(&["10000", "1"]).map(|a| a.params.limit),
            Ok(10_000)
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
            Err("ERR cost must be between 0 and 1000 for a sliding log (one entry per unit)")
        );
        assert_eq!(
            parse_str(&["10", "1", "1001"]),
            Err("ERR cost must be between 0 and 1000 for a sliding log (one entry per unit)")
        );
        assert_eq!(
            parse_str(&["10", "1", "1000"]).map(|a| a.op),
            Ok(Operation::Consume(1000.0))
        );
    }
}
