//! `RL.SETTLE numkeys key [key ...] ALGORITHM params... [ALGORITHM params...] DELTA n`
//!
//! Settles what a call reserved once its true cost is known: the limits are written as in
//! `RL.ALL` (a keyword and that command's parameters without key and cost, one limit per key);
//! a negative `n` refunds `|n|` units to every limit, a positive `n` charges `n` units without
//! any admission check (a limit may go into debt, which later calls pay back), `DELTA 0` reports
//! and writes nothing. Reply: one five-integer reply per limit, its state after settlement
//! (`allowed` 1, `retry_after_ms` 0).

use std::ffi::CStr;

use crate::codec::error::ErrorReply;
use crate::codec::number::parse_integer;
use crate::command::all::{self, check_keys, each_limit, split_keys};
use crate::command::descriptor::ArgKind::{self, Integer, Key};
use crate::command::descriptor::{Descriptor, Keys, arg, repeated};
use crate::command::limiters;
use crate::command::{BuildSettle, Entry, Runner};
use crate::observe::stats::CommandStats;
use crate::store::Limit;

pub const NAME: &CStr = c"RL.SETTLE";
pub static STATS: CommandStats = CommandStats::new();

pub const ARITY: ErrorReply = ErrorReply(c"ERR wrong number of arguments for 'rl.settle' command");

pub const ENTRY: Entry = Entry {
    descriptor: &DESCRIPTOR,
    runner: Runner::Settle,
};

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    flags: c"write fast getkeys-api",
    keys: Keys::Counted(1),
    arity: -8,
    summary: c"Refunds (negative DELTA) or charges (positive) units to several limits without an admission check",
    complexity: c"O(N) where N is the number of limits (a sliding log: O(log M + |DELTA|))",
    args: &[
        arg(c"numkeys", Integer),
        repeated(c"key", Key),
        repeated(c"limit", ArgKind::String),
        arg(c"delta", Integer),
    ],
    arity_error: ARITY,
    all_keyword: None,
    stats: &STATS,
};

/// Arguments after the command name in the shortest call: `numkeys key ALGORITHM p1 p2 DELTA n`.
const MIN_ARGS: usize = 7;
/// Largest `|n|`, as for a cost.
const MAX_DELTA: f64 = crate::codec::args::MAX_INTEGER_ARG;

const NO_DELTA: ErrorReply = ErrorReply(c"ERR the call must end with DELTA n");
const DELTA_NOT_INTEGER: ErrorReply = ErrorReply(c"ERR DELTA must be an integer");
const DELTA_OUT_OF_RANGE: ErrorReply =
    ErrorReply(c"ERR DELTA must be between -1000000000000000 and 1000000000000000");

/// The limiters `RL.SETTLE` settles: every one `RL.ALL` combines that has a settlement.
pub fn algorithms() -> impl Iterator<Item = (&'static Descriptor, &'static str, BuildSettle)> {
    limiters::settled()
}

/// `ERR unknown algorithm, expected one of: ...` with every keyword `RL.SETTLE` settles.
const UNKNOWN: ErrorReply = ErrorReply(all::unknown_text(&UNKNOWN_BYTES));
const UNKNOWN_BYTES: [u8; 128] = all::unknown_bytes(true);

/// Parses everything after the command name: the keys and one settling limit per key.
pub fn parse<'a>(args: &'a [&'a [u8]]) -> Result<all::Call<'a>, ErrorReply> {
    let (keys, words) = split_keys(args, MIN_ARGS, ARITY)?;
    let [words @ .., keyword, delta] = words else {
        return Err(NO_DELTA);
    };
    if !keyword.eq_ignore_ascii_case(b"DELTA") {
        return Err(NO_DELTA);
    }
    let delta = parse_integer(delta).ok_or(DELTA_NOT_INTEGER)?;
    if delta.abs() > MAX_DELTA {
        return Err(DELTA_OUT_OF_RANGE);
    }
    let find = |keyword: &[u8]| {
        algorithms()
            .find(|(_, k, _)| keyword.eq_ignore_ascii_case(k.as_bytes()))
            .map(|(d, _, build)| (d, build))
            .ok_or(UNKNOWN)
    };
    let limits: Vec<Box<dyn Limit>> =
        each_limit(words, ARITY, find, |_, build, params| build(params, delta))?;
    check_keys(keys, limits.len())?;
    Ok(all::Call { keys, limits })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(v: &[&str]) -> Result<usize, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        parse(&raw).map(|c| c.limits.len()).map_err(|e| e.message())
    }

    #[test]
    fn grammar() {
        let tb = ["TOKENBUCKET", "10", "5"];
        let call = |head: &[&str], tail: &[&str]| parse_str(&[head, &tb[..], tail].concat());
        assert_eq!(call(&["1", "k"], &["DELTA", "-3"]), Ok(1));
        assert_eq!(call(&["1", "k"], &["delta", "0"]), Ok(1));
        assert_eq!(
            parse_str(&[
                "2",
                "a",
                "b",
                "GCRA",
                "1",
                "1",
                "1",
                "SLIDINGWINDOW",
                "3",
                "1",
                "DELTA",
                "1"
            ]),
            Ok(2)
        );
        let arity = "ERR wrong number of arguments for 'rl.settle' command";
        assert_eq!(call(&["1", "k"], &["DELTA"]), Err(arity));
        assert_eq!(
            call(&["1", "k"], &["COST", "1"]),
            Err("ERR the call must end with DELTA n")
        );
        assert_eq!(
            call(&["1", "k"], &["DELTA", "1.5"]),
            Err("ERR DELTA must be an integer")
        );
        assert_eq!(
            call(&["1", "k"], &["DELTA", "-1000000000000001"]),
            Err("ERR DELTA must be between -1000000000000000 and 1000000000000000")
        );
        assert_eq!(
            call(&["0", "k"], &["DELTA", "1"]),
            Err("ERR numkeys must be an integer between 1 and 16")
        );
        assert_eq!(
            call(&["2", "k", "k"], &["TOKENBUCKET", "1", "1", "DELTA", "1"]),
            Err("ERR each limit needs its own key")
        );
        assert_eq!(
            call(&["2", "j", "k"], &["DELTA", "1"]),
            Err("ERR the number of limits must equal numkeys")
        );
        assert_eq!(
            parse_str(&["1", "k", "CONCURRENCY", "1", "1", "DELTA", "1"]),
            Err(
                "ERR unknown algorithm, expected one of: TOKENBUCKET LEAKYBUCKET FIXEDWINDOW SLIDINGWINDOW GCRA SLIDINGLOG"
            )
        );
        assert_eq!(
            call(&["1", "k"], &["TOKENBUCKET", "DELTA", "1"]),
            Err(arity)
        );
    }
}
