//! `RL.TOP [count]` and `RL.TOP RESET`: the keys with the most denials on this server
//! (`crate::observe::top`), for operators. Not a limiter: it is outside the registry and outside the
//! `ratelimit` ACL category (it shows every tenant's keys), flagged `admin` (so in `@admin` and
//! `@dangerous` where the server has module ACL categories). Not `fast`: a list and a reset cost
//! O(count) and O(slots).

use std::ffi::CStr;

use crate::codec::error::ErrorReply;
use crate::codec::number::parse_integer;
use crate::command::descriptor::{ArgKind, Descriptor, Keys, optional};
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
    args: &[optional(c"count", ArgKind::Integer)],
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

/// What a call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    List(usize),
    Reset,
}

/// Arguments after the command name.
pub fn parse(args: &[&[u8]]) -> Result<Request, ErrorReply> {
    match args {
        [] => Ok(Request::List(DEFAULT_COUNT)),
        [word] if word.eq_ignore_ascii_case(b"RESET") => Ok(Request::Reset),
        [count] => match parse_integer(count) {
            Some(n) if (1.0..=MAX_COUNT as f64).contains(&n) => Ok(Request::List(n as usize)),
            _ => Err(BAD_COUNT),
        },
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
        assert_eq!(p(&[]), Ok(Request::List(10)));
        assert_eq!(p(&["3"]), Ok(Request::List(3)));
        assert_eq!(p(&["reset"]), Ok(Request::Reset));
        assert_eq!(p(&["1000"]), Ok(Request::List(1000)));
        let bad = "ERR count must be an integer between 1 and 1000, or RESET";
        for v in ["0", "-1", "1.5", "x", "1001", "100000"] {
            assert_eq!(p(&[v]), Err(bad), "{v}");
        }
        assert_eq!(
            p(&["1", "2"]),
            Err("ERR wrong number of arguments for 'rl.top' command")
        );
    }
}
