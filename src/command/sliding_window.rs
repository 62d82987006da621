//! `RL.SLIDINGWINDOW key limit window_sec [cost]`; state: one string
//! `<start> <cur> <prev>`.

use crate::codec::args::{COST, IntegerArg, MAX_INTEGER_ARG, WindowArg};
use crate::codec::error::ErrorReply;
use crate::codec::owner::Owned;
use crate::codec::remembered::Remembered;
use crate::codec::stored::{amount, timestamp, within_skew};
use crate::command::descriptor::ArgKind::{Double, Integer, Key};
use crate::command::descriptor::{COST_ARG, Descriptor, Keys, UPTO_ARG, arg};
use crate::core::{Operation, Reply, sliding_window};
use crate::observe::stats::CommandStats;
use crate::store::kind::Kind;
use crate::store::string::{FieldsLimiter, FieldsWrite};
use crate::store::{FieldName, Request};

pub type Args = Request<sliding_window::Params>;

/// The last arguments that parsed (`FieldsLimiter::remembered`).
static REMEMBERED: Owned<Remembered<Args>> = Owned::new(Remembered::new());

const LIMIT: IntegerArg = IntegerArg {
    not_integer: ErrorReply(c"ERR limit must be an integer"),
    out_of_range: ErrorReply(c"ERR limit must be between 1 and 1000000000000000"),
    min: 1.0,
    max: MAX_INTEGER_ARG,
};
const WINDOW: WindowArg = WindowArg {
    not_number: ErrorReply(c"ERR window_sec must be a number"),
    out_of_range: ErrorReply(
        c"ERR window_sec must be between 0.001 and 10000000000 (it is rounded to whole milliseconds)",
    ),
};

pub const CORRUPT_START: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'start' is not a valid timestamp");
pub const START_AHEAD: ErrorReply = ErrorReply(
    c"ERR corrupt rate limiter state: field 'start' is ahead of the server's clock by more than 60 seconds",
);
pub const CORRUPT_CUR: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'cur' is not a valid number");
pub const CORRUPT_PREV: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'prev' is not a valid number");

pub static START: FieldName = FieldName::new(c"start");
pub static CUR: FieldName = FieldName::new(c"cur");
pub static PREV: FieldName = FieldName::new(c"prev");

pub struct SlidingWindow;

static STATS: CommandStats = CommandStats::new();

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: c"RL.SLIDINGWINDOW",
    flags: c"write fast",
    keys: Keys::One(1),
    arity: -4,
    summary:
        c"Sliding window counter: the previous window weighted by its overlap plus the current one",
    complexity: c"O(1)",
    args: &[
        arg(c"key", Key),
        arg(c"limit", Integer),
        arg(c"window_sec", Double),
        COST_ARG,
        UPTO_ARG,
    ],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.slidingwindow' command"),
    all_keyword: Some("SLIDINGWINDOW"),
    stats: &STATS,
};

impl FieldsLimiter<3> for SlidingWindow {
    type Params = sliding_window::Params;
    type State = sliding_window::State;
    const ARITY_ERROR: ErrorReply = DESCRIPTOR.arity_error;
    const PARAMS: usize = 2;
    const KIND: Kind = Kind::SlidingWindow;
    const FIELDS: [&'static FieldName; 3] = [&START, &CUR, &PREV];

    fn remembered() -> &'static Owned<Remembered<Args>> {
        &REMEMBERED
    }

    fn parse(args: &[&[u8]]) -> Result<Args, ErrorReply> {
        let (limit, window, cost) = match args {
            [l, w] => (l, w, None),
            [l, w, k] => (l, w, Some(k)),
            _ => return Err(DESCRIPTOR.arity_error),
        };
        let limit = LIMIT.parse(limit)?;
        let window_ms = WINDOW.parse(window)?;
        let cost = match cost {
            Some(raw) => COST.parse(raw)?,
            None => 1.0,
        };
        Ok(Args {
            params: sliding_window::Params { limit, window_ms },
            op: Operation::from_cost(cost),
        })
    }

    #[inline(always)]
    fn decode(
        [start, cur, prev]: [Option<&[u8]>; 3],
        _: &Args,
        now_us: i64,
    ) -> Result<sliding_window::State, ErrorReply> {
        let start_us =
            within_skew(timestamp(start).ok_or(CORRUPT_START)?, now_us).ok_or(START_AHEAD)?;
        let cur = amount(cur).ok_or(CORRUPT_CUR)?;
        let prev = amount(prev).ok_or(CORRUPT_PREV)?;
        Ok(sliding_window::State {
            start_us,
            cur,
            prev,
        })
    }

    fn decide(
        a: &Args,
        now_us: i64,
        prior: Option<sliding_window::State>,
    ) -> (Reply, Option<FieldsWrite<3>>) {
        let out = sliding_window::decide(&a.params, a.op.units(), now_us, prior);
        (out.reply, out.write.map(stored))
    }

    fn settle(
        a: &Args,
        delta: f64,
        now_us: i64,
        prior: Option<sliding_window::State>,
    ) -> Option<(sliding_window::State, FieldsWrite<3>)> {
        sliding_window::settle(&a.params, delta, now_us, prior).map(|w| (w.state, stored(w)))
    }
}

/// The numbers a write stores, in `FIELDS` order.
fn stored(w: sliding_window::Write) -> FieldsWrite<3> {
    FieldsWrite {
        values: [w.state.start_us, w.state.cur, w.state.prev],
        expire_at_ms: w.expire_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Args, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        SlidingWindow::parse(&raw).map_err(|e| e.message())
    }

    const RANGE: &str = "ERR window_sec must be between 0.001 and 10000000000 (it is rounded to whole milliseconds)";

    #[test]
    fn arguments() {
        assert_eq!(
            parse(&["10", "60"]),
            Ok(Args {
                params: sliding_window::Params {
                    limit: 10.0,
                    window_ms: 60_000.0
                },
                op: Operation::Consume(1.0)
            })
        );
        let window = |w: &str| parse(&["10", w]).map(|a| a.params.window_ms);
        assert_eq!(window("0.001"), Ok(1.0));
        assert_eq!(
            window("0.0005"),
            Ok(1.0),
            "rounded to the nearest millisecond"
        );
        assert_eq!(window("1.2345"), Ok(1235.0));
        assert_eq!(window("1e10"), Ok(1e13));
        assert_eq!(window("0.0004"), Err(RANGE));
        assert_eq!(window("0"), Err(RANGE));
        assert_eq!(window("-1"), Err(RANGE));
        assert_eq!(window("10000000000.1"), Err(RANGE));
        assert_eq!(window("1e999"), Err(RANGE));
        assert_eq!(window("inf"), Err("ERR window_sec must be a number"));
        assert_eq!(window(""), Err("ERR window_sec must be a number"));
        assert_eq!(
            parse(&["10"]),
            Err("ERR wrong number of arguments for 'rl.slidingwindow' command")
        );
        assert_eq!(parse(&["ten", "1"]), Err("ERR limit must be an integer"));
        assert_eq!(
            parse(&["0", "1"]),
            Err("ERR limit must be between 1 and 1000000000000000")
        );
        assert_eq!(
            parse(&["10", "1", "-1"]),
            Err("ERR cost must be between 0 and 1000000000000000")
        );
    }

    #[test]
    fn stored_fields() {
        let a = SlidingWindow::parse(&[b"10", b"60"]).unwrap();
        let now = 1_800_000_000_000_000;
        let d = |s: Option<&[u8]>, c: Option<&[u8]>, p: Option<&[u8]>| {
            SlidingWindow::decode([s, c, p], &a, now)
        };
        assert_eq!(
            d(Some(b"17"), Some(b"3"), Some(b"4.5")),
            Ok(sliding_window::State {
                start_us: 17.0,
                cur: 3.0,
                prev: 4.5
            })
        );
        assert_eq!(d(None, Some(b"1"), Some(b"1")), Err(CORRUPT_START));
        assert_eq!(d(Some(b"1.5"), Some(b"1"), Some(b"1")), Err(CORRUPT_START));
        assert_eq!(d(Some(b"1"), Some(b"-1"), Some(b"1")), Err(CORRUPT_CUR));
        assert_eq!(d(Some(b"1"), None, Some(b"1")), Err(CORRUPT_CUR));
        assert_eq!(d(Some(b"1"), Some(b"1"), Some(b"nan")), Err(CORRUPT_PREV));
        assert_eq!(d(Some(b"1"), Some(b"1"), None), Err(CORRUPT_PREV));
        assert_eq!(
            d(Some(b"1800000060000000"), Some(b"1"), Some(b"1")).map(|s| s.start_us),
            Ok(1.80000006e15)
        );
        assert_eq!(
            d(Some(b"1800000060000001"), Some(b"1"), Some(b"1")),
            Err(START_AHEAD)
        );
        assert_eq!(
            d(Some(b"1"), Some(b"2e15"), Some(b"2e15")).map(|s| s.cur),
            Ok(2e15)
        );
        assert_eq!(d(Some(b"1"), Some(b"2.1e15"), Some(b"1")), Err(CORRUPT_CUR));
        assert_eq!(
            d(Some(b"1"), Some(b"1000000000000000"), Some(b"1e15")).map(|s| s.prev),
            Ok(1e15)
        );
        assert_eq!(d(Some(b"1"), Some(b"1e300"), Some(b"1")), Err(CORRUPT_CUR));
        assert_eq!(
            d(Some(b"1"), Some(b"1"), Some(b"2000000000000001")),
            Err(CORRUPT_PREV)
        );
    }
}
