//! `RL.TOP [count] [WITHDB]` and `RL.TOP RESET`: the keys with the most denials on this server
//! (`crate::observe::top`), each name in each database its own key, for operators. Not a limiter: it is outside the registry and outside the
//! `ratelimit` ACL category (it shows every tenant's keys), flagged `admin` (so in `@admin` and
//! `@dangerous` where the server has module ACL categories). Not `fast`: a list and a reset cost
//! O(count) and O(slots).

use std::ffi::CStr;

use crate::codec::error::ErrorReply;
use crate::codec::number::parse_integer;
use crate::command::descriptor::{Arg, ArgKind, Descriptor, Keys, optional};
use crate::observe::stats::CommandStats;

pub const NAME: &CStr = c"RL.TOP";

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    flags: c"admin",
    keys: Keys::None,
    arity: -1,
    summary: c"The keys with the most denials on this server, most first (RESET clears them)",
    complexity:
        c"O(N) where N is the count (at most 1000); RESET: O(S) where S is the number of slots",
    args: &[
        optional(c"count", ArgKind::Integer),
        Arg {
            token: Some(c"WITHDB"),
            ..optional(c"withdb", ArgKind::PureToken)
        },
    ],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.top' command"),
    all_keyword: None,
    stats: &STATS,
};

/// Never shown: INFO lists the limiters only.
static STATS: CommandStats = CommandStats::new();

/// Entries listed when no count is given.
pub const DEFAULT_COUNT: usize = 10;

/// The most entries one call lists: the reply is built within the call, so its size is bounded.
pub const MAX_COUNT: usize = 1000;

const BAD_COUNT: ErrorReply =
    ErrorReply(c"ERR count must be an integer between 1 and 1000, or RESET");
const BAD_OPTION: ErrorReply = ErrorReply(c"ERR the only option after count is WITHDB");

/// The keyword that adds each key's database to its entry.
const WITHDB: &[u8] = b"WITHDB";

/// What a call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// The `count` heaviest entries, with their keys' databases when `with_db`.
    List {
        count: usize,
        with_db: bool,
    },
    Reset,
}

fn count_arg(raw: &[u8]) -> Result<usize, ErrorReply> {
    match parse_integer(raw) {
        Some(n) if (1.0..=MAX_COUNT as f64).contains(&n) => Ok(n as usize),
        _ => Err(BAD_COUNT),
    }
}

/// Arguments after the command name.
pub fn parse(args: &[&[u8]]) -> Result<Request, ErrorReply> {
    match args {
        [] => Ok(Request::List {
            count: DEFAULT_COUNT,
            with_db: false,
        }),
        [word] if word.eq_ignore_ascii_case(b"RESET") => Ok(Request::Reset),
        [word] if word.eq_ignore_ascii_case(WITHDB) => Ok(Request::List {
            count: DEFAULT_COUNT,
            with_db: true,
        }),
        [count] => Ok(Request::List {
            count: count_arg(count)?,
            with_db: false,
        }),
        [count, word] => {
            let count = count_arg(count)?;
            if !word.eq_ignore_ascii_case(WITHDB) {
                return Err(BAD_OPTION);
            }
            Ok(Request::List {
                count,
                with_db: true,
            })
        }
        _ => Err(DESCRIPTOR.arity_error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        let p = |v: &[&str]| {
            let raw: Vec<&[u8]> = v.iter().map(|s| s.as_bytes()).collect();
            parse(&raw).map_err(|e| e.message())
        };
        let list = |count, with_db| Ok(Request::List { count, with_db });
        assert_eq!(p(&[]), list(10, false));
        assert_eq!(p(&["3"]), list(3, false));
        assert_eq!(p(&["reset"]), Ok(Request::Reset));
        assert_eq!(p(&["1000"]), list(1000, false));
        assert_eq!(p(&["withdb"]), list(10, true));
        assert_eq!(p(&["3", "WITHDB"]), list(3, true));
        assert_eq!(
            p(&["3", "reset"]),
            Err("ERR the only option after count is WITHDB")
        );
        let bad = "ERR count must be an integer between 1 and 1000, or RESET";
        for v in ["0", "-1", "1.5", "x", "1001", "100000"] {
            assert_eq!(p(&[v]), Err(bad), "{v}");
        }
        assert_eq!(
            p(&["1", "WITHDB", "2"]),
            Err("ERR wrong number of arguments for 'rl.top' command")
        );
    }
}
