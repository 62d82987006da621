//! Policing leaky bucket.
//!
//! The bucket holds a `level` that drains at `leak_per_sec` per second, continuously, down to 0
//! (and is never more than `capacity`).
//! A call of cost `c` is admitted when `level + c <= capacity`, and then adds `c` to the level. A
//! new key starts empty. Denials and `cost 0` change nothing.

use super::{Reply, lua_integer};
use crate::codec::number::{ceil, floor};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub capacity: f64,
    pub leak_per_sec: f64,
}

/// Stored state: the level at time `ts_us` (an integer below 2^53).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    pub level: f64,
    pub ts_us: f64,
}

/// What to store after an admitted call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    pub state: State,
    /// Absolute expiry in Unix milliseconds: no earlier than the moment the bucket is empty
    /// again, so an expired key and an empty bucket are the same thing.
    pub expire_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub write: Option<Write>,
}

/// The level as of now, and the time to store with it. A level above capacity (a charge that
/// `settle` made, or a capacity argument that was lowered) drains like any other; above twice
/// the capacity it counts as twice the capacity, so every time derived from it stays bounded.
fn current(params: &Params, now: f64, prior: Option<State>) -> (f64, f64) {
    let (mut level, ts) = match prior {
        Some(s) => (s.level, s.ts_us),
        None => (0.0, now),
    };
    // A debt is at most one capacity (a level of twice it), whatever was stored (a capacity
    // lowered since): the stored level is cut to it as of its own time, before it drains, so that
    // a later call, drained from the same stored state, finds what this one replies it will.
    if level > 2.0 * params.capacity {
        level = 2.0 * params.capacity;
    }
    let mut elapsed = now - ts;
    if elapsed < 0.0 {
        elapsed = 0.0;
    }
    let t = if ts > now { ts } else { now };
    level -= elapsed * params.leak_per_sec / 1_000_000.0;
    if level < 0.0 {
        level = 0.0;
    }
    (level, t)
}

fn write(params: &Params, level: f64, t: f64) -> Write {
    let reset_after_ms = ceil(level * 1000.0 / params.leak_per_sec);
    Write {
        state: State { level, ts_us: t },
        expire_at_ms: lua_integer(ceil(t / 1000.0) + reset_after_ms),
    }
}

/// `delta` units refunded (negative) or charged (positive) without an admission check: a refund
/// never lowers the level below 0, a charge may raise it above capacity, up to twice it (a debt
/// of one capacity), which drains at the normal rate. `None` when nothing changes: `delta` 0, or
/// a refund to a fresh bucket.
pub fn settle(params: &Params, delta: f64, now_us: i64, prior: Option<State>) -> Option<Write> {
    if delta == 0.0 || (delta < 0.0 && prior.is_none()) {
        return None;
    }
    let (mut level, t) = current(params, now_us as f64, prior);
    level += delta;
    if level < 0.0 {
        level = 0.0;
    }
    if level > 2.0 * params.capacity {
        level = 2.0 * params.capacity;
    }
    Some(write(params, level, t))
}

pub fn decide(params: &Params, cost: f64, now_us: i64, prior: Option<State>) -> Outcome {
    let capacity = params.capacity;
    let rate = params.leak_per_sec;
    let now = now_us as f64;
    let (mut level, t) = current(params, now, prior);
    let allowed = level + cost <= capacity;
    let consumes = allowed && cost > 0.0;
    if consumes {
        level += cost;
    }
    // Milliseconds until draining starts: 0, or as long as a stored time lies ahead of now (a
    // master whose clock ran ahead wrote it), so that every wait replied is exact.
    let ahead_ms = (t - now) / 1000.0;
    let retry_after_ms = if allowed {
        0.0
    } else if cost > capacity {
        -1.0
    } else {
        ceil(ahead_ms + (level + cost - capacity) * 1000.0 / rate)
    };
    let reset_after_ms = ceil(ahead_ms + level * 1000.0 / rate);
    // A level above capacity leaves nothing, not less.
    let mut remaining = floor(capacity - level);
    if remaining < 0.0 {
        remaining = 0.0;
    }

    let write = consumes.then(|| write(params, level, t));
    Outcome {
        reply: Reply {
            allowed,
            remaining: lua_integer(remaining),
            retry_after_ms: lua_integer(retry_after_ms),
            reset_after_ms: lua_integer(reset_after_ms),
            limit: lua_integer(capacity),
            granted: None,
        },
        write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        capacity: 10.0,
        leak_per_sec: 5.0,
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
    fn new_bucket_starts_empty_and_fills_to_capacity() {
        let replies = run(&[(T0, 1.0); 12]);
        assert_eq!(replies[0], [1, 9, 0, 200, 10]);
        assert_eq!(replies[9], [1, 0, 0, 2000, 10]);
        assert_eq!(replies[10], [0, 0, 200, 2000, 10]);
        assert_eq!(replies[11], [0, 0, 200, 2000, 10]);
        assert_eq!(replies.iter().filter(|r| r[0] == 1).count(), 10);
    }

    #[test]
    fn drains_continuously_and_admits_exactly_what_drained() {
        let mut calls = vec![(T0, 10.0)];
        // 1 s drains 5: five calls of 1 fit, the sixth does not.
        calls.extend([(T0 + 1_000_000, 1.0); 6]);
        let replies = run(&calls);
        assert_eq!(replies[0], [1, 0, 0, 2000, 10]);
        assert_eq!(replies[1], [1, 4, 0, 1200, 10]);
        assert_eq!(replies[5], [1, 0, 0, 2000, 10]);
        assert_eq!(replies[6], [0, 0, 200, 2000, 10]);
        // A long idle time empties the bucket, and not below zero.
        let idle = run(&[(T0, 10.0), (T0 + 100_000_000, 0.0)]);
        assert_eq!(idle[1], [1, 10, 0, 0, 10]);
    }

    #[test]
    fn denial_and_peek_write_nothing() {
        let state = Some(State {
            level: 6.0,
            ts_us: T0 as f64,
        });
        let denied = decide(&P, 5.0, T0, state);
        assert_eq!(denied.reply.to_array(), [0, 4, 200, 1200, 10]);
        assert_eq!(denied.write, None);
        assert_eq!(decide(&P, 0.0, T0, state).write, None);
        assert_eq!(decide(&P, 11.0, T0, state).reply.retry_after_ms, -1);
        assert_eq!(
            decide(&P, 0.0, T0, None).reply.to_array(),
            [1, 10, 0, 0, 10]
        );
    }

    #[test]
    fn clock_going_backwards_drains_nothing_and_keeps_the_later_time() {
        let state = Some(State {
            level: 8.0,
            ts_us: T0 as f64,
        });
        let out = decide(&P, 1.0, T0 - 5_000_000, state);
        let w = out.write.expect("admitted");
        assert_eq!(
            w.state,
            State {
                level: 9.0,
                ts_us: T0 as f64
            }
        );
        // The bucket starts draining at the later time, 5 s from now: it is empty 6.8 s on.
        assert_eq!(out.reply.to_array(), [1, 1, 0, 6800, 10]);
    }

    #[test]
    fn a_level_above_a_lowered_capacity_drains_like_a_debt() {
        let state = Some(State {
            level: 8.0,
            ts_us: T0 as f64,
        });
        let small = Params {
            capacity: 5.0,
            leak_per_sec: 5.0,
        };
        let out = decide(&small, 1.0, T0, state);
        assert_eq!(out.reply.to_array(), [0, 0, 800, 1600, 5]);
        // Stored levels far above any capacity count as twice the capacity: bounded times.
        let huge = Some(State {
            level: 1e300,
            ts_us: T0 as f64,
        });
        assert_eq!(
            decide(&P, 1.0, T0, huge).reply.to_array(),
            [0, 0, 2200, 4000, 10]
        );
    }

    #[test]
    fn expiry_is_not_before_the_bucket_is_empty() {
        let out = decide(&P, 1.0, T0 + 1, None);
        let w = out.write.expect("admitted");
        // Empty again 200 ms after T0 + 1us; the expiry rounds the start up to the next ms.
        assert_eq!(w.expire_at_ms, (T0 + 1_000) / 1000 + 200);
    }
}
