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
use crate::command::all::{self, check_entries, check_keys, each_limit, split_keys};
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

/// `RL.SETTLE`'s last words, read first: `DELTA n`.
pub const LAST_WORDS: usize = 2;

/// Arguments after the command name in the shortest call: `numkeys key ALGORITHM p1 p2 DELTA n`.
const MIN_ARGS: usize = 7;
/// Largest `|n|`, as for a cost.
const MAX_DELTA: f64 = crate::codec::args::MAX_INTEGER_ARG;

/// More sliding-log entries than one call adds or removes (`store::zset::MAX_ENTRIES_PER_CALL`).
pub const TOO_MANY_ENTRIES: ErrorReply = ErrorReply(
    c"ERR one call adds or removes at most 1000 sliding-log entries: |DELTA| times the SLIDINGLOG limits is above it",
);
const NO_DELTA: ErrorReply = ErrorReply(c"ERR the call must end with DELTA n");
/// Fewer words after the keys than one limit per key (a keyword and its parameters, at least
/// `shortest_limit` words each) and `DELTA n` take.
const MISSING: ErrorReply = ErrorReply(
    c"ERR wrong number of arguments for 'rl.settle' command: numkeys limits and DELTA n must follow the keys",
);
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

/// The fewest words a settled limit takes: its keyword and its parameters.
fn shortest_limit() -> usize {
    algorithms()
        .map(|(d, _, _)| 1 + d.all_params())
        .min()
        .unwrap_or(1)
}

/// Parses everything after the command name: the keys and one settling limit per key.
pub fn parse<'a>(args: &'a [&'a [u8]]) -> Result<all::Call<'a>, ErrorReply> {
    let (keys, words) = split_keys(args, MIN_ARGS, ARITY)?;
    if words.len() < keys.len() * shortest_limit() + 2 {
        return Err(MISSING);
    }
    let [words @ .., keyword, delta] = words else {
        return Err(MISSING);
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
        each_limit(words, keys.len(), ARITY, find, |_, build, params| {
            build(params, delta)
        })?;
    check_keys(keys, limits.len())?;
    check_entries(&limits, TOO_MANY_ENTRIES)?;
    Ok(all::Call {
        keys,
        limits,
        upto: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(v: &[&str]) -> Result<usize, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        parse(&raw).map(|c| c.limits.len()).map_err(|e| e.message())
    }

    #[test]
    fn a_call_longer_than_any_valid_one_gets_its_whole_errors_from_the_part_read() {
        let gcra = ["GCRA", "1", "1", "1"];
        let keys: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
        let mut longer: Vec<&str> = vec!["16"];
        longer.extend(keys.iter().map(String::as_str));
        for _ in 0..17 {
            longer.extend(gcra);
        }
        longer.extend(["DELTA", "5"]);
        let raw: Vec<&[u8]> = longer.iter().map(|s| s.as_bytes()).collect();
        let read = all::read_part(&raw, LAST_WORDS);
        assert_eq!(read.len(), all::MAX_HEAD + 1 + LAST_WORDS);
        let error = |args: &[&[u8]]| parse(args).map(|c| c.limits.len()).map_err(|e| e.message());
        assert_eq!(error(&read), error(&raw));
        assert_eq!(
            error(&raw),
            Err("ERR the number of limits must equal numkeys")
        );
        // Without the 17th limit, read whole and accepted.
        let valid: Vec<&[u8]> = [&raw[..81], &raw[85..]].concat();
        assert_eq!(all::read_part(&valid, LAST_WORDS), valid);
        assert_eq!(error(&valid), Ok(16));
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
        let missing = "ERR wrong number of arguments for 'rl.settle' command: numkeys limits and DELTA n must follow the keys";
        assert_eq!(shortest_limit(), 3);
        assert_eq!(call(&["1", "k"], &["DELTA"]), Err(arity));
        // Five keys, then one word: neither the limits nor DELTA.
        assert_eq!(
            parse_str(&["5", "a", "b", "c", "d", "e", "f"]),
            Err(missing)
        );
        assert_eq!(
            parse_str(&["2", "a", "b", "TOKENBUCKET", "1", "1", "DELTA", "1"]),
            Err(missing)
        );
        assert_eq!(parse_str(&["1", "a", "b", "c", "d"]), Err(arity));
        assert_eq!(
            parse_str(&["1", "a", "b", "c", "d", "e", "f"]),
            Err("ERR the call must end with DELTA n")
        );
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
            call(&["2", "j", "k"], &["DELTA", "1", "x", "y", "z"]),
            Err("ERR the call must end with DELTA n")
        );
        assert_eq!(
            call(&["2", "j", "k"], &["GCRA", "DELTA", "1"]),
            Err(missing)
        );
        let gcra = ["GCRA", "1", "1", "1"];
        assert_eq!(
            parse_str(
                &[
                    &["4", "a", "b", "c", "d"][..],
                    &gcra,
                    &gcra,
                    &gcra,
                    &["DELTA", "1"]
                ]
                .concat()
            ),
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
            Err("ERR the number of limits must equal numkeys")
        );
        assert_eq!(
            call(&["1", "k"], &["TOKENBUCKET", "1", "1"]),
            Err("ERR the call must end with DELTA n")
        );
        assert_eq!(
            parse_str(&["1", "k", "GCRA", "1", "1", "DELTA", "1"]),
            Err(arity)
        );
    }
}
