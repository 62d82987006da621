//! Token bucket with continuous refill.
//!
//! The bucket holds up to `capacity` tokens and gains `refill_per_sec` tokens per second. A call
//! of cost `c` is admitted when at least `c` tokens are present, and then removes them. A new key
//! starts full. Denials and `cost 0` change nothing.

use super::{Reply, lua_integer};
use crate::codec::number::{ceil, floor};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub capacity: f64,
    pub refill_per_sec: f64,
}

/// Stored state: tokens at time `ts_us`. Both are doubles, as in the Lua twin; `ts_us` is always
/// an integer below 2^53.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    pub tokens: f64,
    pub ts_us: f64,
}

/// What to store after an admitted call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Write {
    pub state: State,
    /// Absolute expiry in Unix milliseconds: no earlier than the moment the bucket is full again,
    /// so an expired key and a full bucket are the same thing.
    pub expire_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub write: Option<Write>,
}

/// The tokens as of now, and the time to store with them. Stored tokens may be negative (a debt
/// that `settle` charged), down to `-capacity`.
fn current(params: &Params, now: f64, prior: Option<State>) -> (f64, f64) {
    let capacity = params.capacity;
    let (mut tokens, ts) = match prior {
        Some(s) => (s.tokens, s.ts_us),
        None => (capacity, now),
    };
    // A debt is at most one capacity, whatever was stored (a capacity lowered since): the stored
    // debt is cut to it as of its own time, before the refill, so that a later call, refilled
    // from the same stored state, finds what this one replies it will (the wait it is told).
    if tokens < -capacity {
        tokens = -capacity;
    }
    // A clock that went backwards refills nothing and never moves the stored time back, so the
    // same interval is never counted twice.
    let mut elapsed = now - ts;
    if elapsed < 0.0 {
        elapsed = 0.0;
    }
    let t = if ts > now { ts } else { now };
    tokens += elapsed * params.refill_per_sec / 1_000_000.0;
    if tokens > capacity {
        tokens = capacity;
    }
    (tokens, t)
}

fn write(params: &Params, tokens: f64, t: f64) -> Write {
    let reset_after_ms = ceil((params.capacity - tokens) * 1000.0 / params.refill_per_sec);
    Write {
        state: State { tokens, ts_us: t },
        expire_at_ms: lua_integer(ceil(t / 1000.0) + reset_after_ms),
    }
}

/// `delta` units refunded (negative) or charged (positive) without an admission check: a refund
/// never fills above `capacity`, a charge may leave a debt down to `-capacity`, which refills at
/// the normal rate. `None` when nothing changes: `delta` 0, or a refund to a fresh bucket.
pub fn settle(params: &Params, delta: f64, now_us: i64, prior: Option<State>) -> Option<Write> {
    if delta == 0.0 || (delta < 0.0 && prior.is_none()) {
        return None;
    }
    let capacity = params.capacity;
    let (mut tokens, t) = current(params, now_us as f64, prior);
    tokens -= delta;
    if tokens > capacity {
        tokens = capacity;
    }
    if tokens < -capacity {
        tokens = -capacity;
    }
    Some(write(params, tokens, t))
}

pub fn decide(params: &Params, cost: f64, now_us: i64, prior: Option<State>) -> Outcome {
    let capacity = params.capacity;
    let rate = params.refill_per_sec;
    let now = now_us as f64;
    let (mut tokens, t) = current(params, now, prior);

    let allowed = cost <= tokens;
    let consumes = allowed && cost > 0.0;
    if consumes {
        tokens -= cost;
    }
    // Milliseconds until refilling starts: 0, or as long as a stored time lies ahead of now (a
    // master whose clock ran ahead wrote it), so that every wait replied is exact.
    let ahead_ms = (t - now) / 1000.0;
    let retry_after_ms = if allowed {
        0.0
    } else if cost > capacity {
        -1.0
    } else {
        ceil(ahead_ms + (cost - tokens) * 1000.0 / rate)
    };
    let reset_after_ms = ceil(ahead_ms + (capacity - tokens) * 1000.0 / rate);
    // A debt leaves nothing, not less.
    let mut remaining = floor(tokens);
    if remaining < 0.0 {
        remaining = 0.0;
    }

    let write = consumes.then(|| write(params, tokens, t));
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
        refill_per_sec: 5.0,
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
    fn new_bucket_starts_full_and_drains() {
        let replies = run(&[(T0, 1.0); 12]);
        assert_eq!(replies[0], [1, 9, 0, 200, 10]);
        assert_eq!(replies[9], [1, 0, 0, 2000, 10]);
        assert_eq!(replies[10], [0, 0, 200, 2000, 10]);
        assert_eq!(replies.iter().filter(|r| r[0] == 1).count(), 10);
    }

    #[test]
    fn refills_continuously_and_caps_at_capacity() {
        let mut calls = vec![(T0, 10.0)];
        calls.push((T0 + 1_000_000, 0.0)); // 5 tokens back after one second
        calls.push((T0 + 100_000_000, 0.0)); // long idle: capacity, not more
        assert_eq!(
            run(&calls),
            vec![[1, 0, 0, 2000, 10], [1, 5, 0, 1000, 10], [1, 10, 0, 0, 10]]
        );
    }

    #[test]
    fn denial_and_peek_write_nothing() {
        let state = Some(State {
            tokens: 4.0,
            ts_us: T0 as f64,
        });
        let denied = decide(&P, 5.0, T0, state);
        assert_eq!(denied.reply.to_array(), [0, 4, 200, 1200, 10]);
        assert_eq!(denied.write, None);
        assert_eq!(decide(&P, 0.0, T0, state).write, None);
        assert_eq!(decide(&P, 11.0, T0, state).reply.retry_after_ms, -1);
    }

    #[test]
    fn clock_going_backwards_refills_nothing_and_keeps_the_later_time() {
        let state = Some(State {
            tokens: 2.0,
            ts_us: T0 as f64,
        });
        let out = decide(&P, 1.0, T0 - 5_000_000, state);
        let w = out.write.expect("admitted");
        assert_eq!(
            w.state,
            State {
                tokens: 1.0,
                ts_us: T0 as f64
            }
        );
        assert_eq!(out.reply.remaining, 1);
    }

    #[test]
    fn expiry_is_not_before_the_bucket_is_full() {
        let out = decide(&P, 1.0, T0 + 1, None);
        let w = out.write.expect("admitted");
        // full again 200 ms after T0 + 1us; expiry rounds the start up to the next millisecond.
        assert_eq!(w.expire_at_ms, (T0 + 1_000) / 1000 + 200);
    }
}
