//! Which kind of limiter wrote a key, and the error a call of another kind answers on it.
//!
//! A limiter of numbers stores a short tag as the first word of its value (`tb 4.5
//! 1700000000123456`); the Lua twins write the same bytes. A value without a tag was written
//! before tags (it is read as the calling limiter's, and tagged on its next write), or by
//! `CL.THROTTLE`, which keeps redis-cell's format (one integer, nanoseconds). The sorted-set
//! kinds have no tag: a sliding log's members are `<score>:<n>` at their own score, a lease
//! set's are lease ids at their expiry.
//!
//! A call never writes over another kind's state: it answers `WRONGTYPE the key holds <that
//! command> state, not <its command> state` and changes nothing.

use std::ffi::CStr;

use crate::codec::error::ErrorReply;

/// The kinds of state, in `KINDS` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindow,
    Gcra,
    Throttle,
    SlidingLog,
    Leases,
}

/// Every kind: its tag (none for the untagged ones) and the command that writes it.
pub const KINDS: [(Kind, Option<&str>, &str); 8] = [
    (Kind::TokenBucket, Some("tb"), "RL.TOKENBUCKET"),
    (Kind::LeakyBucket, Some("lb"), "RL.LEAKYBUCKET"),
    (Kind::FixedWindow, Some("fw"), "RL.FIXEDWINDOW"),
    (Kind::SlidingWindow, Some("sw"), "RL.SLIDINGWINDOW"),
    (Kind::Gcra, Some("gcra"), "RL.GCRA"),
    (Kind::Throttle, None, "CL.THROTTLE"),
    (Kind::SlidingLog, None, "RL.SLIDINGLOG"),
    (Kind::Leases, None, "RL.ACQUIRE"),
];

/// A sorted set that no limiter wrote: every set of this module has an expiry.
pub const FOREIGN_ZSET: ErrorReply = ErrorReply(
    c"WRONGTYPE the key holds a sorted set without an expiry, which no rate limiter writes",
);
/// A sorted set with a score no lease could have: a time before `EARLIEST_LEASE_US` (a
/// leaderboard's points, a job queue's times in seconds or milliseconds).
pub const FOREIGN_LEASES: ErrorReply = ErrorReply(
    c"WRONGTYPE the key holds a sorted set whose scores are not lease expiries (Unix microseconds from 2020 on), which no rate limiter writes",
);
/// The earliest expiry a lease has: 2020-09-13 12:26:40 UTC in Unix microseconds, before the
/// module existed. A lease's score is its expiry (the server's clock plus the lease's length), so
/// a set of the module's never holds an earlier one, and a set that does is not a lease set.
pub const EARLIEST_LEASE_US: f64 = 1.6e15;
/// A hash of release 0.1's layout with fields its limiter never wrote.
pub const FOREIGN_HASH: ErrorReply =
    ErrorReply(c"WRONGTYPE the key holds a hash with fields no rate limiter writes");

const K: usize = KINDS.len();
const WIDTH: usize = 96;
const HOLDS: &[u8] = b"WRONGTYPE the key holds ";
const NOT: &[u8] = b" state, not ";
const STATE: &[u8] = b" state\0";

/// `WRONGTYPE the key holds <holder> state, not <caller> state`, NUL-terminated, for every pair.
static MESSAGES: [[[u8; WIDTH]; K]; K] = {
    let mut out = [[[0u8; WIDTH]; K]; K];
    let mut holder = 0;
    while holder < K {
        let mut caller = 0;
        while caller < K {
            let parts: [&[u8]; 5] = [
                HOLDS,
                KINDS[holder].2.as_bytes(),
                NOT,
                KINDS[caller].2.as_bytes(),
                STATE,
            ];
            let mut at = 0;
            let mut p = 0;
            while p < parts.len() {
                let part = parts[p];
                let mut i = 0;
                while i < part.len() {
                    out[holder][caller][at] = part[i];
                    at += 1;
                    i += 1;
                }
                p += 1;
            }
            caller += 1;
        }
        holder += 1;
    }
    out
};

fn index(kind: Kind) -> usize {
    KINDS.iter().position(|k| k.0 == kind).unwrap_or(0)
}

/// The tag a kind writes (empty for the untagged ones); a constant where the kind is one.
pub const fn tag(kind: Kind) -> &'static [u8] {
    let mut rest: &[(Kind, Option<&str>, &str)] = &KINDS;
    while let [(k, t, _), tail @ ..] = rest {
        if *k as usize == kind as usize {
            return match t {
                Some(t) => t.as_bytes(),
                None => b"",
            };
        }
        rest = tail;
    }
    b""
}

/// The kind whose tag is `word`, if any.
pub fn tagged(word: &[u8]) -> Option<Kind> {
    KINDS
        .iter()
        .find(|k| k.1.is_some_and(|t| t.as_bytes() == word))
        .map(|k| k.0)
}

/// The error a `caller` call answers on a key that `holder` wrote.
pub fn foreign(holder: Kind, caller: Kind) -> ErrorReply {
    let bytes = MESSAGES
        .get(index(holder))
        .and_then(|row| row.get(index(caller)))
        .map_or(&[0u8][..], |m| &m[..]);
    match CStr::from_bytes_until_nul(bytes) {
        Ok(text) => ErrorReply(text),
        Err(_) => FOREIGN_HASH,
    }
}

/// The rest of a stored value after `kind`'s tag and its space, when it starts with them: what
/// `split_tag` finds for such a value, by one comparison instead of a search of the tags.
#[inline(always)]
pub fn after_tag(value: &[u8], kind: Kind) -> Option<&[u8]> {
    let t = tag(kind);
    match value.get(t.len()..)?.split_first() {
        Some((b' ', rest)) if !t.is_empty() && value.starts_with(t) => Some(rest),
        _ => None,
    }
}

/// The first word of a stored value when it is a known tag, and the rest after its space.
pub fn split_tag(value: &[u8]) -> Option<(Kind, &[u8])> {
    // Numbers start with a digit, a sign or a point: a letter starts a tag.
    if !value.first().is_some_and(u8::is_ascii_lowercase) {
        return None;
    }
    let (word, rest) = match value.iter().position(|&b| b == b' ') {
        Some(at) => (value.get(..at)?, value.get(at + 1..)?),
        None => (value, &[][..]),
    };
    tagged(word).map(|kind| (kind, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_has_its_message() {
        for (holder, _, holder_name) in KINDS {
            for (caller, _, caller_name) in KINDS {
                assert_eq!(
                    foreign(holder, caller).message(),
                    format!("WRONGTYPE the key holds {holder_name} state, not {caller_name} state")
                );
            }
        }
        let longest = KINDS.iter().map(|k| k.2.len()).max().unwrap();
        assert!(HOLDS.len() + NOT.len() + STATE.len() + 2 * longest <= WIDTH);
    }

    #[test]
    fn tags_are_read_from_the_first_word() {
        assert_eq!(tag(Kind::TokenBucket), b"tb");
        assert_eq!(tag(Kind::Throttle), b"");
        assert_eq!(
            split_tag(b"tb 4.5 17"),
            Some((Kind::TokenBucket, &b"4.5 17"[..]))
        );
        assert_eq!(split_tag(b"gcra 17"), Some((Kind::Gcra, &b"17"[..])));
        assert_eq!(split_tag(b"gcra"), Some((Kind::Gcra, &b""[..])));
        for untagged in [
            &b"4.5 17"[..],
            b"-1 2",
            b"",
            b" tb 1",
            b"inf 5",
            b"TB 1 2",
            b"tbx 1",
        ] {
            assert_eq!(split_tag(untagged), None, "{untagged:?}");
        }
        for value in [
            &b"tb 4.5 17"[..],
            b"tb ",
            b"tb",
            b"tbx 1",
            b"gcra 17",
            b"gcra",
            b"gcra17",
            b" gcra 17",
            b"17",
            b"",
        ] {
            for (kind, _, _) in KINDS {
                let found = split_tag(value).filter(|(k, _)| *k == kind && value.contains(&b' '));
                assert_eq!(
                    after_tag(value, kind),
                    found.map(|(_, rest)| rest),
                    "{value:?}"
                );
            }
        }
        let tags: Vec<&str> = KINDS.iter().filter_map(|k| k.1).collect();
        let mut unique = tags.clone();
        unique.dedup();
        assert_eq!(unique, tags);
        assert!(
            tags.iter()
                .all(|t| t.bytes().all(|b| b.is_ascii_lowercase()))
        );
    }
}
