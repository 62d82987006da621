//! Sliding window, approximated by two fixed windows aligned to the Unix epoch.
//!
//! The estimate of the cost admitted in the last `window` is the current window's count plus the
//! previous window's count weighted by how much of it the sliding window still covers. A call of
//! cost `c` is admitted when `estimate + c <= limit`. Both counts live in one hash, so one key (no
//! hash tags) holds the whole state.

use super::{Reply, lua_integer};
use crate::codec::number::{ceil, floor};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub limit: f64,
    /// Whole milliseconds, at least 1.
    pub window_ms: f64,
}

/// Stored state: the start of the current window (integer microseconds below 2^53), the cost
/// admitted in it, and the cost admitted in the window before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    pub start_us: f64,
    pub cur: f64,
    pub prev: f64,
}

/// What to store after an admitted call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    pub state: State,
    /// Absolute expiry in Unix milliseconds: two windows after the current one started, when
    /// neither stored count weighs anything any more.
    pub expire_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub write: Option<Write>,
}

/// The current window's start, the time into it, and the two counts as of now.
fn current(params: &Params, now: f64, prior: Option<State>) -> (f64, f64, f64, f64) {
    let window = params.window_ms * 1000.0;
    let w = floor(now / window) * window;
    let (mut start, mut elapsed, mut cur, mut prev) = (w, now - w, 0.0, 0.0);
    if let Some(s) = prior {
        // A window of another length (the window changed since the state was written) is read
        // as the window of this length that holds its start, so that a later call, reading the
        // same state, finds the counts where this one did (the wait a denial replies holds).
        let stored = if s.start_us == w {
            w
        } else {
            floor(s.start_us / window) * window
        };
        if stored > w {
            // The clock went backwards: stay in the stored window, at its beginning.
            (start, elapsed, cur, prev) = (stored, 0.0, s.cur, s.prev);
        } else if stored == w {
            (cur, prev) = (s.cur, s.prev);
        } else if stored == w - window {
            // The stored window is the previous one: its count becomes the previous count.
            prev = s.cur;
        }
    }
    (start, elapsed, cur, prev)
}

fn write(params: &Params, start: f64, cur: f64, prev: f64) -> Write {
    Write {
        state: State {
            start_us: start,
            cur,
            prev,
        },
        expire_at_ms: lua_integer(ceil(start / 1000.0) + 2.0 * params.window_ms),
    }
}

/// `delta` units refunded (negative) or charged (positive) without an admission check, on the
/// current window's counter: a refund never takes it below 0, a charge never above twice the
/// limit. `None` when nothing changes:
/// `delta` 0, or a refund to a fresh limiter.
pub fn settle(params: &Params, delta: f64, now_us: i64, prior: Option<State>) -> Option<Write> {
    if delta == 0.0 || (delta < 0.0 && prior.is_none()) {
        return None;
    }
    let (start, _, mut cur, prev) = current(params, now_us as f64, prior);
    cur += delta;
    if cur < 0.0 {
        cur = 0.0;
    }
    // At most twice the limit in the current window, as the leaky bucket's level.
    if cur > 2.0 * params.limit {
        cur = 2.0 * params.limit;
    }
    Some(write(params, start, cur, prev))
}

pub fn decide(params: &Params, cost: f64, now_us: i64, prior: Option<State>) -> Outcome {
    let limit = params.limit;
    let window_ms = params.window_ms;
    let window = window_ms * 1000.0;
    let now = now_us as f64;
    let (start, elapsed, mut cur, prev) = current(params, now, prior);
    let weighted = prev * (window - elapsed) / window;
    let estimate = weighted + cur;

    let allowed = estimate + cost <= limit;
    let consumes = allowed && cost > 0.0;
    if consumes {
        cur += cost;
    }

    // Offset from `start` at which the same cost would be admitted, if no other call came: the
    // previous count's weight falls linearly through this window; if the current count alone
    // leaves no room, only in the next window, where the current count becomes the previous.
    let mut retry_after_ms = 0.0;
    if !allowed {
        if cost > limit {
            retry_after_ms = -1.0;
        } else {
            let room = limit - cost;
            let offset = if cur > room {
                window + window * (cur - room) / cur
            } else if prev > 0.0 {
                window * (prev - (room - cur)) / prev
            } else {
                0.0
            };
            retry_after_ms = ceil((start - now + offset) / 1000.0);
            // A denial always asks for some wait.
            if retry_after_ms < 1.0 {
                retry_after_ms = 1.0;
            }
        }
    }
    // Milliseconds until the estimate is 0; `start` plus whole windows, rounded up, written so
    // that every step is exact below 2^53.
    let to_start_ms = ceil((start - now) / 1000.0);
    let reset_after_ms = if cur > 0.0 {
        2.0 * window_ms + to_start_ms
    } else if prev > 0.0 {
        window_ms + to_start_ms
    } else {
        0.0
    };
    let mut remaining = floor(limit - (weighted + cur));
    if remaining < 0.0 {
        remaining = 0.0;
    }

    let write = consumes.then(|| write(params, start, cur, prev));
    Outcome {
        reply: Reply {
            allowed,
            remaining: lua_integer(remaining),
            retry_after_ms: lua_integer(retry_after_ms),
            reset_after_ms: lua_integer(reset_after_ms),
            limit: lua_integer(limit),
            granted: None,
        },
        write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// limit 10, window 10 s.
    const P: Params = Params {
        limit: 10.0,
        window_ms: 10_000.0,
    };
    /// A window boundary (a multiple of 10 s).
    const W0: i64 = 1_700_000_000_000_000;
    const W: i64 = 10_000_000;

    fn run(params: &Params, calls: &[(i64, f64)]) -> (Vec<[i64; 5]>, Option<State>) {
        let mut state = None;
        let replies = calls
            .iter()
            .map(|&(now, cost)| {
                let out = decide(params, cost, now, state);
                if let Some(w) = out.write {
                    state = Some(w.state);
                }
                out.reply.to_array()
            })
            .collect();
        (replies, state)
    }

    #[test]
    fn previous_window_weighs_by_the_part_still_covered() {
        // 10 in window A, then 25% into window B the estimate is 7.5: exactly 2 more fit.
        let mut calls = vec![(W0 + 1_000_000, 1.0); 10];
        calls.extend([(W0 + W + W / 4, 1.0); 3]);
        let (replies, state) = run(&P, &calls);
        assert_eq!(replies[9], [1, 0, 0, 19_000, 10]);
        assert_eq!(replies[10], [1, 1, 0, 17_500, 10]);
        assert_eq!(replies[11], [1, 0, 0, 17_500, 10]);
        // 9.5 + 1 > 10; the weight falls to 7 (room for 1 more) 30% into window B.
        assert_eq!(replies[12], [0, 0, 500, 17_500, 10]);
        assert_eq!(
            state,
            Some(State {
                start_us: (W0 + W) as f64,
                cur: 2.0,
                prev: 10.0
            })
        );
    }

    #[test]
    fn retry_after_is_the_first_instant_that_admits() {
        let (r, state) = run(
            &P,
            &[(W0, 10.0), (W0 + W + W / 4, 2.0), (W0 + W + W / 4, 1.0)],
        );
        let retry = r[2][2];
        assert_eq!(retry, 500);
        let at = |ms: i64| {
            decide(&P, 1.0, W0 + W + W / 4 + ms * 1000, state)
                .reply
                .allowed
        };
        assert!(at(retry));
        assert!(!at(retry - 1));

        // When the current count alone leaves no room, the wait reaches into the next window.
        let (r, state) = run(&P, &[(W0 + W / 2, 8.0), (W0 + W / 2, 3.0)]);
        // 8 weighs 7 one eighth into the next window: 5 s + 1.25 s from now.
        assert_eq!(r[1], [0, 2, 6_250, 15_000, 10]);
        let at = |ms: i64| decide(&P, 3.0, W0 + W / 2 + ms * 1000, state).reply.allowed;
        assert!(at(6_250));
        assert!(!at(6_249));

        assert_eq!(run(&P, &[(W0, 11.0)]).0[0], [0, 10, -1, 0, 10]);
    }

    #[test]
    fn windows_roll_over_and_older_counts_are_dropped() {
        let state = Some(State {
            start_us: W0 as f64,
            cur: 6.0,
            prev: 4.0,
        });
        // One window later: prev = 6, at the very start it weighs fully.
        let out = decide(&P, 0.0, W0 + W, state);
        assert_eq!(out.reply.to_array(), [1, 4, 0, 10_000, 10]);
        // Two windows later: nothing counts.
        let out = decide(&P, 0.0, W0 + 2 * W, state);
        assert_eq!(out.reply.to_array(), [1, 10, 0, 0, 10]);
        let w = decide(&P, 1.0, W0 + 2 * W + 3, state)
            .write
            .expect("admitted");
        assert_eq!(
            w.state,
            State {
                start_us: (W0 + 2 * W) as f64,
                cur: 1.0,
                prev: 0.0
            }
        );
        assert_eq!(w.expire_at_ms, (W0 + 4 * W) / 1000);
    }

    #[test]
    fn clock_going_backwards_keeps_the_stored_window() {
        let state = Some(State {
            start_us: (W0 + W) as f64,
            cur: 2.0,
            prev: 6.0,
        });
        // Back in window A: the stored window B stays, as if at its beginning (6 + 2 = 8).
        let out = decide(&P, 1.0, W0 + W / 2, state);
        assert_eq!(out.reply.to_array(), [1, 1, 0, 25_000, 10]);
        assert_eq!(
            out.write.expect("admitted").state,
            State {
                start_us: (W0 + W) as f64,
                cur: 3.0,
                prev: 6.0
            }
        );
    }

    #[test]
    fn denial_and_peek_write_nothing() {
        let state = Some(State {
            start_us: W0 as f64,
            cur: 9.0,
            prev: 0.0,
        });
        let denied = decide(&P, 2.0, W0 + 1, state);
        assert_eq!(denied.write, None);
        // 9 weighs 8 a ninth into the next window: 10 s - 1 us + 1.111 s, rounded up.
        assert_eq!(denied.reply.to_array(), [0, 1, 11_112, 20_000, 10]);
        assert_eq!(decide(&P, 0.0, W0, state).write, None);
        assert_eq!(
            decide(&P, 0.0, W0, None).reply.to_array(),
            [1, 10, 0, 0, 10]
        );
    }
}
