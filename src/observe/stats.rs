//! What every call came to, seen from the one place every command goes through (the binding's
//! entry point): `observe` gets the command's counters and name, the key the outcome is about
//! and the outcome. It keeps the per-command counters of the module's INFO section and feeds the
//! most-denied keys (`top`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use std::ffi::CStr;

use crate::codec::error::ErrorReply;
use crate::codec::owner::Owned;
use crate::observe::top::Top;

/// The kinds of error replies, as INFO counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad arguments: arity, numbers, ranges, `RL.ALL`'s grammar.
    Args,
    /// A key of another type.
    WrongType,
    /// Stored state that is not what the module writes.
    Corrupt,
    /// Refused over `maxmemory`.
    Oom,
    /// A bug: a panic caught at the entry point, or a module API missing.
    Internal,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::Args,
        ErrorKind::WrongType,
        ErrorKind::Corrupt,
        ErrorKind::Oom,
        ErrorKind::Internal,
    ];

    pub fn of(error: &ErrorReply) -> ErrorKind {
        let m = error.message();
        if m.starts_with("WRONGTYPE") {
            ErrorKind::WrongType
        } else if m.starts_with("ERR corrupt rate limiter state") {
            ErrorKind::Corrupt
        } else if m.starts_with("OOM") {
            ErrorKind::Oom
        } else if m.starts_with("ERR internal error") || m.starts_with("ERR this Redis server") {
            ErrorKind::Internal
        } else {
            ErrorKind::Args
        }
    }

    /// The INFO field name.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Args => "args",
            ErrorKind::WrongType => "wrongtype",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Oom => "oom",
            ErrorKind::Internal => "internal",
        }
    }
}

/// What one call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Admitted,
    Denied,
    Error(ErrorKind),
}

#[derive(Debug, Default)]
pub struct CommandStats {
    pub calls: AtomicU64,
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub errors: AtomicU64,
    /// Errors by kind, in `ErrorKind::ALL` order.
    pub errors_by_kind: [AtomicU64; 5],
}

/// Adds one. Redis runs commands one at a time (module threads only with the global lock), so a
/// plain load and store is enough and avoids a locked read-modify-write on the hot path.
fn bump(counter: &AtomicU64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// Slots of the most-denied keys when the module loads (`ratelimit.top-slots`).
pub const DEFAULT_TOP_SLOTS: usize = 128;
/// The most slots `ratelimit.top-slots` takes: listing and resizing cost O(slots), and at this
/// many either stays within a few milliseconds.
pub const MAX_TOP_SLOTS: usize = 10_000;

/// `RL.TOP`'s keys, kept by the server's main thread (`codec::owner`), made with their first use at
/// the default size (`ratelimit.top-slots` resizes them). A plain cell where a mutex would take and
/// release a lock on every denial: two locked instructions, which cost a denial of `RL.GCRA` 6-11%
/// of its time on this project's benchmark machine (docs/benchmarks.md). Another thread (a module
/// thread calling a limiter through `RM_Call` with the server's lock held) gets nothing: its
/// denials are not tracked. The `RefCell` refuses a second borrow from inside the first.
static TOP: Owned<RefCell<Option<Top>>> = Owned::new(RefCell::new(None));

/// The most-denied keys (`RL.TOP`), for reading or changing, on the thread that keeps them
/// (`TOP`). Elsewhere, or called again from inside `f` (which nothing does), it returns
/// the default without calling `f` (a panic there would fail the command).
pub fn with_top<R: Default>(f: impl FnOnce(&mut Top) -> R) -> R {
    match TOP.get().map(RefCell::try_borrow_mut) {
        Some(Ok(mut top)) => f(top.get_or_insert_with(|| Top::new(DEFAULT_TOP_SLOTS))),
        _ => R::default(),
    }
}

/// What `RL.TOP` holds: its slots, the keys it tracks and the bytes its pools take.
pub fn top_figures() -> (usize, usize, usize) {
    with_top(|t| (t.slots(), t.len(), t.bytes()))
}

/// The observation hook: every call of every command, and how to get the key its outcome is
/// about (the command's key; for `RL.ALL` the key of the limit that denied, else the first), its
/// database and the time (Unix ms), read only when needed: a limit's denial (`is_limit`) counts for the
/// most-denied keys.
pub fn observe<'a>(
    stats: &CommandStats,
    command: &'static CStr,
    key: impl FnOnce() -> Option<&'a [u8]>,
    db: impl FnOnce() -> i32,
    now_ms: impl FnOnce() -> i64,
    outcome: Outcome,
    is_limit: bool,
) {
    stats.record(outcome);
    if outcome == Outcome::Denied && is_limit {
        with_top(|top| {
            if top.slots() > 0
                && let Some(key) = key()
            {
                top.denied(key, db(), command, now_ms());
            }
        });
    }
}

impl CommandStats {
    pub const fn new() -> Self {
        Self {
            calls: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            errors_by_kind: [const { AtomicU64::new(0) }; 5],
        }
    }

    pub fn record(&self, outcome: Outcome) {
        bump(&self.calls);
        match outcome {
            Outcome::Admitted => bump(&self.allowed),
            Outcome::Denied => bump(&self.denied),
            Outcome::Error(kind) => {
                bump(&self.errors);
                if let Some(i) = ErrorKind::ALL.iter().position(|k| *k == kind)
                    && let Some(counter) = self.errors_by_kind.get(i)
                {
                    bump(counter);
                }
            }
        }
    }

    /// `calls, allowed, denied, errors`, then the errors by kind.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = vec![
            ("calls", get(&self.calls)),
            ("allowed", get(&self.allowed)),
            ("denied", get(&self.denied)),
            ("errors", get(&self.errors)),
        ];
        for (kind, counter) in ErrorKind::ALL.iter().zip(&self.errors_by_kind) {
            out.push((kind.label(), get(counter)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_thread_that_claimed_top_reaches_it() {
        // The owner is whichever test thread claims first (`codec::owner`): what holds either way.
        if !crate::codec::owner::claim() {
            assert_eq!(
                with_top(|t| t.slots()),
                0,
                "a thread that does not own gets nothing"
            );
            return;
        }
        with_top(|t| t.denied(b"k", 0, c"RL.GCRA", 1));
        assert_eq!(with_top(|t| t.len()), 1);
        let elsewhere = std::thread::spawn(|| {
            crate::codec::owner::claim();
            with_top(|t| t.denied(b"other", 0, c"RL.GCRA", 2));
            with_top(|t| (t.slots(), t.len()))
        })
        .join()
        .unwrap();
        assert_eq!(elsewhere, (0, 0));
        assert_eq!(with_top(|t| t.len()), 1);
        // A second borrow from inside the first gets the default, not a panic.
        assert_eq!(with_top(|_| with_top(|t| t.len())), 0);
    }

    #[test]
    fn errors_are_counted_by_kind() {
        let s = CommandStats::new();
        for e in [
            crate::codec::error::WRONGTYPE,
            ErrorReply(c"ERR corrupt rate limiter state: field 'ts' is not a valid timestamp"),
            ErrorReply(c"OOM command not allowed when used memory > 'maxmemory'."),
            ErrorReply(c"ERR cost must be an integer"),
            ErrorReply(c"ERR cost must be an integer"),
        ] {
            s.record(Outcome::Error(ErrorKind::of(&e)));
        }
        s.record(Outcome::Admitted);
        s.record(Outcome::Denied);
        assert_eq!(
            s.snapshot(),
            [
                ("calls", 7),
                ("allowed", 1),
                ("denied", 1),
                ("errors", 5),
                ("args", 2),
                ("wrongtype", 1),
                ("corrupt", 1),
                ("oom", 1),
                ("internal", 0),
            ]
        );
    }
}
