//! GCRA (generic cell rate algorithm), the way redis-cell defines it.
//!
//! One time unit ("tick") throughout: microseconds for `RL.GCRA`, nanoseconds for `CL.THROTTLE`.
//! The state is one number, the theoretical arrival time `tat`: when the schedule of evenly
//! spaced calls (one per `interval`) would next be free. A call of cost `c` moves it to
//! `max(tat, now) + c * interval` and is admitted when that is at most `tolerance` ahead of now,
//! with `tolerance = interval * limit`: `limit` calls at once, then one per `interval`.
//!
//! Integer arithmetic only (i128, so no operation can overflow for any stored or derived value the
//! commands accept); the Lua twins reproduce it exactly (see `lua-reference/gcra.lua` and
//! `lua-reference/throttle.lua`).

/// Validated parameters, in ticks. `tolerance == interval * limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub interval: i64,
    pub limit: i64,
    pub tolerance: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    /// The theoretical arrival time after the call, relative to now: the new one when admitted,
    /// else the stored one (or now for a new key). Negative when a stored time lies in the past.
    pub ttl: i128,
    /// How long until the same call could be admitted; `None` when admitted, or when the cost
    /// exceeds the limit and can never be admitted.
    pub retry_after: Option<i128>,
    /// The theoretical arrival time to store: only when admitted with a cost above zero.
    pub write: Option<i128>,
}

pub fn decide(p: &Params, cost: i64, now: i128, prior_tat: Option<i128>) -> Outcome {
    let tat = prior_tat.unwrap_or(now);
    if cost > p.limit {
        return Outcome {
            allowed: false,
            ttl: tat - now,
            retry_after: None,
            write: None,
        };
    }
    let base = if tat > now { tat } else { now };
    let new_tat = base + i128::from(p.interval) * i128::from(cost);
    let allow_at = new_tat - i128::from(p.tolerance);
    if allow_at > now {
        return Outcome {
            allowed: false,
            ttl: tat - now,
            retry_after: Some(allow_at - now),
            write: None,
        };
    }
    Outcome {
        allowed: true,
        ttl: new_tat - now,
        retry_after: None,
        write: (cost > 0).then_some(new_tat),
    }
}

/// Whole intervals still free after the call: `floor((tolerance - ttl) / interval)`, with a
/// `ttl` in the past counted as zero, so `0 <= remaining <= limit`.
/// `delta` units refunded (negative) or charged (positive) without an admission check: the
/// theoretical arrival time moves by `delta` emission intervals, a charge from now at the
/// earliest and at most one full burst past a full one (`now + 2 * tolerance`), a refund never
/// before now. The new time to store, or `None` when nothing changes (`delta` 0, or a refund
/// while the limiter is idle).
pub fn settle(p: &Params, delta: i64, now: i128, prior_tat: Option<i128>) -> Option<i128> {
    let tat = prior_tat.unwrap_or(now);
    let moved = i128::from(p.interval) * i128::from(delta);
    if delta > 0 {
        let base = if tat > now { tat } else { now };
        Some((base + moved).min(now + 2 * i128::from(p.tolerance)))
    } else if delta < 0 && tat > now {
        Some((tat + moved).max(now))
    } else {
        None
    }
}

/// `a / b`, truncated toward zero as `/` is, for `b > 0`: in 64 bits when `a` fits, as every
/// value of a call in microseconds does (a 128-bit division is a call into the compiler's runtime,
/// about 60 instructions, on every call).
pub fn div(a: i128, b: i64) -> i128 {
    match i64::try_from(a) {
        Ok(a) => i128::from(a / b),
        Err(_) => a / i128::from(b),
    }
}

/// `a % b` with the sign of `a`, as `%` is, for `b > 0`; in 64 bits when `a` fits.
pub fn rem(a: i128, b: i64) -> i128 {
    match i64::try_from(a) {
        Ok(a) => i128::from(a % b),
        Err(_) => a % i128::from(b),
    }
}

/// `a as f64` (rounded to nearest), from 64 bits when `a` fits: a conversion from 128 bits is a
/// call into the compiler's runtime, about 45 instructions. (`black_box` keeps the optimiser from
/// seeing that both arms give the same number and keeping only the 128-bit one.)
pub fn to_f64(a: i128) -> f64 {
    match i64::try_from(a) {
        Ok(a) => a as f64,
        Err(_) => std::hint::black_box(a) as f64,
    }
}

pub fn remaining(p: &Params, ttl: i128) -> i128 {
    let ttl = if ttl < 0 { 0 } else { ttl };
    let free = i128::from(p.tolerance) - ttl;
    if free <= 0 { 0 } else { div(free, p.interval) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisions_in_64_bits_are_the_128_bit_ones() {
        let big = i128::from(i64::MAX) * 3 + 7;
        for a in [
            0,
            1,
            -1,
            999,
            -999,
            1000,
            -1001,
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            big,
            -big,
        ] {
            for b in [1, 7, 1000, 1_000_000_000, i64::MAX] {
                assert_eq!(div(a, b), a / i128::from(b), "{a} / {b}");
                assert_eq!(rem(a, b), a % i128::from(b), "{a} % {b}");
            }
            assert_eq!(to_f64(a).to_bits(), (a as f64).to_bits(), "{a} as f64");
        }
        // Rounded the same way past 2^53, where doubles are no longer every integer.
        for a in [
            (1i128 << 53) + 1,
            (1i128 << 54) + 3,
            i128::from(i64::MAX) - 511,
        ] {
            assert_eq!(to_f64(a).to_bits(), (a as f64).to_bits(), "{a} as f64");
            assert_eq!(to_f64(-a).to_bits(), (-a as f64).to_bits(), "-{a} as f64");
        }
    }

    // 5 calls at once, then one per second (ticks are microseconds here).
    const P: Params = Params {
        interval: 1_000_000,
        limit: 5,
        tolerance: 5_000_000,
    };
    const T0: i128 = 1_700_000_000_000_000;

    fn run(calls: &[(i128, i64)]) -> Vec<(bool, i128, Option<i128>, i128)> {
        let mut tat = None;
        calls
            .iter()
            .map(|&(now, cost)| {
                let out = decide(&P, cost, now, tat);
                if let Some(t) = out.write {
                    tat = Some(t);
                }
                (
                    out.allowed,
                    out.ttl,
                    out.retry_after,
                    remaining(&P, out.ttl),
                )
            })
            .collect()
    }

    #[test]
    fn burst_of_limit_then_one_per_interval() {
        let r = run(&[(T0, 1); 6]);
        assert_eq!(r[0], (true, 1_000_000, None, 4));
        assert_eq!(r[4], (true, 5_000_000, None, 0));
        assert_eq!(r[5], (false, 5_000_000, Some(1_000_000), 0));
        // Exactly one interval later exactly one more, and not a microsecond earlier.
        let mut calls = vec![(T0, 5)];
        calls.push((T0 + 999_999, 1));
        calls.push((T0 + 1_000_000, 1));
        calls.push((T0 + 1_000_000, 1));
        calls.push((T0 + 2_000_000, 1));
        let r = run(&calls);
        assert_eq!(r[1], (false, 4_000_001, Some(1), 0));
        assert_eq!(r[2], (true, 5_000_000, None, 0));
        assert_eq!(r[3], (false, 5_000_000, Some(1_000_000), 0));
        assert_eq!(r[4], (true, 5_000_000, None, 0));
    }

    #[test]
    fn redis_cell_reference_sequence() {
        // redis-cell's own limiter test: limit 5, one per second, in milliseconds of ticks.
        let ms = 1_000;
        let calls = [
            (T0, 6),
            (T0, 1),
            (T0, 1),
            (T0, 1),
            (T0, 1),
            (T0, 1),
            (T0, 1),
            (T0 + 3000 * ms, 1),
            (T0 + 3100 * ms, 1),
            (T0 + 4000 * ms, 1),
            (T0 + 8000 * ms, 1),
            (T0 + 9500 * ms, 1),
            (T0 + 9500 * ms, 0),
            (T0 + 9500 * ms, 2),
            (T0 + 9500 * ms, 5),
        ];
        let r = run(&calls);
        let s = 1_000_000;
        let expected = [
            (false, 0, None, 5),
            (true, s, None, 4),
            (true, 2 * s, None, 3),
            (true, 3 * s, None, 2),
            (true, 4 * s, None, 1),
            (true, 5 * s, None, 0),
            (false, 5 * s, Some(s), 0),
            (true, 3 * s, None, 2),
            (true, 3900 * ms, None, 1),
            (true, 4 * s, None, 1),
            (true, s, None, 4),
            (true, s, None, 4),
            (true, s, None, 4),
            (true, 3 * s, None, 2),
            (false, 3 * s, Some(3 * s), 2),
        ];
        assert_eq!(r, expected);
    }

    #[test]
    fn denial_and_zero_cost_write_nothing() {
        let full = Some(T0 + 5_000_000);
        assert_eq!(decide(&P, 1, T0, full).write, None);
        assert_eq!(decide(&P, 0, T0, full).write, None);
        assert!(decide(&P, 0, T0, full).allowed);
        assert_eq!(decide(&P, 0, T0, None).write, None);
        // A stored time further ahead than the tolerance (the clock went back): even a peek is
        // refused, and says when it would pass.
        let out = decide(&P, 0, T0 - 1, full);
        assert_eq!((out.allowed, out.retry_after), (false, Some(1)));
    }

    #[test]
    fn a_stale_time_counts_as_now() {
        let out = decide(&P, 1, T0, Some(T0 - 10_000_000));
        assert_eq!(
            (out.allowed, out.ttl, out.write),
            (true, 1_000_000, Some(T0 + 1_000_000))
        );
        // Never admissible, on a stale time: ttl is the stored time, remaining is capped.
        let out = decide(&P, 6, T0, Some(T0 - 7));
        assert_eq!((out.ttl, remaining(&P, out.ttl)), (-7, 5));
    }
}
