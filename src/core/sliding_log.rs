//! Sliding log: an exact rolling window over the timestamps of admitted requests.
//!
//! Every admitted unit of cost is one entry (its time in microseconds). An entry at `s` counts
//! while `now < s + window`. A call of cost `c` is admitted when the entries in the window plus
//! `c` do not exceed `limit`. Denials and `cost 0` change nothing, not even old entries.
//!
//! Times are integer microseconds below 2^53 and the window is a whole number of milliseconds,
//! so every comparison and every rounded-up millisecond below is exact in doubles, as in the Lua
//! twin.

use super::{Reply, lua_integer};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub limit: i64,
    pub window_ms: f64,
    /// `window_ms * 1000`.
    pub window_us: f64,
}

/// What to store after an admitted call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    /// Remove every entry with a score up to and including this time (they left the window);
    /// `None` when none did.
    pub trim_up_to_us: Option<f64>,
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
    ((score - now) / 1000.0).ceil() + params.window_ms
}

/// `scores`: every stored entry's score, ascending (empty for a new key).
pub fn decide(params: &Params, cost: i64, now_us: i64, scores: &[f64]) -> Outcome {
    // Exact: times are integers below 2^53.
    let now = now_us as f64;
    let limit = params.limit;
    // Entries are sorted, so the ones still in the window are a suffix.
    let start = scores
        .iter()
        .position(|&s| s - now > -params.window_us)
        .unwrap_or(scores.len());
    let in_window = scores.get(start..).unwrap_or_default();
    let count = i64::try_from(in_window.len()).unwrap_or(i64::MAX);
    let newest = scores.last().copied();

    // A clock that went backwards never places new entries before stored ones.
    let t = match newest {
        Some(n) if n > now => n,
        _ => now,
    };
    let tied = match newest {
        Some(n) if n == t => scores.iter().rev().take_while(|&&s| s == t).count(),
        _ => 0,
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
        // Enough room once the k-th oldest entry in the window has left it.
        let k = count + cost - limit;
        usize::try_from(k - 1)
            .ok()
            .and_then(|i| in_window.get(i))
            .map_or(-1, |&s| lua_integer(leaves_after_ms(params, s, now)))
    };
    let reset_after_ms = if admits {
        lua_integer(leaves_after_ms(params, t, now))
    } else {
        in_window
            .last()
            .map_or(0, |&s| lua_integer(leaves_after_ms(params, s, now)))
    };

    let write = admits.then(|| Write {
        trim_up_to_us: (start > 0).then_some(now - params.window_us),
        score_us: t,
        first_index: i64::try_from(tied).unwrap_or(i64::MAX),
        count: cost,
        expire_at_ms: lua_integer((t / 1000.0).ceil() + params.window_ms),
    });
    Outcome {
        reply: Reply {
            allowed,
            remaining,
            retry_after_ms,
            reset_after_ms,
            limit,
        },
        write,
    }
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

    /// Applies writes to a plain list of scores, the way the stores do.
    fn run(calls: &[(i64, i64)]) -> (Vec<[i64; 5]>, Vec<f64>) {
        let mut scores: Vec<f64> = Vec::new();
        let replies = calls
            .iter()
            .map(|&(now, cost)| {
                let out = decide(&P, cost, now, &scores);
                if let Some(w) = out.write {
                    if let Some(up_to) = w.trim_up_to_us {
                        scores.retain(|&s| s > up_to);
                    }
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
        let (r, _) = run(&[(T0, 3), (T0 + 9_999_999, 1), (T0 + 10_000_000, 1)]);
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
    fn denial_and_peek_write_nothing_and_do_not_trim() {
        let scores = [(T0 - 20_000_000) as f64, T0 as f64, T0 as f64, T0 as f64];
        let denied = decide(&P, 1, T0, &scores);
        assert_eq!(denied.reply.to_array(), [0, 0, 10_000, 10_000, 3]);
        assert_eq!(denied.write, None);
        let peek = decide(&P, 0, T0 + 10_000_000, &scores);
        assert_eq!(peek.reply.to_array(), [1, 3, 0, 0, 3]);
        assert_eq!(peek.write, None);
    }

    #[test]
    fn admitted_call_trims_and_numbers_members_after_ties() {
        let old = (T0 - 20_000_000) as f64;
        let out = decide(&P, 2, T0, &[old, T0 as f64]);
        assert_eq!(out.reply.to_array(), [1, 0, 0, 10_000, 3]);
        assert_eq!(
            out.write,
            Some(Write {
                trim_up_to_us: Some((T0 - 10_000_000) as f64),
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
        let out = decide(&P, 1, T0, &[newest]);
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
            decide(&p, 1, T0, &scores).reply.to_array(),
            [0, 0, 10_000, 10_000, 2]
        );
    }

    #[test]
    fn expiry_rounds_up_to_the_millisecond_after_the_newest_leaves() {
        let out = decide(&P, 1, T0 + 1, &[]);
        assert_eq!(
            out.write.map(|w| w.expire_at_ms),
            Some(T0 / 1000 + 1 + 10_000)
        );
        assert_eq!(out.reply.reset_after_ms, 10_000);
    }
}
