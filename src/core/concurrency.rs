//! Concurrency leases: at most `limit` holders at once, each for a bounded time.
//!
//! Every lease is one entry: its id and the time it expires (Unix microseconds). A lease counts
//! while `now < expiry`. An acquire by an id that holds a live lease renews it to `now + lease`
//! and is admitted without taking a second slot; any other acquire is admitted while fewer than
//! `limit` leases are live. A release frees a live lease at once. Expired leases stop counting at
//! their expiry and are removed by the next call that writes; denials, peeks and releases of no
//! live lease change nothing.
//!
//! A call never reads every lease: it asks the stored set (`Leases`) for its size, the number of
//! live leases, the call's own lease, the newest one or two entries and, on a denial, the lease
//! whose expiry frees a slot; a sorted set answers each in O(log n).
//!
//! Times are integer microseconds below 2^53 and the lease a whole number of milliseconds, so
//! every comparison and every rounded-up millisecond below is exact in doubles, as in the Lua
//! twin.

use super::{Operation, Reply, trim_count};
use crate::codec::number::ceil;

/// The longest lease, in microseconds (10^7 seconds, about 116 days).
pub const MAX_LEASE_US: f64 = 1e13;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub limit: i64,
    pub lease_ms: f64,
    /// `lease_ms * 1000`.
    pub lease_us: f64,
}

/// An entry as a call sees it: its expiry, and whether it is the call's own lease.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    pub expiry: f64,
    pub own: bool,
}

/// What a call reads of the stored leases, in the store's order (expiry ascending, then id); a
/// store checks each entry it returns.
pub trait Leases {
    type Error;
    /// Number of entries, live or expired.
    fn entries(&self) -> Result<i64, Self::Error>;
    /// Entries expiring after `now`: the live ones.
    fn live(&self, now: f64) -> Result<i64, Self::Error>;
    /// The expiry of the call's own lease, live or expired.
    fn own_expiry(&self) -> Result<Option<f64>, Self::Error>;
    /// The entry `rank` places before the newest (0 is the newest); `None` past the oldest.
    fn back_from_newest(&self, rank: i64) -> Result<Option<Seen>, Self::Error>;
}

/// What a call knows of the leases before deciding (all empty for a new key).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct View {
    pub len: i64,
    pub live: i64,
    pub own: Option<f64>,
    /// The latest expiry of a lease other than the call's own (live or not).
    pub latest_other: Option<f64>,
    /// The latest expiry of all.
    pub latest: Option<f64>,
}

impl View {
    fn own_live(&self, now: f64) -> bool {
        self.own.is_some_and(|e| e > now)
    }
}

/// Reads what every call needs: the size, the newest entry (and the one before it when the
/// newest is the call's own), the number of live leases and the call's own lease.
pub fn view<L: Leases>(now_us: i64, leases: &L) -> Result<View, L::Error> {
    let len = leases.entries()?;
    if len == 0 {
        return Ok(View::default());
    }
    let newest = leases.back_from_newest(0)?;
    let latest_other = match newest {
        Some(Seen { own: true, .. }) => leases.back_from_newest(1)?.map(|s| s.expiry),
        Some(s) => Some(s.expiry),
        None => None,
    };
    let live = leases.live(now_us as f64)?;
    let own = leases.own_expiry()?;
    Ok(View {
        len,
        live,
        own,
        latest_other,
        latest: newest.map(|s| s.expiry),
    })
}

/// What an admitted acquire stores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    /// Remove this many of the oldest leases first: expired ones, at most `trim_count` of them.
    pub trim: i64,
    /// The call's lease, with this expiry (added, or moved when renewed).
    pub expiry_us: f64,
    /// Absolute expiry of the key in Unix milliseconds: when its last lease expires.
    pub expire_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub write: Option<Write>,
}

/// Whole milliseconds from `now` until `at`, rounded up, never negative.
fn ms_until(at: f64, now: f64) -> i64 {
    (ceil((at - now) / 1000.0) as i64).max(0)
}

/// The Unix millisecond at which a key whose last lease expires at `expiry` goes.
fn expire_at_ms(expiry: f64) -> i64 {
    ceil(expiry / 1000.0) as i64
}

/// Decides one acquire (or a peek, which takes nothing) from its view; on a denial it reads the
/// one lease whose expiry frees a slot.
pub fn decide<L: Leases>(
    params: &Params,
    op: Operation,
    now_us: i64,
    view: &View,
    leases: &L,
) -> Result<Outcome, L::Error> {
    let now = now_us as f64;
    let limit = params.limit;
    let renews = view.own_live(now);
    let allowed = renews || view.live < limit;
    let admits = allowed && op != Operation::Peek;
    let live_after = if admits && !renews {
        view.live + 1
    } else {
        view.live
    };
    let remaining = (limit - live_after).max(0);
    let expiry = now + params.lease_us;
    let retry_after_ms = if allowed {
        0
    } else {
        // The live leases are the newest `live` entries. A slot is free once only `limit - 1` of
        // them are left: when the one `limit - 1` places before the newest expires (with any
        // that expire at the same time). With `limit` lowered below the leases held, that is
        // later than the first expiry.
        match leases.back_from_newest(limit - 1)? {
            Some(s) => ms_until(s.expiry, now),
            None => -1,
        }
    };
    let latest_after = if admits {
        Some(view.latest_other.map_or(expiry, |o| o.max(expiry)))
    } else {
        view.latest
    };
    let reset_after_ms = latest_after.map_or(0, |l| ms_until(l, now));
    let write = admits.then(|| Write {
        trim: trim_count(view.len - view.live, 1),
        expiry_us: expiry,
        expire_at_ms: expire_at_ms(latest_after.unwrap_or(expiry)),
    });
    Ok(Outcome {
        reply: Reply {
            allowed,
            remaining,
            retry_after_ms,
            reset_after_ms,
            limit,
            granted: None,
        },
        write,
    })
}

/// What a release that freed a live lease stores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReleaseWrite {
    /// As for `Write`: expired leases go too.
    pub trim: i64,
    /// The key's new absolute expiry in Unix milliseconds; `None` when no live lease is left
    /// (the key keeps its expiry, or is gone when nothing is left).
    pub expire_at_ms: Option<i64>,
}

/// Decides one release: `true` and what to write when the call's lease was live.
pub fn release(now_us: i64, view: &View) -> (bool, Option<ReleaseWrite>) {
    let now = now_us as f64;
    if !view.own_live(now) {
        return (false, None);
    }
    let write = ReleaseWrite {
        trim: trim_count(view.len - view.live, 0),
        expire_at_ms: view.latest_other.filter(|&o| o > now).map(expire_at_ms),
    };
    (true, Some(write))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Leases sorted by expiry, then id; reads are counted.
    struct Set {
        entries: Vec<(f64, &'static str)>,
        own: &'static str,
        reads: Cell<usize>,
    }

    impl Set {
        fn new(own: &'static str, mut entries: Vec<(f64, &'static str)>) -> Set {
            entries.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
            Set {
                entries,
                own,
                reads: Cell::new(0),
            }
        }
    }

    impl Leases for Set {
        type Error = ();
        fn entries(&self) -> Result<i64, ()> {
            Ok(self.entries.len() as i64)
        }
        fn live(&self, now: f64) -> Result<i64, ()> {
            Ok(self.entries.iter().filter(|e| e.0 > now).count() as i64)
        }
        fn own_expiry(&self) -> Result<Option<f64>, ()> {
            Ok(self.entries.iter().find(|e| e.1 == self.own).map(|e| e.0))
        }
        fn back_from_newest(&self, rank: i64) -> Result<Option<Seen>, ()> {
            self.reads.set(self.reads.get() + 1);
            let i = self.entries.len() as i64 - 1 - rank;
            Ok(usize::try_from(i)
                .ok()
                .and_then(|i| self.entries.get(i))
                .map(|e| Seen {
                    expiry: e.0,
                    own: e.1 == self.own,
                }))
        }
    }

    const P: Params = Params {
        limit: 2,
        lease_ms: 10_000.0,
        lease_us: 10_000_000.0,
    };
    const NOW: i64 = 1_000_000_000;

    fn acquire(set: &Set, op: Operation) -> Outcome {
        let v = view(NOW, set).unwrap();
        decide(&P, op, NOW, &v, set).unwrap()
    }

    #[test]
    fn a_new_key_admits_and_stores_the_lease() {
        let out = acquire(&Set::new("a", vec![]), Operation::Consume(1.0));
        assert_eq!(out.reply.to_array(), [1, 1, 0, 10_000, 2]);
        assert_eq!(
            out.write,
            Some(Write {
                trim: 0,
                expiry_us: 1_010_000_000.0,
                expire_at_ms: 1_010_000,
            })
        );
    }

    #[test]
    fn a_full_key_denies_until_the_oldest_live_lease_expires() {
        let now = NOW as f64;
        let set = Set::new("c", vec![(now + 1_500.0, "a"), (now + 7_000_000.0, "b")]);
        let out = acquire(&set, Operation::Consume(1.0));
        assert_eq!(out.reply.to_array(), [0, 0, 2, 7_000, 2]);
        assert_eq!(out.write, None);
        // The newest, then the lease that frees a slot.
        assert_eq!(set.reads.get(), 2);
        // Expired exactly at its expiry: at that microsecond it no longer counts.
        let later = NOW + 1_500;
        let v = view(later, &set).unwrap();
        let out = decide(&P, Operation::Consume(1.0), later, &v, &set).unwrap();
        assert_eq!(out.reply.to_array(), [1, 0, 0, 10_000, 2]);
        assert_eq!(out.write.unwrap().trim, 1);
        let before = NOW + 1_499;
        let v = view(before, &set).unwrap();
        let out = decide(&P, Operation::Consume(1.0), before, &v, &set).unwrap();
        assert!(!out.reply.allowed);
        assert_eq!(out.reply.retry_after_ms, 1);
    }

    #[test]
    fn a_live_lease_renews_without_a_second_slot() {
        let now = NOW as f64;
        let set = Set::new("b", vec![(now + 1_000.0, "a"), (now + 20_000_000.0, "b")]);
        let out = acquire(&set, Operation::Consume(1.0));
        // Renewed to now + 10 s although it held 20 s: the key's expiry follows the latest lease.
        assert_eq!(out.reply.to_array(), [1, 0, 0, 10_000, 2]);
        assert_eq!(out.write.unwrap().expire_at_ms, 1_010_000);
        assert_eq!(out.write.unwrap().expiry_us, now + 10_000_000.0);
        // An expired own lease is not renewed: it is trimmed and taken again.
        let set = Set::new("b", vec![(now - 1.0, "b"), (now + 5.0, "a")]);
        let out = acquire(&set, Operation::Consume(1.0));
        assert_eq!(out.reply.to_array(), [1, 0, 0, 10_000, 2]);
        assert_eq!(out.write.unwrap().trim, 1);
    }

    #[test]
    fn a_lowered_limit_waits_for_enough_expiries() {
        let now = NOW as f64;
        let set = Set::new(
            "z",
            vec![
                (now + 1_000.0, "a"),
                (now + 2_000.0, "b"),
                (now + 3_000.0, "c"),
                (now + 4_000.0, "d"),
            ],
        );
        let p = Params { limit: 2, ..P };
        let v = view(NOW, &set).unwrap();
        let out = decide(&p, Operation::Consume(1.0), NOW, &v, &set).unwrap();
        // Four held, two allowed: a slot opens when only one is left, at the third expiry.
        assert_eq!(out.reply.to_array(), [0, 0, 3, 4, 2]);
    }

    #[test]
    fn a_peek_takes_nothing() {
        let out = acquire(&Set::new("a", vec![]), Operation::Peek);
        assert_eq!(out.reply.to_array(), [1, 2, 0, 0, 2]);
        assert_eq!(out.write, None);
    }

    #[test]
    fn a_release_frees_only_a_live_lease() {
        let now = NOW as f64;
        let set = Set::new(
            "b",
            vec![(now - 5.0, "x"), (now + 1_000.0, "a"), (now + 9_999.0, "b")],
        );
        let v = view(NOW, &set).unwrap();
        assert_eq!(
            release(NOW, &v),
            (
                true,
                Some(ReleaseWrite {
                    trim: 1,
                    expire_at_ms: Some(1_000_001),
                })
            )
        );
        let set = Set::new("a", vec![(now + 1_000.0, "a"), (now - 1.0, "b")]);
        let v = view(NOW, &set).unwrap();
        assert_eq!(
            release(NOW, &v),
            (
                true,
                Some(ReleaseWrite {
                    trim: 1,
                    expire_at_ms: None,
                })
            )
        );
        let set = Set::new("a", vec![(now, "a")]);
        let v = view(NOW, &set).unwrap();
        assert_eq!(release(NOW, &v), (false, None));
        let v = view(NOW, &Set::new("q", vec![(now + 1.0, "a")])).unwrap();
        assert_eq!(release(NOW, &v), (false, None));
    }
}
