//! `RL.FIXEDWINDOW key limit window_sec [cost]`; state: one string `<count> <start>`.

use crate::codec::args::{COST, IntegerArg, MAX_INTEGER_ARG, WindowArg};
use crate::codec::error::ErrorReply;
use crate::codec::owner::Owned;
use crate::codec::remembered::Remembered;
use crate::codec::stored::{amount, timestamp, within_skew};
use crate::command::descriptor::ArgKind::{Double, Integer, Key};
use crate::command::descriptor::{COST_ARG, Descriptor, Keys, UPTO_ARG, arg};
use crate::core::{Operation, Reply, fixed_window};
use crate::observe::stats::CommandStats;
use crate::store::kind::Kind;
use crate::store::string::{FieldsLimiter, FieldsWrite};
use crate::store::{FieldName, Request};

pub type Args = Request<fixed_window::Params>;

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

pub const CORRUPT_COUNT: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'count' is not a valid number");
pub const CORRUPT_START: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: field 'start' is not a valid timestamp");
pub const START_AHEAD: ErrorReply = ErrorReply(
    c"ERR corrupt rate limiter state: field 'start' is ahead of the server's clock by more than 60 seconds",
);

pub static COUNT: FieldName = FieldName::new(c"count");
pub static START: FieldName = FieldName::new(c"start");

pub struct FixedWindow;

static STATS: CommandStats = CommandStats::new();

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: c"RL.FIXEDWINDOW",
    flags: c"write fast",
    keys: Keys::One(1),
    arity: -4,
    summary: c"Fixed window counter: at most limit per window, the window opening at the first admitted call",
    complexity: c"O(1)",
    args: &[arg(c"key", Key), arg(c"limit", Integer), arg(c"window_sec", Double), COST_ARG, UPTO_ARG],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.fixedwindow' command"),
    all_keyword: Some("FIXEDWINDOW"),
    stats: &STATS,
};

impl FieldsLimiter<2> for FixedWindow {
    type Params = fixed_window::Params;
    type State = fixed_window::State;
    const ARITY_ERROR: ErrorReply = DESCRIPTOR.arity_error;
    const PARAMS: usize = 2;
    const KIND: Kind = Kind::FixedWindow;
    const FIELDS: [&'static FieldName; 2] = [&COUNT, &START];

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
            params: fixed_window::Params { limit, window_ms },
            op: Operation::from_cost(cost),
        })
    }

    #[inline(always)]
    fn decode(
        [count, start]: [Option<&[u8]>; 2],
        _: &Args,
        now_us: i64,
    ) -> Result<fixed_window::State, ErrorReply> {
        let count = amount(count).ok_or(CORRUPT_COUNT)?;
        let start_us =
            within_skew(timestamp(start).ok_or(CORRUPT_START)?, now_us).ok_or(START_AHEAD)?;
        Ok(fixed_window::State { count, start_us })
    }

    fn decide(
        a: &Args,
        now_us: i64,
        prior: Option<fixed_window::State>,
    ) -> (Reply, Option<FieldsWrite<2>>) {
        let out = fixed_window::decide(&a.params, a.op.units(), now_us, prior);
        (out.reply, out.write.map(stored))
    }

    fn settle(
        a: &Args,
        delta: f64,
        now_us: i64,
        prior: Option<fixed_window::State>,
    ) -> Option<(fixed_window::State, FieldsWrite<2>)> {
        fixed_window::settle(&a.params, delta, now_us, prior).map(|w| (w.state, stored(w)))
    }
}

/// The numbers a write stores, in `FIELDS` order.
fn stored(w: fixed_window::Write) -> FieldsWrite<2> {
    FieldsWrite {
        values: [w.state.count, w.state.start_us],
        expire_at_ms: w.expire_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Args, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        FixedWindow::parse(&raw).map_err(|e| e.message())
    }

    const RANGE: &str = "ERR window_sec must be between 0.001 and 10000000000 (it is rounded to whole milliseconds)";

    #[test]
    fn arguments() {
        assert_eq!(
            parse(&["10", "60"]),
            Ok(Args {
                params: fixed_window::Params {
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
            Err("ERR wrong number of arguments for 'rl.fixedwindow' command")
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
        let a = FixedWindow::parse(&[b"10", b"60"]).unwrap();
        let now = 1_800_000_000_000_000;
        let d = |c: Option<&[u8]>, s: Option<&[u8]>| FixedWindow::decode([c, s], &a, now);
        assert_eq!(
            d(Some(b"3"), Some(b"17")),
            Ok(fixed_window::State {
                count: 3.0,
                start_us: 17.0
            })
        );
        assert_eq!(d(None, Some(b"1")), Err(CORRUPT_COUNT));
        assert_eq!(d(Some(b"-1"), Some(b"1")), Err(CORRUPT_COUNT));
        assert_eq!(d(Some(b"1"), Some(b"1.5")), Err(CORRUPT_START));
        assert_eq!(d(Some(b"1"), None), Err(CORRUPT_START));
        // A start up to a minute ahead (a clock that was ahead) is kept; further, no call wrote.
        let start = |s: &[u8]| d(Some(b"1"), Some(s)).map(|s| s.start_us);
        assert_eq!(start(b"1800000060000000"), Ok(1.80000006e15));
        assert_eq!(start(b"1800000060000001"), Err(START_AHEAD));
        assert_eq!(d(Some(b"2e15"), Some(b"1")).map(|s| s.count), Ok(2e15));
        assert_eq!(
            d(Some(b"2.0000000000000002e15"), Some(b"1")),
            Err(CORRUPT_COUNT)
        );
    }
}
