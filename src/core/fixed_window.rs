//! Fixed window counter.
//!
//! A window of `window_ms` opens at the first admitted call (not aligned to the clock) and counts
//! admitted cost; a call of cost `c` is admitted when `count + c <= limit`. Once the window has
//! ended the next admitted call opens a new one. Like INCR + EXPIRE, except that denials never
//! count, and the window's end comes from the stored start, not from the key's TTL.

use super::{Reply, lua_integer};
use crate::codec::number::ceil;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub limit: f64,
    /// Whole milliseconds, at least 1.
    pub window_ms: f64,
}

/// Stored state: admitted cost in the window that opened at `start_us` (an integer below 2^53).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    pub count: f64,
    pub start_us: f64,
}

/// What to store after an admitted call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    pub state: State,
    /// Absolute expiry in Unix milliseconds: the window's end, rounded up.
    pub expire_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub write: Option<Write>,
}

fn write(params: &Params, count: f64, start: f64) -> Write {
    Write {
        state: State {
            count,
            start_us: start,
        },
        expire_at_ms: lua_integer(ceil(start / 1000.0) + params.window_ms),
    }
}

/// `delta` units refunded (negative) or charged (positive) without an admission check, in the
/// current window: a refund never takes the count below 0 and does nothing once the window has
/// ended; a charge with no window open opens one now, and never takes the count above twice the
/// limit. `None` when nothing changes.
pub fn settle(params: &Params, delta: f64, now_us: i64, prior: Option<State>) -> Option<Write> {
    let now = now_us as f64;
    let open = prior.filter(|s| now - s.start_us < params.window_ms * 1000.0);
    // A charge fills a window up to twice its limit, as the leaky bucket's level: a debt of one
    // more full window at most.
    let most = 2.0 * params.limit;
    match open {
        _ if delta == 0.0 => None,
        None if delta < 0.0 => None,
        None => Some(write(params, if delta > most { most } else { delta }, now)),
        Some(s) => {
            let mut count = s.count + delta;
            if count < 0.0 {
                count = 0.0;
            }
            if count > most {
                count = most;
            }
            Some(write(params, count, s.start_us))
        }
    }
}

pub fn decide(params: &Params, cost: f64, now_us: i64, prior: Option<State>) -> Outcome {
    let limit = params.limit;
    let window_ms = params.window_ms;
    let window_us = window_ms * 1000.0;
    let now = now_us as f64;
    // A stored window is current until its end; a clock that went backwards stays in it.
    let (mut count, start, open) = match prior {
        Some(s) if now - s.start_us < window_us => (s.count, s.start_us, true),
        _ => (0.0, now, false),
    };

    let allowed = count + cost <= limit;
    let consumes = allowed && cost > 0.0;
    if consumes {
        count += cost;
    }
    // Milliseconds until the window's end, start + window_us, rounded up. Written as
    // window_ms + ceil((start - now) / 1000) so that every step is exact below 2^53.
    let until_end_ms = window_ms + ceil((start - now) / 1000.0);
    let retry_after_ms = if allowed {
        0.0
    } else if cost > limit {
        -1.0
    } else {
        until_end_ms
    };
    let reset_after_ms = if open || consumes { until_end_ms } else { 0.0 };
    // A count above the limit (the limit argument was lowered) leaves nothing, not less.
    let mut remaining = limit - count;
    if remaining < 0.0 {
        remaining = 0.0;
    }

    let write = consumes.then(|| write(params, count, start));
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

    const P: Params = Params {
        limit: 5.0,
        window_ms: 1000.0,
    };
    const T0: i64 = 1_700_000_000_000_000;

    fn run(calls: &[(i64, f64)]) -> Vec<[i64; 5]> {
        let mut state = None;
        calls
            .iter()
            .map(|&(now, cost)| {
                let out = decide(&P, cost, now, state);
                if let Some(w) = out.write {
                    state = Some(w.state);
                }
                out.reply.to_array()
            })
            .collect()
    }

    #[test]
    fn counts_up_to_the_limit_within_a_window() {
        let mut calls = vec![(T0, 1.0)];
        calls.extend([(T0 + 250_000, 1.0); 5]);
        let replies = run(&calls);
        assert_eq!(replies[0], [1, 4, 0, 1000, 5]);
        assert_eq!(replies[4], [1, 0, 0, 750, 5]);
        assert_eq!(replies[5], [0, 0, 750, 750, 5]);
    }

    #[test]
    fn boundary_burst_admits_twice_the_limit_within_one_window_length() {
        // The first call opens the window at T0; the rest of its limit is used in its last
        // millisecond, and a whole new limit right at its end.
        let mut calls = vec![(T0, 1.0)];
        calls.extend([(T0 + 999_000, 1.0); 5]);
        calls.extend([(T0 + 1_000_000, 1.0); 6]);
        let replies = run(&calls);
        let admitted = |r: &[[i64; 5]]| r.iter().filter(|r| r[0] == 1).count();
        assert_eq!(admitted(&replies[0..6]), 5);
        assert_eq!(replies[4], [1, 0, 0, 1, 5]);
        assert_eq!(replies[5], [0, 0, 1, 1, 5], "the window ends in 1 ms");
        assert_eq!(admitted(&replies[6..12]), 5);
        assert_eq!(
            replies[6],
            [1, 4, 0, 1000, 5],
            "a new window opens at the end"
        );
        assert_eq!(replies[11], [0, 0, 1000, 1000, 5]);
        assert_eq!(admitted(&replies), 10);
    }

    #[test]
    fn denial_and_peek_write_nothing() {
        let state = Some(State {
            count: 3.0,
            start_us: T0 as f64,
        });
        let denied = decide(&P, 3.0, T0 + 100_500, state);
        assert_eq!(denied.reply.to_array(), [0, 2, 900, 900, 5]);
        assert_eq!(denied.write, None);
        assert_eq!(decide(&P, 0.0, T0, state).write, None);
        assert_eq!(decide(&P, 6.0, T0, state).reply.retry_after_ms, -1);
        // No window: a peek reports nothing to wait for.
        assert_eq!(decide(&P, 0.0, T0, None).reply.to_array(), [1, 5, 0, 0, 5]);
        assert_eq!(
            decide(&P, 0.0, T0 + 1_000_000, state).reply.to_array(),
            [1, 5, 0, 0, 5]
        );
    }

    #[test]
    fn clock_going_backwards_stays_in_the_current_window() {
        let state = Some(State {
            count: 3.0,
            start_us: T0 as f64,
        });
        let out = decide(&P, 1.0, T0 - 5_000_000, state);
        let w = out.write.expect("admitted");
        assert_eq!(
            w.state,
            State {
                count: 4.0,
                start_us: T0 as f64
            }
        );
        assert_eq!(out.reply.to_array(), [1, 1, 0, 6000, 5]);
        assert_eq!(w.expire_at_ms, T0 / 1000 + 1000);
    }

    #[test]
    fn expiry_is_the_window_end_rounded_up() {
        let w = decide(&P, 1.0, T0 + 1, None).write.expect("admitted");
        assert_eq!(w.expire_at_ms, (T0 + 1_000) / 1000 + 1000);
        assert_eq!(w.state.start_us, (T0 + 1) as f64);
    }
}
