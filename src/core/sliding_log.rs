//! Sliding log: an exact rolling window over the timestamps of admitted requests.
//!
//! Every admitted unit of cost is one entry (its time in microseconds). An entry at `s` counts
//! while `now < s + window`. A call of cost `c` is admitted when the entries in the window plus
//! `c` do not exceed `limit`. Denials and peeks change nothing, not even old entries.
//!
//! A call never reads every entry: it asks the stored log (`Log`) for a few counts and at most
//! two entries, each of which a sorted set answers in O(log n): how many entries there are, how
//! many are still in the window, the newest entry, how many share its score, and on a denial the
//! entry whose departure makes room.
//!
//! Times are integer microseconds below 2^53 and the window is a whole number of milliseconds,
//! so every comparison and every rounded-up millisecond below is exact in doubles, as in the Lua
//! twin.

use super::{Operation, Reply, lua_integer, trim_count};
use crate::codec::number::ceil;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub limit: i64,
    pub window_ms: f64,
    /// `window_ms * 1000`.
    pub window_us: f64,
}

/// What a call reads of the stored log. Ranks and counts are in the store's order (score
/// ascending); a store checks each entry it returns.
pub trait Log {
    type Error;
    /// Number of entries.
    fn entries(&self) -> Result<i64, Self::Error>;
    /// Entries with a score above `score`.
    fn count_above(&self, score: f64) -> Result<i64, Self::Error>;
    /// Entries with exactly this score.
    fn count_at(&self, score: f64) -> Result<i64, Self::Error>;
    /// The score of the entry `rank` places before the newest (0 is the newest); `None` past the
    /// oldest.
    fn score_from_newest(&self, rank: i64) -> Result<Option<f64>, Self::Error>;
}

/// What a call knows of the log before deciding (all zero for a new key).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct View {
    pub len: i64,
    /// Entries still in the window.
    pub in_window: i64,
    pub newest: Option<f64>,
    /// Entries at the newest score, when new entries would join them (the clock has not moved
    /// past it); 0 otherwise.
    pub tied: i64,
}

/// The first time that is outside the window at `now`: entries at or before it have left.
pub fn window_start(params: &Params, now_us: i64) -> f64 {
    now_us as f64 - params.window_us
}

/// Reads what every call needs: the newest entry first (the one entry every call checks), then
/// the counts.
pub fn view<L: Log>(params: &Params, now_us: i64, log: &L) -> Result<View, L::Error> {
    let len = log.entries()?;
    if len == 0 {
        return Ok(View::default());
    }
    let newest = log.score_from_newest(0)?;
    let start = window_start(params, now_us);
    let now = now_us as f64;
    // One entry: the newest is all there is to count, without reading the log again.
    let in_window = match newest {
        Some(n) if len == 1 => i64::from(n > start),
        _ => log.count_above(start)?,
    };
    let tied = match newest {
        Some(n) if n >= now && len == 1 => 1,
        Some(n) if n >= now => log.count_at(n)?,
        _ => 0,
    };
    Ok(View {
        len,
        in_window,
        newest,
        tied,
    })
}

/// What to store after an admitted call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    /// Remove this many of the oldest entries first: those that left the window, at most
    /// `trim_count` of them.
    pub trim: i64,
    /// Score of the new entries: the call time, never earlier than the newest stored entry.
    pub score_us: f64,
    /// The new members are `<score>:<first_index>` .. `<score>:<first_index + count - 1>`;
    /// `first_index` is the number of stored entries already at that score.
    pub first_index: i64,
    pub count: i64,
    /// Absolute expiry in Unix milliseconds: when the newest entry has left the window.
    pub expire_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub write: Option<Write>,
}

/// Milliseconds from `now` until an entry at `score` leaves the window, rounded up.
fn leaves_after_ms(params: &Params, score: f64, now: f64) -> f64 {
    ceil((score - now) / 1000.0) + params.window_ms
}

/// Decides one call from its view of the log; on a denial that can ever fit, it reads the one
/// entry whose departure makes room.
pub fn decide<L: Log>(
    params: &Params,
    op: Operation,
    now_us: i64,
    view: &View,
    log: &L,
) -> Result<Outcome, L::Error> {
    // Exact: times are integers below 2^53.
    let now = now_us as f64;
    let limit = params.limit;
    let cost = lua_integer(op.units());
    let count = view.in_window;

    // A clock that went backwards never places new entries before stored ones.
    let t = match view.newest {
        Some(n) if n > now => n,
        _ => now,
    };

    let allowed = count + cost <= limit;
    let admits = allowed && cost > 0;
    let count_after = if admits { count + cost } else { count };
    let remaining = (limit - count_after).max(0);
    let retry_after_ms = if allowed {
        0
    } else if cost > limit {
        -1
    } else {
        // Enough room once the k-th oldest entry in the window has left it, k = count + cost -
        // limit: the window's entries are the newest `count`, so that one is `limit - cost`
        // places before the newest.
        let rank = limit - cost;
        // The newest entry (a cost of the whole limit) was read already.
        let leaving = if rank == 0 {
            view.newest
        } else {
            log.score_from_newest(rank)?
        };
        leaving.map_or(-1, |s| lua_integer(leaves_after_ms(params, s, now)))
    };
    let reset_after_ms = match view.newest {
        _ if admits => lua_integer(leaves_after_ms(params, t, now)),
        Some(n) if count > 0 => lua_integer(leaves_after_ms(params, n, now)),
        _ => 0,
    };

    let write = admits.then(|| Write {
        trim: trim_count(view.len - count, cost),
        score_us: t,
        first_index: view.tied,
        count: cost,
        expire_at_ms: lua_integer(ceil(t / 1000.0) + params.window_ms),
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

/// What a settlement stores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Settlement {
    /// A charge: entries added as an admitted call adds them.
    Add(Write),
    /// A refund: after the oldest `trim` entries (out of the window), the newest `count` leave;
    /// the key then expires at `expire_at_ms`, or keeps its expiry (`None`: no entry is left in
    /// the window; the key is gone when no entry is left at all).
    Drop {
        trim: i64,
        count: i64,
        expire_at_ms: Option<i64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SettleOutcome {
    pub reply: Reply,
    pub write: Option<Settlement>,
}

/// `delta` units refunded (negative) or charged (positive) without an admission check
/// (`RL.SETTLE`): a refund removes the newest entries still in the window (at most as many as
/// there are); a charge adds entries at the call time until the window holds `limit` of them (a
/// log has no debt: what is charged beyond its limit is not kept). The reply is the state after,
/// as a peek reports it, with `allowed` 1 and no wait.
pub fn settle<L: Log>(
    params: &Params,
    delta: i64,
    now_us: i64,
    view: &View,
    log: &L,
) -> Result<SettleOutcome, L::Error> {
    let now = now_us as f64;
    let limit = params.limit;
    let count = view.in_window;
    let old = view.len - count;
    // After the settlement: the entries in the window, the newest one's score, and the write.
    let (count_after, newest, write) = if delta > 0 && count < limit {
        let t = match view.newest {
            Some(n) if n > now => n,
            _ => now,
        };
        let added = delta.min(limit - count);
        let write = Write {
            trim: trim_count(old, added),
            score_us: t,
            first_index: view.tied,
            count: added,
            expire_at_ms: lua_integer(ceil(t / 1000.0) + params.window_ms),
        };
        (count + added, Some(t), Some(Settlement::Add(write)))
    } else if delta < 0 && count > 0 {
        let dropped = delta.saturating_neg().min(count);
        let next = if dropped < count {
            log.score_from_newest(dropped)?
        } else {
            None
        };
        let write = Settlement::Drop {
            trim: trim_count(old, 0),
            count: dropped,
            expire_at_ms: next.map(|s| lua_integer(ceil(s / 1000.0) + params.window_ms)),
        };
        (count - dropped, next, Some(write))
    } else {
        (count, view.newest.filter(|_| count > 0), None)
    };
    let reset_after_ms = match newest {
        Some(n) if count_after > 0 => lua_integer(leaves_after_ms(params, n, now)),
        _ => 0,
    };
    Ok(SettleOutcome {
        reply: Reply {
            allowed: true,
            remaining: (limit - count_after).max(0),
            retry_after_ms: 0,
            reset_after_ms,
            limit,
            granted: None,
        },
        write,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 per 10 seconds.
    const P: Params = Params {
        limit: 3,
        window_ms: 10_000.0,
        window_us: 10_000_000.0,
    };
    const T0: i64 = 1_700_000_000_000_000;

    /// A log as a sorted list of scores, counting the entries each call reads.
    struct Scores(Vec<f64>, std::cell::Cell<usize>);

    impl Log for Scores {
        type Error = ();
        fn entries(&self) -> Result<i64, ()> {
            Ok(self.0.len() as i64)
        }
        fn count_above(&self, score: f64) -> Result<i64, ()> {
            Ok(self.0.iter().filter(|&&s| s > score).count() as i64)
        }
        fn count_at(&self, score: f64) -> Result<i64, ()> {
            Ok(self.0.iter().filter(|&&s| s == score).count() as i64)
        }
        fn score_from_newest(&self, rank: i64) -> Result<Option<f64>, ()> {
            self.1.set(self.1.get() + 1);
            let i = self.0.len() as i64 - 1 - rank;
            Ok(usize::try_from(i).ok().and_then(|i| self.0.get(i)).copied())
        }
    }

    fn call(scores: &[f64], p: &Params, cost: i64, now: i64) -> (Outcome, usize) {
        let log = Scores(scores.to_vec(), Default::default());
        let v = view(p, now, &log).unwrap();
        let out = decide(p, Operation::from_cost(cost as f64), now, &v, &log).unwrap();
        (out, log.1.get())
    }

    /// Applies writes to a plain list of scores, the way the stores do.
    fn run(calls: &[(i64, i64)]) -> (Vec<[i64; 5]>, Vec<f64>) {
        let mut scores: Vec<f64> = Vec::new();
        let replies = calls
            .iter()
            .map(|&(now, cost)| {
                let (out, _) = call(&scores, &P, cost, now);
                if let Some(w) = out.write {
                    scores.drain(..usize::try_from(w.trim).unwrap());
                    for _ in 0..w.count {
                        scores.push(w.score_us);
                    }
                }
                out.reply.to_array()
            })
            .collect();
        (replies, scores)
    }

    #[test]
    fn admits_limit_per_window_then_waits_for_the_oldest() {
        let (r, _) = run(&[
            (T0, 1),
            (T0 + 1_000_000, 1),
            (T0 + 2_500_000, 1),
            (T0 + 3_000_000, 1),
        ]);
        assert_eq!(r[0], [1, 2, 0, 10_000, 3]);
        assert_eq!(r[1], [1, 1, 0, 10_000, 3]);
        assert_eq!(r[2], [1, 0, 0, 10_000, 3]);
        // The entry at T0 leaves at T0 + 10 s: 7 s from now. Newest leaves 9.5 s from now.
        assert_eq!(r[3], [0, 0, 7_000, 9_500, 3]);
    }

    #[test]
    fn exact_boundary_of_the_window() {
        let (r, scores) = run(&[(T0, 3), (T0 + 9_999_999, 1), (T0 + 10_000_000, 1)]);
        assert_eq!(
            r[1],
            [0, 0, 1, 1, 3],
            "one microsecond short: 1 ms, rounded up"
        );
        assert_eq!(
            r[2],
            [1, 2, 0, 10_000, 3],
            "old entries left at exactly s + window"
        );
        assert_eq!(scores, [(T0 + 10_000_000) as f64], "and were trimmed");
    }

    #[test]
    fn retry_after_uses_the_kth_oldest_entry() {
        let (r, _) = run(&[
            (T0, 1),
            (T0 + 1_000_000, 1),
            (T0 + 2_000_000, 1),
            (T0 + 4_000_000, 2),
            (T0 + 4_000_000, 4),
        ]);
        // cost 2 with 3 in the window: the 2nd oldest (T0 + 1 s) must leave: 7 s.
        assert_eq!(r[3], [0, 0, 7_000, 8_000, 3]);
        assert_eq!(
            r[4],
            [0, 0, -1, 8_000, 3],
            "cost above the limit never fits"
        );
    }

    #[test]
    fn the_kth_oldest_is_found_among_expired_entries_too() {
        // Two entries left the window, three remain: the 1st oldest in the window is 3rd stored.
        let old = (T0 - 20_000_000) as f64;
        let scores = [old, old, T0 as f64, (T0 + 1) as f64, (T0 + 2) as f64];
        let (out, reads) = call(&scores, &P, 1, T0 + 5_000_000);
        assert_eq!(out.reply.to_array(), [0, 0, 5_000, 5_001, 3]);
        assert_eq!(reads, 2, "the newest and the decisive entry");
    }

    #[test]
    fn denial_and_peek_write_nothing_and_do_not_trim() {
        let scores = [(T0 - 20_000_000) as f64, T0 as f64, T0 as f64, T0 as f64];
        let (denied, _) = call(&scores, &P, 1, T0);
        assert_eq!(denied.reply.to_array(), [0, 0, 10_000, 10_000, 3]);
        assert_eq!(denied.write, None);
        let (peek, reads) = call(&scores, &P, 0, T0 + 10_000_000);
        assert_eq!(peek.reply.to_array(), [1, 3, 0, 0, 3]);
        assert_eq!(peek.write, None);
        assert_eq!(reads, 1, "an admitted call reads only the newest entry");
    }

    #[test]
    fn admitted_call_trims_and_numbers_members_after_ties() {
        let old = (T0 - 20_000_000) as f64;
        let (out, _) = call(&[old, T0 as f64], &P, 2, T0);
        assert_eq!(out.reply.to_array(), [1, 0, 0, 10_000, 3]);
        assert_eq!(
            out.write,
            Some(Write {
                trim: 1,
                score_us: T0 as f64,
                first_index: 1,
                count: 2,
                expire_at_ms: T0 / 1000 + 10_000,
            })
        );
    }

    #[test]
    fn clock_going_backwards_stacks_on_the_newest_entry() {
        let newest = (T0 + 5_000_000) as f64;
        let (out, _) = call(&[newest], &P, 1, T0);
        let w = out.write.expect("admitted");
        assert_eq!((w.score_us, w.first_index), (newest, 1));
        assert_eq!(out.reply.to_array(), [1, 1, 0, 15_000, 3]);
        assert_eq!(w.expire_at_ms, (T0 + 5_000_000) / 1000 + 10_000);
    }

    #[test]
    fn smaller_limit_than_stored_entries_reports_zero_remaining() {
        let scores = [T0 as f64; 3];
        let p = Params { limit: 2, ..P };
        assert_eq!(
            call(&scores, &p, 1, T0).0.reply.to_array(),
            [0, 0, 10_000, 10_000, 2]
        );
    }

    #[test]
    fn expiry_rounds_up_to_the_millisecond_after_the_newest_leaves() {
        let (out, _) = call(&[], &P, 1, T0 + 1);
        assert_eq!(
            out.write.map(|w| w.expire_at_ms),
            Some(T0 / 1000 + 1 + 10_000)
        );
        assert_eq!(out.reply.reset_after_ms, 10_000);
    }
}
