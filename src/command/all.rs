//! `RL.ALL numkeys key [key ...] ALGORITHM params... [ALGORITHM params...] [LEASE id] [COST cost]`
//!
//! Several limits checked in one call, the n-th limit on the n-th key: admitted only if every
//! limit admits, consuming from all or none. Each limit is an algorithm keyword followed by that
//! algorithm's parameters (its command's arguments without the key and the cost); one `COST`
//! applies to every limit (default 1), and one `LEASE id` to every concurrency limit (the lease
//! id of `RL.ACQUIRE`). The two may come in either order, after the limits.

use std::ffi::CStr;

use crate::codec::args::{UPTO, UPTO_ARG};
use crate::codec::error::ErrorReply;
use crate::codec::number::parse_integer;
use crate::command::descriptor::ArgKind::{self, Integer, Key};
use crate::command::descriptor::{Descriptor, Keys, arg, optional, repeated};
use crate::command::limiters;
use crate::command::{BuildLimit, Entry, PerCall, Runner};
use crate::observe::stats::CommandStats;
use crate::store::Limit;
use crate::store::zset::{MAX_ENTRIES_PER_CALL, MAX_SET_LIMITS_PER_CALL};

pub const NAME: &CStr = c"RL.ALL";
pub static STATS: CommandStats = CommandStats::new();

pub const ARITY: ErrorReply = ErrorReply(c"ERR wrong number of arguments for 'rl.all' command");

pub const ENTRY: Entry = Entry {
    descriptor: &DESCRIPTOR,
    runner: Runner::All,
};

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    // Redis 7.0 routes cluster calls (and checks CROSSSLOT) with the keys a command reports
    // through the getkeys API, not with key specs; the key spec is still set for tools.
    flags: c"write fast getkeys-api",
    keys: Keys::Counted(1),
    arity: -6,
    summary: c"Checks several limits at once; admits only if all admit, consuming from all or none",
    complexity: c"O(N) where N is the number of limits",
    args: &[
        arg(c"numkeys", Integer),
        repeated(c"key", Key),
        repeated(c"limit", ArgKind::String),
        optional(c"lease", ArgKind::String),
        optional(c"cost", Integer),
    ],
    arity_error: ARITY,
    all_keyword: None,
    stats: &STATS,
};
pub const MAX_LIMITS: usize = 16;
/// Arguments after the command name in the shortest call; Redis checks it too (arity -6).
pub const MIN_ARGS: usize = 5;
const NUMKEYS: ErrorReply = ErrorReply(c"ERR numkeys must be an integer between 1 and 16");

/// `ERR unknown algorithm, expected one of: ...` with every keyword of the registry.
const UNKNOWN: ErrorReply = ErrorReply(unknown_text(&UNKNOWN_BYTES));
const UNKNOWN_BYTES: [u8; 128] = unknown_bytes(false);

/// `ERR unknown algorithm, expected one of: ` and the keywords of the limiters, in registry
/// order: every one with a keyword, or only those `RL.SETTLE` settles. Built when compiling (a
/// text too long for the buffer fails the build), so no error text is allocated.
pub const fn unknown_bytes<const N: usize>(settled_only: bool) -> [u8; N] {
    let mut out = [0u8; N];
    let mut n = copy_into(&mut out, 0, b"ERR unknown algorithm, expected one of:");
    let mut i = 0;
    while i < limiters::LIMITERS.len() {
        let entry = &limiters::LIMITERS[i];
        let settles = match entry.runner {
            Runner::OneKey { settle, .. } => settle.is_some(),
            _ => false,
        };
        if let (Some(keyword), true) = (entry.descriptor.all_keyword, settles || !settled_only) {
            n = copy_into(&mut out, n, b" ");
            n = copy_into(&mut out, n, keyword.as_bytes());
        }
        i += 1;
    }
    // The NUL that ends it.
    assert!(n < N, "the error text does not fit");
    out
}

const fn copy_into<const N: usize>(out: &mut [u8; N], at: usize, bytes: &[u8]) -> usize {
    let mut i = 0;
    while i < bytes.len() {
        out[at + i] = bytes[i];
        i += 1;
    }
    at + bytes.len()
}

/// The text `unknown_bytes` built.
pub const fn unknown_text(bytes: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_until_nul(bytes) {
        Ok(text) => text,
        Err(_) => panic!("no NUL"),
    }
}
const COUNT: ErrorReply = ErrorReply(c"ERR the number of limits must equal numkeys");
const COST_AND_UPTO: ErrorReply = ErrorReply(c"ERR UPTO is given in place of COST, not with it");
const LEASE_UNUSED: ErrorReply = ErrorReply(c"ERR LEASE is given only with a CONCURRENCY limit");
const DUPLICATE: ErrorReply = ErrorReply(c"ERR each limit needs its own key");
/// More sliding-log entries than one call adds or removes (`store::zset::MAX_ENTRIES_PER_CALL`).
pub const TOO_MANY_ENTRIES: ErrorReply = ErrorReply(
    c"ERR one call adds or removes at most 1000 sliding-log entries: the cost (or UPTO) times the SLIDINGLOG limits is above it",
);

/// More sorted-set limits than one call combines (`store::zset::MAX_SET_LIMITS_PER_CALL`).
pub const TOO_MANY_SETS: ErrorReply =
    ErrorReply(c"ERR a call combines at most 4 SLIDINGLOG and CONCURRENCY limits");

/// The sorted-set limits of a call and their sliding-log entries, within the bounds of one call.
pub fn check_entries(limits: &[Box<dyn Limit>], too_many: ErrorReply) -> Result<(), ErrorReply> {
    if limits.iter().filter(|l| l.sorted_set()).count() > MAX_SET_LIMITS_PER_CALL {
        return Err(TOO_MANY_SETS);
    }
    let entries = limits
        .iter()
        .fold(0i64, |sum, l| sum.saturating_add(l.entries()));
    if entries > MAX_ENTRIES_PER_CALL {
        return Err(too_many);
    }
    Ok(())
}

/// The limiters `RL.ALL` combines, with how to build one limit of each.
pub fn algorithms() -> impl Iterator<Item = (&'static Descriptor, &'static str, BuildLimit)> {
    limiters::combined()
}

/// Positions (in the full argument vector, command name at 0) of the keys of a call, for cluster
/// routing, ACL key patterns and `COMMAND GETKEYS`, given its `numkeys` and how many arguments
/// follow the command name: `numkeys` at 1, the keys after it, as the command's key spec says.
/// Nothing when `numkeys` is not valid or names more keys than there are arguments after it
/// (the call itself then fails with its error, before it opens any key), so no position past
/// the arguments is reported.
pub fn key_positions(numkeys: Option<&[u8]>, args: usize) -> std::ops::Range<usize> {
    let n = numkeys.and_then(parse_integer).unwrap_or(0.0);
    if !(n >= 1.0 && n <= MAX_LIMITS as f64) || args < 1 + n as usize {
        return 0..0;
    }
    2..2 + n as usize
}

/// The most words of one limit: its keyword and at most 3 parameters (`GCRA`'s).
const MAX_LIMIT_WORDS: usize = 4;

/// The most arguments (after the command name) a call reads before its last words: numkeys, at
/// most 16 keys and 16 limits. `RL.ALL`'s options (`LEASE id`, `COST n`) and `RL.SETTLE`'s
/// `DELTA n` come after them.
pub const MAX_HEAD: usize = 1 + MAX_LIMITS * (1 + MAX_LIMIT_WORDS);

/// `RL.ALL`'s last words, read first: `LEASE id` and `COST n`.
pub const OPTION_WORDS: usize = 4;

/// The arguments a parse reads of a call, given how many of its last words the command reads
/// first (`tail`: options, `DELTA n`): all of them when there are at most `MAX_HEAD + tail`,
/// else the first `MAX_HEAD + 1` and the last `tail`. A longer call holds a word past the most
/// its keys' limits can take, and so gets the error it would get whole: a bad numkeys, key,
/// option or one of its first limits, or else a limit too many. So however many arguments a
/// call has, its parse reads at most `MAX_HEAD + 1 + tail`.
pub fn read_part<T: Copy>(args: &[T], tail: usize) -> Vec<T> {
    if args.len() <= MAX_HEAD + tail {
        return args.to_vec();
    }
    let (first, rest) = args.split_at(MAX_HEAD + 1);
    let last = rest
        .get(rest.len().saturating_sub(tail)..)
        .unwrap_or_default();
    first.iter().chain(last).copied().collect()
}

/// A parsed call: the keys, in order, and one limit per key.
pub struct Call<'a> {
    pub keys: &'a [&'a [u8]],
    pub limits: Vec<Box<dyn Limit>>,
    /// A partial grant of at most this many units on every limit (`UPTO n`).
    pub upto: Option<f64>,
}

/// The keys of a call, and the words after them.
pub type KeysAndWords<'a> = (&'a [&'a [u8]], &'a [&'a [u8]]);

/// `numkeys key [key ...] words...`: the keys and the words after them. `min_args` is the
/// shortest call's argument count (after the command name), `arity` its command's arity error.
pub fn split_keys<'a>(
    args: &'a [&'a [u8]],
    min_args: usize,
    arity: ErrorReply,
) -> Result<KeysAndWords<'a>, ErrorReply> {
    if args.len() < min_args {
        return Err(arity);
    }
    let (numkeys, rest) = args.split_first().ok_or(arity)?;
    let n = parse_integer(numkeys).ok_or(NUMKEYS)?;
    if !(n >= 1.0 && n <= MAX_LIMITS as f64) {
        return Err(NUMKEYS);
    }
    let n = n as usize;
    if rest.len() < n {
        return Err(arity);
    }
    Ok(rest.split_at(n))
}

/// The limits of `words`, each a keyword that `find` knows and its parameters (as many as its
/// descriptor's `all_params`), built by `build`: at most `keys` of them, one per key, so a call
/// with more words than its keys' limits fails at the first limit too many, before it is read.
pub fn each_limit<T>(
    mut words: &[&[u8]],
    keys: usize,
    arity: ErrorReply,
    find: impl Fn(&[u8]) -> Result<(&'static Descriptor, T), ErrorReply>,
    mut build: impl FnMut(&'static Descriptor, &T, &[&[u8]]) -> Result<Box<dyn Limit>, ErrorReply>,
) -> Result<Vec<Box<dyn Limit>>, ErrorReply> {
    let mut limits: Vec<Box<dyn Limit>> = Vec::with_capacity(keys);
    while let Some((keyword, after)) = words.split_first() {
        if limits.len() == keys {
            return Err(COUNT);
        }
        let (descriptor, how) = find(keyword)?;
        let params = descriptor.all_params();
        if after.len() < params {
            return Err(arity);
        }
        let (params, next) = after.split_at(params);
        limits.push(build(descriptor, &how, params)?);
        words = next;
    }
    Ok(limits)
}

/// One limit per key, and each key once.
pub fn check_keys(keys: &[&[u8]], limits: usize) -> Result<(), ErrorReply> {
    if limits != keys.len() {
        return Err(COUNT);
    }
    for (i, key) in keys.iter().enumerate() {
        if keys.iter().skip(i + 1).any(|other| other == key) {
            return Err(DUPLICATE);
        }
    }
    Ok(())
}

/// Parses everything after the command name.
pub fn parse<'a>(args: &'a [&'a [u8]]) -> Result<Call<'a>, ErrorReply> {
    // The shortest call is `numkeys key ALGORITHM p1 p2`.
    let (keys, mut words) = split_keys(args, MIN_ARGS, ARITY)?;
    let mut call = PerCall {
        cost: b"1",
        upto: None,
        lease: None,
    };
    // `COST n` (or `UPTO n` in its place) and `LEASE id` at the end, in any order, each at most
    // once.
    let mut cost_seen = false;
    for _ in 0..3 {
        match words {
            [head @ .., keyword, value] if !cost_seen && keyword.eq_ignore_ascii_case(b"COST") => {
                if call.upto.is_some() {
                    return Err(COST_AND_UPTO);
                }
                call.cost = value;
                cost_seen = true;
                words = head;
            }
            [head @ .., keyword, value]
                if call.upto.is_none() && keyword.eq_ignore_ascii_case(UPTO) =>
            {
                if cost_seen {
                    return Err(COST_AND_UPTO);
                }
                call.upto = Some(UPTO_ARG.parse(value)?);
                words = head;
            }
            [head @ .., keyword, value]
                if call.lease.is_none() && keyword.eq_ignore_ascii_case(b"LEASE") =>
            {
                call.lease = Some(value);
                words = head;
            }
            _ => break,
        }
    }
    let mut leases = false;
    let find = |keyword: &[u8]| {
        algorithms()
            .find(|(_, k, _)| keyword.eq_ignore_ascii_case(k.as_bytes()))
            .map(|(d, _, build)| (d, build))
            .ok_or(UNKNOWN)
    };
    let limits = each_limit(
        words,
        keys.len(),
        ARITY,
        find,
        |descriptor, build, params| {
            leases |= descriptor.args.iter().any(|a| a.per_call);
            build(params, &call)
        },
    )?;
    if limits.len() != keys.len() {
        return Err(COUNT);
    }
    if call.lease.is_some() && !leases {
        return Err(LEASE_UNUSED);
    }
    check_keys(keys, limits.len())?;
    check_entries(&limits, TOO_MANY_ENTRIES)?;
    Ok(Call {
        keys,
        limits,
        upto: call.upto,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_with_a_keyword_is_an_algorithm_and_the_error_lists_them() {
        let keywords: Vec<&str> = limiters::LIMITERS
            .iter()
            .filter_map(|e| e.descriptor.all_keyword)
            .collect();
        let algorithms: Vec<&str> = algorithms().map(|(_, k, _)| k).collect();
        assert_eq!(algorithms, keywords);
        assert_eq!(
            UNKNOWN.message(),
            format!(
                "ERR unknown algorithm, expected one of: {}",
                keywords.join(" ")
            )
        );
    }

    fn parse_str(v: &[&str]) -> Result<usize, &'static str> {
        let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
        parse(&raw).map(|c| c.limits.len()).map_err(|e| e.message())
    }

    #[test]
    fn upto_in_place_of_cost() {
        let upto = |v: &[&str]| {
            let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
            parse(&raw).map(|c| c.upto).map_err(|e| e.message())
        };
        assert_eq!(
            upto(&["1", "a", "TOKENBUCKET", "10", "5", "UPTO", "3"]),
            Ok(Some(3.0))
        );
        assert_eq!(
            upto(&["1", "a", "TOKENBUCKET", "10", "5", "COST", "3"]),
            Ok(None)
        );
        assert_eq!(
            upto(&["1", "a", "TOKENBUCKET", "10", "5", "COST", "2", "upto", "3"]),
            Err("ERR UPTO is given in place of COST, not with it")
        );
        assert_eq!(
            upto(&["1", "a", "TOKENBUCKET", "10", "5", "UPTO", "3", "COST", "2"]),
            Err("ERR UPTO is given in place of COST, not with it")
        );
        assert_eq!(
            upto(&["1", "a", "TOKENBUCKET", "10", "5", "UPTO", "0"]),
            Err("ERR UPTO must be between 1 and 1000000000000000")
        );
        assert_eq!(
            upto(&[
                "1",
                "a",
                "CONCURRENCY",
                "10",
                "5",
                "LEASE",
                "j",
                "UPTO",
                "2"
            ]),
            Err("ERR UPTO is not given with a CONCURRENCY limit (a lease is one slot)")
        );
        assert_eq!(
            upto(&["1", "a", "SLIDINGLOG", "10", "5", "UPTO", "1001"]),
            Err("ERR UPTO must be between 1 and 1000 for a sliding log (one entry per unit)")
        );
        assert_eq!(
            upto(&[
                "2",
                "a",
                "b",
                "SLIDINGLOG",
                "10",
                "5",
                "SLIDINGLOG",
                "10",
                "5",
                "UPTO",
                "501"
            ]),
            Err(TOO_MANY_ENTRIES.message())
        );
    }

    #[test]
    fn grammar() {
        assert_eq!(
            parse_str(&[
                "2",
                "a",
                "b",
                "TOKENBUCKET",
                "10",
                "5",
                "tokenbucket",
                "3",
                "1"
            ]),
            Ok(2)
        );
        assert_eq!(
            parse_str(&["1", "a", "TOKENBUCKET", "10", "5", "COST", "3"]),
            Ok(1)
        );
        assert_eq!(
            parse_str(&[]),
            Err("ERR wrong number of arguments for 'rl.all' command")
        );
        assert_eq!(
            parse_str(&["1", "a", "b"]),
            Err("ERR wrong number of arguments for 'rl.all' command")
        );
        assert_eq!(
            parse_str(&["0", "a", "b", "c", "d"]),
            Err("ERR numkeys must be an integer between 1 and 16")
        );
        assert_eq!(
            parse_str(&["x", "a", "b", "c", "d"]),
            Err("ERR numkeys must be an integer between 1 and 16")
        );
        assert_eq!(
            parse_str(&["17", "a", "b", "c", "d"]),
            Err("ERR numkeys must be an integer between 1 and 16")
        );
        assert_eq!(
            parse_str(&["5", "a", "b", "c", "d"]),
            Err("ERR wrong number of arguments for 'rl.all' command")
        );
        assert_eq!(
            parse_str(&["1", "a", "BUCKET", "1", "1"]),
            Err(
                "ERR unknown algorithm, expected one of: TOKENBUCKET LEAKYBUCKET FIXEDWINDOW SLIDINGWINDOW GCRA SLIDINGLOG CONCURRENCY"
            )
        );
        assert_eq!(
            parse_str(&["1", "a", "TOKENBUCKET", "10"]),
            Err("ERR wrong number of arguments for 'rl.all' command")
        );
        // A limit more than keys fails before it is read.
        assert_eq!(
            parse_str(&["1", "a", "TOKENBUCKET", "10", "5", "TOKENBUCKET"]),
            Err("ERR the number of limits must equal numkeys")
        );
        assert_eq!(
            parse_str(&["1", "a", "TOKENBUCKET", "10", "5", "BUCKET", "x"]),
            Err("ERR the number of limits must equal numkeys")
        );
        assert_eq!(
            parse_str(&["2", "a", "b", "TOKENBUCKET", "10", "5"]),
            Err("ERR the number of limits must equal numkeys")
        );
        assert_eq!(
            parse_str(&["2", "a", "b", "COST", "1"]),
            Err("ERR the number of limits must equal numkeys")
        );
        assert_eq!(
            parse_str(&[
                "2",
                "a",
                "a",
                "TOKENBUCKET",
                "10",
                "5",
                "TOKENBUCKET",
                "1",
                "1"
            ]),
            Err("ERR each limit needs its own key")
        );
        assert_eq!(
            parse_str(&["1", "a", "TOKENBUCKET", "x", "5"]),
            Err("ERR capacity must be an integer")
        );
        assert_eq!(
            parse_str(&["1", "a", "TOKENBUCKET", "10", "5", "COST", "-1"]),
            Err("ERR cost must be between 0 and 1000000000000000")
        );
        let lease = |v: &[&str]| parse_str(&[&["2", "a", "b"], v].concat());
        let tb = ["TOKENBUCKET", "10", "5"];
        let cc = ["CONCURRENCY", "3", "30"];
        assert_eq!(lease(&[&tb[..], &cc, &["LEASE", "j1"]].concat()), Ok(2));
        assert_eq!(
            lease(&[&tb[..], &cc, &["LEASE", "j1", "COST", "0"]].concat()),
            Ok(2)
        );
        assert_eq!(
            lease(&[&tb[..], &cc, &["cost", "2", "lease", "j1"]].concat()),
            Ok(2)
        );
        assert_eq!(
            lease(&[&tb[..], &cc].concat()),
            Err("ERR a CONCURRENCY limit needs LEASE lease_id")
        );
        assert_eq!(
            lease(&[&tb[..], &cc, &["LEASE", ""]].concat()),
            Err("ERR lease_id must be 1 to 128 bytes")
        );
        assert_eq!(
            lease(&[&tb[..], &tb, &["LEASE", "j1"]].concat()),
            Err("ERR LEASE is given only with a CONCURRENCY limit")
        );
        assert_eq!(
            lease(&[&tb[..], &cc, &["LEASE", "j1", "LEASE", "j2"]].concat()),
            Err("ERR the number of limits must equal numkeys")
        );
    }

    #[test]
    fn a_million_limits_are_refused_at_the_second() {
        let mut args: Vec<&[u8]> = vec![b"1", b"k"];
        for _ in 0..1_000_000 {
            args.extend([&b"TOKENBUCKET"[..], b"10", b"5"]);
        }
        let started = std::time::Instant::now();
        assert_eq!(
            parse(&args)
                .map(|c| c.limits.len())
                .map_err(|e| e.message()),
            Err("ERR the number of limits must equal numkeys")
        );
        // Two limits read, not a million (which took hundreds of milliseconds).
        assert!(started.elapsed() < std::time::Duration::from_millis(5));
    }

    #[test]
    fn key_positions_never_reach_past_the_arguments() {
        let positions = |v: &[&str]| key_positions(v.first().map(|n| n.as_bytes()), v.len());
        assert_eq!(positions(&["2", "a", "b", "GCRA", "1", "1", "1"]), 2..4);
        assert_eq!(positions(&["1", "k"]), 2..3);
        for bad in [
            &["5", "k1", "TOKENBUCKET", "5", "1"][..],
            &["0", "k", "TOKENBUCKET", "5", "1"],
            &["17", "k", "TOKENBUCKET", "5", "1"],
            &["x", "k", "TOKENBUCKET", "5", "1"],
            &["1"],
            &[],
        ] {
            assert_eq!(positions(bad), 0..0, "{bad:?}");
        }
    }

    #[test]
    fn every_limit_fits_the_words_a_long_call_is_read_for() {
        for (d, _, _) in algorithms() {
            assert!(d.all_params() < MAX_LIMIT_WORDS, "{:?}", d.name);
        }
        assert_eq!(MAX_HEAD, 81);
        // 16 keys, 15 GCRA limits and a concurrency limit, then LEASE and COST: read whole.
        let mut longest: Vec<&[u8]> = vec![b"16"];
        let names: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
        longest.extend(names.iter().map(|n| n.as_bytes()));
        for _ in 0..15 {
            longest.extend([&b"GCRA"[..], b"1", b"1", b"1"]);
        }
        longest.extend([
            &b"CONCURRENCY"[..],
            b"1",
            b"1",
            b"LEASE",
            b"j",
            b"COST",
            b"2",
        ]);
        assert_eq!(read_part(&longest, OPTION_WORDS), longest);
        assert_eq!(parse(&longest).map(|c| c.limits.len()).ok(), Some(16));
        // Longer, by a limit: the first 82 and the last 4, with the error the whole call gets.
        let mut longer = longest.clone();
        longer.splice(80..80, [&b"GCRA"[..], b"1", b"1", b"1"]);
        let read = read_part(&longer, OPTION_WORDS);
        assert_eq!(read.len(), 86);
        assert_eq!(read[..82], longer[..82]);
        assert_eq!(read[82..], longer[longer.len() - 4..]);
        let error = |args: &[&[u8]]| parse(args).map(|c| c.limits.len()).map_err(|e| e.message());
        assert_eq!(error(&read), error(&longer));
        assert_eq!(
            error(&read),
            Err("ERR the number of limits must equal numkeys")
        );
        // A bad cost is still the error, as it is for the whole call.
        let last = longer.len() - 1;
        longer[last] = b"-1";
        assert_eq!(error(&read_part(&longer, OPTION_WORDS)), error(&longer));
        assert_eq!(
            error(&longer),
            Err("ERR cost must be between 0 and 1000000000000000")
        );
    }
}
