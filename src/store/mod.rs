//! Storage: what a limiter key holds (`Slot`), what a decision changes in it (`Effect`), and
//! the `Store` trait a storage layer implements over one open key: the Redis binding over the
//! module key API, the differential tests over an in-memory keyspace. The pipelines that read,
//! decide and write through it sit beside each other, one per shape of stored state:
//!
//! - `string`: limiters whose state is a few numbers in one string (buckets, windows, GCRA).
//! - `zset`: limiters whose state is a sorted set (the sliding log, concurrency leases).
//! - `all`: several limits of either shape decided at one instant, written all or none.
//!
//! No Redis types here, and nothing of the commands that call it.

use std::ffi::{CStr, c_void};
use std::sync::atomic::AtomicPtr;

use crate::codec::error::ErrorReply;
use crate::core::{Operation, Reply};

pub mod all;
pub mod kind;
pub mod string;
pub mod zset;

/// A field name of the earlier hash layout. `handle` is a slot where a storage layer may keep
/// its own representation of the name (the Redis binding keeps a `RedisModuleString` there,
/// created once).
pub struct FieldName {
    pub name: &'static CStr,
    pub handle: AtomicPtr<c_void>,
}

impl FieldName {
    pub const fn new(name: &'static CStr) -> Self {
        Self {
            name,
            handle: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

/// What a limiter key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot<'a> {
    Empty,
    /// A string: the stored value.
    Value(&'a [u8]),
    /// A hash: the layout of release 0.1 (`Store::legacy_fields` reads it).
    Hash,
    /// A sorted set (`Store::zset_*` read it).
    Zset,
    /// Any other type.
    WrongType,
}

/// The entries of a sorted set to add after removing old ones: `count` members
/// `<score>:<first_index>` .. `<score>:<first_index + count - 1>`, all at `score`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entries {
    /// Remove this many of the oldest entries first (those that left the window, at most a
    /// bounded number per call).
    pub trim: i64,
    pub score: f64,
    pub first_index: i64,
    pub count: i64,
}

/// What a decision changes in its key, with the key's new absolute expiry (Unix milliseconds).
/// A store applies it and propagates exactly it to replicas and the AOF.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Effect<'a> {
    /// The key becomes this string, whatever it held: `SET key value PXAT ms`.
    Set { value: &'a [u8], expire_at_ms: i64 },
    /// Entries leave and join a sorted set: `ZREMRANGEBYRANK key 0 trim-1` (when `trim` is
    /// above 0), `ZADD key score member ...`, and `PEXPIREAT key ms` when the expiry moves.
    Append { entries: Entries, expire_at_ms: i64 },
    /// The newest `count` entries of a sorted set leave, after the oldest `trim`:
    /// `ZREMRANGEBYRANK key 0 trim-1` (when `trim` is above 0), `ZREMRANGEBYRANK key -count
    /// -1`, and `PEXPIREAT key ms` when the expiry moves; none when `expire_at_ms` is `None`.
    Pop {
        trim: i64,
        count: i64,
        expire_at_ms: Option<i64>,
    },
    /// One lease of a sorted set is added, moved or removed, after the oldest `trim` (expired)
    /// leave: `ZREMRANGEBYRANK key 0 trim-1` (when `trim` is above 0), `ZADD key expiry id` (or
    /// `ZREM key id` when `expiry` is `None`), and `PEXPIREAT key ms` when the expiry moves.
    /// No expiry is set when `expire_at_ms` is `None` (the key keeps the one it has, or is gone
    /// when left empty).
    Lease {
        trim: i64,
        id: &'a [u8],
        expiry: Option<f64>,
        expire_at_ms: Option<i64>,
    },
}

/// Called with an entry's member and score; an error stops the read.
pub type EntryVisitor<'a> = dyn FnMut(&[u8], f64) -> Result<(), ErrorReply> + 'a;

/// One open key of a storage layer: read as any limiter needs, written through effects.
pub trait Store {
    fn read(&self) -> Result<Slot<'_>, ErrorReply>;
    /// The named fields of a hash key (`None` where a field is absent), into `out`.
    fn legacy_fields(
        &self,
        names: &[&'static FieldName],
        out: &mut [Option<Vec<u8>>],
    ) -> Result<(), ErrorReply>;
    /// Entries of a sorted set (0 for any other key).
    fn zset_len(&self) -> Result<i64, ErrorReply>;
    /// Entries of a sorted set with `min < score <= max` (`min <= score` when `min_inclusive`).
    fn zset_count(&self, min: f64, min_inclusive: bool, max: f64) -> Result<i64, ErrorReply>;
    /// Visits the entry `rank` places before the last one in Redis order (score, then member
    /// bytes): 0 is the last. `false` when there is no such entry.
    fn zset_from_last(&self, rank: i64, visit: &mut EntryVisitor<'_>) -> Result<bool, ErrorReply>;
    /// The score of a member of a sorted set (`None` when absent, or for any other key).
    fn zset_score(&self, member: &[u8]) -> Result<Option<f64>, ErrorReply>;
    /// Visits the oldest `count` entries of a sorted set in Redis order (fewer when it holds
    /// fewer).
    fn zset_first(&self, count: i64, visit: &mut EntryVisitor<'_>) -> Result<(), ErrorReply>;
    /// Fields of a hash (0 for any other key).
    fn hash_len(&self) -> Result<i64, ErrorReply>;
    /// Whether the key has an expiry.
    fn has_expiry(&self) -> Result<bool, ErrorReply>;
    /// Whether the call may write: refused (with Redis's own OOM error) when the server is out
    /// of memory. A call asks once, before its first write, so that several writes of one call
    /// are all made or none.
    fn writable(&self) -> Result<(), ErrorReply>;
    /// Applies the effect and propagates exactly it.
    fn apply(&mut self, effect: &Effect<'_>) -> Result<(), ErrorReply>;
}

/// Writes the member name `<score>:<index>` into `out` (cleared first). Scores are integers.
pub fn member_name(score: f64, index: i64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    let _ = write!(out, "{}:{}", crate::core::lua_integer(score), index);
}

/// A parsed call: the limiter's parameters, and what the call asks of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request<P> {
    pub params: P,
    pub op: Operation,
}

/// Opens the key of a call once its arguments have parsed (a call with bad arguments never
/// touches its key).
pub trait OpenStore {
    fn open(&mut self) -> Result<&mut dyn Store, ErrorReply>;
}

/// One limit of a multi-limit call: its parsed request and, once decided, what it read and its
/// pending write.
pub trait Limit {
    /// Reads the limit's key and decides the call's operation; the write is kept until `commit`.
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply>;
    /// The reply this limit gives to a peek (used when another limit denied the call), from what
    /// `decide` read.
    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply>;
    /// Whether `commit` writes.
    fn writes(&self) -> bool;
    /// The sorted-set entries the call may add or remove for this limit (its cost or settlement
    /// on a sliding log; 0 for a limiter of numbers), which a call bounds in total.
    fn entries(&self) -> i64 {
        0
    }
    /// Whether its state is a sorted set (a sliding log, a lease set), of which a call combines
    /// a bounded number.
    fn sorted_set(&self) -> bool {
        false
    }
    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply>;
    /// What the next `decide` asks of the limit (a partial grant of several limits decides them
    /// as peeks and consumptions in turn, `all::apply_all`); a limit without a cost (a lease, a
    /// settlement) keeps what it was built with.
    fn set_op(&mut self, _op: Operation) {}
}

/// A partial grant (`UPTO n`): the most units, at least 1 and at most `n`, that `decide` admits
/// now, decided as consumptions of the state the call read once. What a peek leaves (`g`, at most
/// `n`) is tried, then `g - 1` (a remaining count rounded up by floating point), then 1; the
/// reply of the first that admits carries `granted`, and when none does the reply is a cost of 1
/// denied (`granted` 0, and the wait for one unit). `decide` returns a reply and what to write;
/// the write of the grant is returned with its reply. The Lua twins' `grant` tries the same.
pub fn grant<W, E>(
    n: f64,
    mut decide: impl FnMut(Operation) -> Result<(Reply, W), E>,
) -> Result<(Reply, W), E> {
    let (peek, _) = decide(Operation::Peek)?;
    let left = peek.remaining as f64;
    let g = if left < n { left } else { n };
    // Tried in decreasing order, each once.
    let mut tried = 0.0;
    let mut denied = None;
    for t in [g, g - 1.0, 1.0] {
        if t < 1.0 || t == tried {
            continue;
        }
        tried = t;
        let (reply, write) = decide(Operation::Consume(t))?;
        if reply.allowed {
            return Ok((reply.granting(crate::core::lua_integer(t)), write));
        }
        denied = Some((reply, write));
    }
    match denied {
        Some((reply, write)) => Ok((reply.granting(0), write)),
        // Not reached: 1 is always tried.
        None => decide(Operation::Consume(1.0)).map(|(r, w)| (r.granting(0), w)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A limiter that admits up to `admits` units and reports `reports` remaining to a peek.
    fn limiter(
        reports: i64,
        admits: f64,
    ) -> impl FnMut(Operation) -> Result<(Reply, f64), Infallible> {
        move |op| {
            let units = op.units();
            let allowed = units <= admits;
            let reply = Reply {
                allowed,
                remaining: if allowed {
                    reports - units as i64
                } else {
                    reports
                },
                retry_after_ms: if allowed { 0 } else { 7 },
                reset_after_ms: 9,
                limit: 10,
                granted: None,
            };
            Ok((reply, if allowed { units } else { -1.0 }))
        }
    }

    fn granted(reports: i64, admits: f64, n: f64) -> (bool, Option<i64>, f64) {
        let Ok((reply, write)) = grant(n, limiter(reports, admits));
        (reply.allowed, reply.granted, write)
    }

    #[test]
    fn a_grant_takes_what_a_peek_leaves_up_to_n() {
        assert_eq!(granted(10, 10.0, 3.0), (true, Some(3), 3.0));
        assert_eq!(granted(2, 2.0, 3.0), (true, Some(2), 2.0));
        assert_eq!(granted(1, 1.0, 1e15), (true, Some(1), 1.0));
    }

    #[test]
    fn a_remaining_count_one_too_high_is_tried_one_lower_then_one() {
        assert_eq!(granted(5, 4.0, 9.0), (true, Some(4), 4.0));
        assert_eq!(granted(5, 1.0, 9.0), (true, Some(1), 1.0));
    }

    #[test]
    fn nothing_left_is_the_denial_of_one_unit() {
        let Ok((reply, write)) = grant(4.0, limiter(0, 0.0));
        assert_eq!(
            (reply.allowed, reply.granted, reply.retry_after_ms, write),
            (false, Some(0), 7, -1.0)
        );
        // A peek that reports too little is not trusted past one unit either.
        assert_eq!(granted(0, 3.0, 4.0), (true, Some(1), 1.0));
    }
}
