//! `RL.TOP [count]` and `RL.TOP RESET`: the keys with the most denials on this server
//! (`crate::observe::top`), for operators. Not a limiter: it is outside the registry and outside the
//! `ratelimit` ACL category (it shows every tenant's keys), flagged `admin`.

use std::ffi::CStr;

use crate::codec::error::ErrorReply;
use crate::codec::number::parse_integer;
use crate::command::descriptor::{ArgKind, Descriptor, Keys, optional};
use crate::observe::stats::CommandStats;

pub const NAME: &CStr = c"RL.TOP";

pub const DESCRIPTOR: Descriptor = Descriptor {
    name: NAME,
    flags: c"admin fast",
    keys: Keys::None,
    arity: -1,
    summary: c"The keys with the most denials on this server, most first (RESET clears them)",
    complexity: c"O(S log S) where S is the number of slots (ratelimit.top-slots)",
    args: &[optional(c"count", ArgKind::Integer)],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.top' command"),
    all_keyword: None,
    stats: &STATS,
};

/// Never shown: INFO lists the limiters only.
static STATS: CommandStats = CommandStats::new();

/// Entries listed when no count is given.
pub const DEFAULT_COUNT: usize = 10;

const BAD_COUNT: ErrorReply =
    ErrorReply(c"ERR count must be an integer between 1 and 100000, or RESET");

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
            Some(n) if (1.0..=crate::observe::stats::MAX_TOP_SLOTS as f64).contains(&n) => {
                Ok(Request::List(n as usize))
            }
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
        let bad = "ERR count must be an integer between 1 and 100000, or RESET";
        for v in ["0", "-1", "1.5", "x", "100001"] {
            assert_eq!(p(&[v]), Err(bad), "{v}");
        }
        assert_eq!(
            p(&["1", "2"]),
            Err("ERR wrong number of arguments for 'rl.top' command")
        );
    }
}
