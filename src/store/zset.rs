//! The pipeline of every limiter whose state is one sorted set, over `Store`: the sliding log
//! (one entry per admitted unit) and concurrency leases (one entry per lease id).
//!
//! read a few counts and entries (O(log n) each) -> decide -> one `Effect::Append` (a sliding
//! log), `Effect::Pop` (its refund) or `Effect::Lease` (concurrency leases). Every entry read is
//! checked against what the module writes, and so is every old entry a write removes, before
//! anything is written: a set the module did not write (no expiry, members or scores it would
//! not write, another kind's entries) is an error, never trimmed nor repaired.

use crate::codec::error::{ErrorReply, WRONGTYPE};
use crate::codec::number::{parse_integer, trunc};
use crate::codec::stored::{MAX_TIMESTAMP_US, SKEW_US};
use crate::core::concurrency::{self, Leases, MAX_LEASE_US, Seen};
use crate::core::sliding_log::{
    self as sliding_log_core, Log, Outcome, SettleOutcome, Settlement, View, Write, decide, view,
};
use crate::core::{Operation, Reply};
use crate::store::kind::{EARLIEST_LEASE_US, FOREIGN_LEASES, FOREIGN_ZSET, Kind, foreign};
use crate::store::{Effect, Entries, Limit, Request, Slot, Store, grant};

/// A parsed `RL.SLIDINGLOG` call: the log's limit and window, and what the call asks (a cost of
/// 0 is a peek).
pub type SlidingLogRequest = Request<sliding_log_core::Params>;

/// A parsed acquire: the limit and lease length, what the call asks (a peek inside `RL.ALL`
/// with `COST 0`), and the lease id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AcquireRequest<'a> {
    pub params: concurrency::Params,
    pub op: Operation,
    pub id: &'a [u8],
}

/// Longest lease id in bytes.
pub const MAX_ID_LEN: usize = 128;

/// The most sliding-log entries one call adds or removes through its cost or settlement (the
/// old entries a write trims come on top, as many again at most, or `TRIM_AT_LEAST`): each is a
/// sorted-set write, so this bounds a call's time (under 10 ms here).
pub const MAX_ENTRIES_PER_CALL: i64 = 1000;

/// The largest `limit` of a sorted-set limiter (a sliding log, a lease set): a key never holds
/// more entries. A key that expires is freed by the command that finds it, entry by entry (unless
/// the server frees expired keys in the background, `lazyfree-lazy-expire`): about 1.2 ms for
/// this many entries on Redis 7.0 here.
pub const MAX_SET_LIMIT: f64 = 10_000.0;

/// The most sorted-set limits (`SLIDINGLOG`, `CONCURRENCY`) one `RL.ALL` or `RL.SETTLE` combines:
/// their keys together hold at most this many times `MAX_SET_LIMIT` entries.
pub const MAX_SET_LIMITS_PER_CALL: usize = 4;

pub const CORRUPT_SCORE: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: sorted set score is not a valid timestamp");
pub const CORRUPT_LOG_MEMBER: ErrorReply =
    ErrorReply(c"ERR corrupt rate limiter state: sorted set member is not '<score>:<n>'");
pub const CORRUPT_LEASE_MEMBER: ErrorReply = ErrorReply(
    c"ERR corrupt rate limiter state: sorted set member is not a lease id of 1 to 128 bytes",
);
/// An entry's time later than any call could have written it.
pub const CORRUPT_AHEAD: ErrorReply = ErrorReply(
    c"ERR corrupt rate limiter state: sorted set score is further ahead of the server's clock than any call writes",
);

/// A score as the module writes it: an integer in `[0, 2^53]`.
fn check_score(score: f64) -> Result<(), ErrorReply> {
    if score >= 0.0 && score <= MAX_TIMESTAMP_US && score == trunc(score) {
        Ok(())
    } else {
        Err(CORRUPT_SCORE)
    }
}

/// Whether a member is `<digits>:<digits>` whose first part is `score`: a sliding log's entry.
/// The ':' is looked for from the end (the index is a few digits, the time sixteen), and the
/// time's digits are checked by `parse_integer`, which reads nothing else once the first byte
/// is a digit (no sign).
fn is_log_member(member: &[u8], score: f64) -> bool {
    let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    match member.iter().rposition(|&c| c == b':') {
        Some(at) => match (member.get(..at), member.get(at + 1..)) {
            (Some(time), Some(index)) => {
                time.first().is_some_and(u8::is_ascii_digit)
                    && digits(index)
                    && parse_integer(time) == Some(score)
            }
            _ => false,
        },
        None => false,
    }
}

/// One stored log entry: an integer score in `[0, 2^53]` and the member `<digits>:<digits>`
/// whose first part is that score.
pub fn check_entry(member: &[u8], score: f64) -> Result<(), ErrorReply> {
    check_score(score)?;
    if is_log_member(member, score) {
        Ok(())
    } else {
        Err(CORRUPT_LOG_MEMBER)
    }
}

/// One stored lease: an integer expiry in `[0, 2^53]` and an id of 1 to 128 bytes.
pub fn check_lease(member: &[u8], score: f64) -> Result<(), ErrorReply> {
    check_expiry(score)?;
    if member.is_empty() || member.len() > MAX_ID_LEN {
        return Err(CORRUPT_LEASE_MEMBER);
    }
    Ok(())
}

/// A stored expiry: an integer in `[0, 2^53]`.
pub fn check_expiry(score: f64) -> Result<(), ErrorReply> {
    check_score(score)
}

/// An entry a sliding-log call reads at `now`: a log entry no later than the skew allows, else
/// the error that says what the key holds (a member without ':' that a lease set could hold is a
/// lease set's).
fn read_log_entry(member: &[u8], score: f64, now: f64) -> Result<(), ErrorReply> {
    match check_entry(member, score) {
        // A member without ':' (a log's has one) that a lease set could hold.
        Err(e)
            if e == CORRUPT_LOG_MEMBER
                && !member.contains(&b':')
                && check_lease(member, score).is_ok() =>
        {
            Err(foreign(Kind::Leases, Kind::SlidingLog))
        }
        Err(e) => Err(e),
        Ok(()) if score > now + SKEW_US => Err(CORRUPT_AHEAD),
        Ok(()) => Ok(()),
    }
}

/// An entry a lease call reads at `now`: a lease expiring no earlier than `EARLIEST_LEASE_US`
/// and no later than the longest lease and the skew allow, else the error that says what the
/// key holds.
fn read_lease_entry(member: &[u8], score: f64, now: f64) -> Result<(), ErrorReply> {
    check_lease(member, score)?;
    if is_log_member(member, score) {
        return Err(foreign(Kind::SlidingLog, Kind::Leases));
    }
    if score < EARLIEST_LEASE_US {
        return Err(FOREIGN_LEASES);
    }
    if score > now + MAX_LEASE_US + SKEW_US {
        return Err(CORRUPT_AHEAD);
    }
    Ok(())
}

/// Checks the oldest `count` entries, which a write is about to remove, with `read`.
fn check_oldest<S: Store + ?Sized>(
    store: &S,
    count: i64,
    now: f64,
    read: fn(&[u8], f64, f64) -> Result<(), ErrorReply>,
) -> Result<(), ErrorReply> {
    if count <= 0 {
        return Ok(());
    }
    store.zset_first(count, &mut |member, score| read(member, score, now))
}

/// A sorted set this module may read: it has an expiry, as every set the module writes has.
fn ours<S: Store + ?Sized>(store: &S) -> Result<(), ErrorReply> {
    if store.has_expiry()? {
        Ok(())
    } else {
        Err(FOREIGN_ZSET)
    }
}

/// A stored sorted set seen as a sliding log at `now`: every entry it returns is checked.
struct StoredLog<'a, S: Store + ?Sized> {
    store: &'a S,
    now: f64,
}

impl<S: Store + ?Sized> Log for StoredLog<'_, S> {
    type Error = ErrorReply;

    fn entries(&self) -> Result<i64, ErrorReply> {
        self.store.zset_len()
    }

    fn count_above(&self, score: f64) -> Result<i64, ErrorReply> {
        self.store.zset_count(score, false, f64::INFINITY)
    }

    fn count_at(&self, score: f64) -> Result<i64, ErrorReply> {
        self.store.zset_count(score, true, score)
    }

    fn score_from_newest(&self, rank: i64) -> Result<Option<f64>, ErrorReply> {
        let mut found = None;
        let now = self.now;
        self.store.zset_from_last(rank, &mut |member, score| {
            read_log_entry(member, score, now)?;
            found = Some(score);
            Ok(())
        })?;
        Ok(found)
    }
}

fn stored_log<S: Store + ?Sized>(store: &S, now_us: i64) -> StoredLog<'_, S> {
    StoredLog {
        store,
        now: now_us as f64,
    }
}

/// What a call knows of its key before deciding: WRONGTYPE for a key that is not a sorted set.
fn load<S: Store + ?Sized>(
    store: &S,
    request: &SlidingLogRequest,
    now_us: i64,
) -> Result<View, ErrorReply> {
    match store.read()? {
        Slot::Empty => Ok(View::default()),
        Slot::Zset => {
            ours(store)?;
            view(&request.params, now_us, &stored_log(store, now_us))
        }
        Slot::Value(_) | Slot::Hash | Slot::WrongType => Err(WRONGTYPE),
    }
}

/// The write of a decided log call, once the entries it removes are checked.
fn checked_write<S: Store + ?Sized>(
    store: &S,
    write: Option<Write>,
    now_us: i64,
) -> Result<Option<Write>, ErrorReply> {
    if let Some(w) = &write {
        check_oldest(store, w.trim, now_us as f64, read_log_entry)?;
    }
    Ok(write)
}

fn append<S: Store + ?Sized>(store: &mut S, w: &Write) -> Result<(), ErrorReply> {
    store.apply(&Effect::Append {
        entries: Entries {
            trim: w.trim,
            score: w.score_us,
            first_index: w.first_index,
            count: w.count,
        },
        expire_at_ms: w.expire_at_ms,
    })
}

/// Decides a sliding-log call's operation from its view: a partial grant as the consumptions of
/// `store::grant`.
fn decide_log<S: Store + ?Sized>(
    request: &SlidingLogRequest,
    now_us: i64,
    seen: &View,
    log: &StoredLog<'_, S>,
) -> Result<Outcome, ErrorReply> {
    match request.op {
        Operation::UpTo(n) => {
            let (reply, write) = grant(n, |op| {
                decide(&request.params, op, now_us, seen, log).map(|o| (o.reply, o.write))
            })?;
            Ok(Outcome { reply, write })
        }
        op => decide(&request.params, op, now_us, seen, log),
    }
}

/// Reads, decides and stores for one `RL.SLIDINGLOG` call whose arguments are already parsed.
pub fn apply<S: Store + ?Sized>(
    store: &mut S,
    request: &SlidingLogRequest,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let seen = load(store, request, now_us)?;
    let out = decide_log(request, now_us, &seen, &stored_log(&*store, now_us))?;
    if let Some(w) = checked_write(store, out.write, now_us)? {
        store.writable()?;
        append(store, &w)?;
    }
    Ok(out.reply)
}

/// A sliding log inside `RL.ALL`.
pub struct LogLimit {
    request: SlidingLogRequest,
    seen: View,
    out: Option<Outcome>,
}

impl LogLimit {
    pub fn new(request: SlidingLogRequest) -> Self {
        Self {
            request,
            seen: View::default(),
            out: None,
        }
    }
}

impl Limit for LogLimit {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        self.seen = load(store, &self.request, now_us)?;
        let mut out = decide_log(
            &self.request,
            now_us,
            &self.seen,
            &stored_log(store, now_us),
        )?;
        out.write = checked_write(store, out.write, now_us)?;
        self.out = Some(out);
        Ok(out.reply)
    }

    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        // Only a limit that admitted is asked: its entries fit, so a peek reads nothing more.
        let out = decide(
            &self.request.params,
            Operation::Peek,
            now_us,
            &self.seen,
            &stored_log(store, now_us),
        )?;
        Ok(out.reply)
    }

    fn writes(&self) -> bool {
        self.out.is_some_and(|o| o.write.is_some())
    }

    fn entries(&self) -> i64 {
        crate::core::lua_integer(self.request.op.units())
    }

    fn sorted_set(&self) -> bool {
        true
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match self.out.and_then(|o| o.write) {
            Some(w) => append(store, &w),
            None => Ok(()),
        }
    }

    fn set_op(&mut self, op: Operation) {
        self.request.op = op;
    }
}

/// A sliding log inside `RL.SETTLE`.
pub struct LogSettle {
    request: SlidingLogRequest,
    delta: i64,
    out: Option<SettleOutcome>,
}

impl LogSettle {
    /// `delta` units refunded (negative) or charged (positive).
    pub fn new(request: SlidingLogRequest, delta: f64) -> Self {
        Self {
            request,
            delta: crate::core::lua_integer(delta),
            out: None,
        }
    }
}

impl Limit for LogSettle {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        let seen = load(store, &self.request, now_us)?;
        let out = sliding_log_core::settle(
            &self.request.params,
            self.delta,
            now_us,
            &seen,
            &stored_log(store, now_us),
        )?;
        let trim = match out.write {
            Some(Settlement::Add(w)) => w.trim,
            Some(Settlement::Drop { trim, .. }) => trim,
            None => 0,
        };
        check_oldest(store, trim, now_us as f64, read_log_entry)?;
        self.out = Some(out);
        Ok(out.reply)
    }

    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        // A settlement always admits; no denial asks for a peek.
        match &self.out {
            Some(out) => Ok(out.reply),
            None => {
                let seen = load(store, &self.request, now_us)?;
                Ok(sliding_log_core::settle(
                    &self.request.params,
                    0,
                    now_us,
                    &seen,
                    &stored_log(store, now_us),
                )?
                .reply)
            }
        }
    }

    fn writes(&self) -> bool {
        self.out.is_some_and(|o| o.write.is_some())
    }

    fn entries(&self) -> i64 {
        self.delta.saturating_abs()
    }

    fn sorted_set(&self) -> bool {
        true
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match self.out.and_then(|o| o.write) {
            Some(Settlement::Add(w)) => append(store, &w),
            Some(Settlement::Drop {
                trim,
                count,
                expire_at_ms,
            }) => store.apply(&Effect::Pop {
                trim,
                count,
                expire_at_ms,
            }),
            None => Ok(()),
        }
    }
}

/// A stored sorted set seen as the leases of one lease id at `now`: every entry it returns is
/// checked.
struct StoredLeases<'a, S: Store + ?Sized> {
    store: &'a S,
    id: &'a [u8],
    now: f64,
}

impl<S: Store + ?Sized> Leases for StoredLeases<'_, S> {
    type Error = ErrorReply;

    fn entries(&self) -> Result<i64, ErrorReply> {
        self.store.zset_len()
    }

    fn live(&self, now: f64) -> Result<i64, ErrorReply> {
        self.store.zset_count(now, false, f64::INFINITY)
    }

    fn own_expiry(&self) -> Result<Option<f64>, ErrorReply> {
        let score = self.store.zset_score(self.id)?;
        if let Some(s) = score {
            read_lease_entry(self.id, s, self.now)?;
        }
        Ok(score)
    }

    fn back_from_newest(&self, rank: i64) -> Result<Option<Seen>, ErrorReply> {
        let mut found = None;
        let now = self.now;
        self.store.zset_from_last(rank, &mut |member, score| {
            read_lease_entry(member, score, now)?;
            found = Some(Seen {
                expiry: score,
                own: member == self.id,
            });
            Ok(())
        })?;
        Ok(found)
    }
}

fn stored_leases<'a, S: Store + ?Sized>(
    store: &'a S,
    id: &'a [u8],
    now_us: i64,
) -> StoredLeases<'a, S> {
    StoredLeases {
        store,
        id,
        now: now_us as f64,
    }
}

/// What a lease call knows of its key before deciding: WRONGTYPE for a key that is not a
/// sorted set.
fn load_leases<S: Store + ?Sized>(
    store: &S,
    id: &[u8],
    now_us: i64,
) -> Result<concurrency::View, ErrorReply> {
    match store.read()? {
        Slot::Empty => Ok(concurrency::View::default()),
        Slot::Zset => {
            ours(store)?;
            concurrency::view(now_us, &stored_leases(store, id, now_us))
        }
        Slot::Value(_) | Slot::Hash | Slot::WrongType => Err(WRONGTYPE),
    }
}

/// The write of a decided acquire, once the leases it removes are checked.
fn checked_lease<S: Store + ?Sized>(
    store: &S,
    out: concurrency::Outcome,
    now_us: i64,
) -> Result<concurrency::Outcome, ErrorReply> {
    if let Some(w) = &out.write {
        check_oldest(store, w.trim, now_us as f64, read_lease_entry)?;
    }
    Ok(out)
}

fn commit_lease<S: Store + ?Sized>(
    store: &mut S,
    id: &[u8],
    out: &concurrency::Outcome,
) -> Result<(), ErrorReply> {
    match out.write {
        Some(w) => store.apply(&Effect::Lease {
            trim: w.trim,
            id,
            expiry: Some(w.expiry_us),
            expire_at_ms: Some(w.expire_at_ms),
        }),
        None => Ok(()),
    }
}

/// Reads, decides and stores for one `RL.ACQUIRE` call whose arguments are already parsed.
pub fn acquire<S: Store + ?Sized>(
    store: &mut S,
    request: &AcquireRequest<'_>,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let seen = load_leases(store, request.id, now_us)?;
    let leases = stored_leases(&*store, request.id, now_us);
    let out = concurrency::decide(&request.params, request.op, now_us, &seen, &leases)?;
    let out = checked_lease(store, out, now_us)?;
    if out.write.is_some() {
        store.writable()?;
        commit_lease(store, request.id, &out)?;
    }
    Ok(out.reply)
}

/// One `RL.RELEASE` call whose lease id is already parsed: whether a live lease was released.
pub fn release<S: Store + ?Sized>(
    store: &mut S,
    id: &[u8],
    now_us: i64,
) -> Result<bool, ErrorReply> {
    let seen = load_leases(store, id, now_us)?;
    let (released, write) = concurrency::release(now_us, &seen);
    if let Some(w) = write {
        check_oldest(store, w.trim, now_us as f64, read_lease_entry)?;
        store.writable()?;
        store.apply(&Effect::Lease {
            trim: w.trim,
            id,
            expiry: None,
            expire_at_ms: w.expire_at_ms,
        })?;
    }
    Ok(released)
}

/// A concurrency limit inside `RL.ALL`: `CONCURRENCY limit lease_sec`, for the call's `LEASE id`.
pub struct LeaseLimit {
    params: concurrency::Params,
    op: Operation,
    id: Vec<u8>,
    seen: concurrency::View,
    out: Option<concurrency::Outcome>,
}

impl LeaseLimit {
    /// One lease for `id` (a peek when `op` is).
    pub fn new(params: concurrency::Params, op: Operation, id: &[u8]) -> Self {
        Self {
            params,
            op,
            id: id.to_vec(),
            seen: concurrency::View::default(),
            out: None,
        }
    }
}

impl Limit for LeaseLimit {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        self.seen = load_leases(store, &self.id, now_us)?;
        let leases = stored_leases(store, &self.id, now_us);
        let out = concurrency::decide(&self.params, self.op, now_us, &self.seen, &leases)?;
        let out = checked_lease(store, out, now_us)?;
        self.out = Some(out);
        Ok(out.reply)
    }

    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        // Only a limit that admitted is asked, so a peek reads nothing more.
        let leases = stored_leases(store, &self.id, now_us);
        let out = concurrency::decide(&self.params, Operation::Peek, now_us, &self.seen, &leases)?;
        Ok(out.reply)
    }

    fn sorted_set(&self) -> bool {
        true
    }

    fn writes(&self) -> bool {
        self.out.is_some_and(|o| o.write.is_some())
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match &self.out {
            Some(out) => commit_lease(store, &self.id, out),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_entries() {
        assert_eq!(check_entry(b"1700000000000000:0", 1.7e15), Ok(()));
        assert_eq!(check_entry(b"0:12", -0.0), Ok(()));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1.5, 9_007_199_254_740_994.0] {
            assert_eq!(check_entry(b"1:0", bad), Err(CORRUPT_SCORE), "{bad}");
        }
        for bad in [
            &b"17:0"[..],
            b"1",
            b"1:",
            b":0",
            b"1:0:0",
            b"1:x",
            b"+1:0",
            b" 1:0",
            b"1:-0",
        ] {
            assert_eq!(
                check_entry(bad, 1.0),
                Err(CORRUPT_LOG_MEMBER),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// `is_log_member` against its definition (the first ':' splits two runs of digits, the
    /// first of them `score`), on every member of up to six bytes of `0 1 7 : + - x` and on
    /// 16-digit times.
    #[test]
    fn log_members_are_told_as_defined() {
        let defined = |member: &[u8], score: f64| {
            let digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
            let Some(at) = member.iter().position(|&c| c == b':') else {
                return false;
            };
            let (time, index) = (&member[..at], &member[at + 1..]);
            digits(time)
                && digits(index)
                && std::str::from_utf8(time)
                    .ok()
                    .and_then(|t| t.parse::<f64>().ok())
                    == Some(score)
        };
        let alphabet = b"017:+-x";
        let mut member = Vec::new();
        for len in 0..=6u32 {
            for mut n in 0..alphabet.len().pow(len) {
                member.clear();
                for _ in 0..len {
                    member.push(alphabet[n % alphabet.len()]);
                    n /= alphabet.len();
                }
                for score in [0.0, 1.0, 7.0, 10.0, 17.0, 71.0, 107.0] {
                    assert_eq!(
                        is_log_member(&member, score),
                        defined(&member, score),
                        "{:?} {score}",
                        String::from_utf8_lossy(&member)
                    );
                }
            }
        }
        for member in [
            &b"1800000000000000:0"[..],
            b"1800000000000000:12",
            b"1800000000000000:",
            b"180000000000000x:1",
            b"1800000000000000:1:2",
            b"1800000000000001:0",
        ] {
            assert_eq!(is_log_member(member, 1.8e15), defined(member, 1.8e15));
        }
    }

    #[test]
    fn stored_leases() {
        assert_eq!(check_lease(b"a", 1.7e15), Ok(()));
        assert_eq!(check_lease(&[0xff; 128], 0.0), Ok(()));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1.5, 9_007_199_254_740_994.0] {
            assert_eq!(check_lease(b"a", bad), Err(CORRUPT_SCORE), "{bad}");
        }
        assert_eq!(check_lease(b"", 1.0), Err(CORRUPT_LEASE_MEMBER));
        assert_eq!(check_lease(&[b'a'; 129], 1.0), Err(CORRUPT_LEASE_MEMBER));
    }

    #[test]
    fn entries_of_another_kind_or_too_far_ahead_are_refused() {
        let now = 1.8e15;
        assert_eq!(read_log_entry(b"1800000000000000:3", now, now), Ok(()));
        assert_eq!(
            read_log_entry(b"job-7", now, now),
            Err(foreign(Kind::Leases, Kind::SlidingLog))
        );
        assert_eq!(read_log_entry(b"", now, now), Err(CORRUPT_LOG_MEMBER));
        let ahead = now + SKEW_US;
        assert_eq!(read_log_entry(b"1800000060000000:0", ahead, now), Ok(()));
        assert_eq!(
            read_log_entry(b"1800000060000001:0", ahead + 1.0, now),
            Err(CORRUPT_AHEAD)
        );
        assert_eq!(read_lease_entry(b"job-7", now + 5e6, now), Ok(()));
        assert_eq!(
            read_lease_entry(b"1800000000000000:3", now, now),
            Err(foreign(Kind::SlidingLog, Kind::Leases))
        );
        let latest = now + MAX_LEASE_US + SKEW_US;
        assert_eq!(read_lease_entry(b"a", latest, now), Ok(()));
        assert_eq!(
            read_lease_entry(b"a", latest + 1.0, now),
            Err(CORRUPT_AHEAD)
        );
    }
}
