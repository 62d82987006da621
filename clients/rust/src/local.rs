//! The in-process fallback, used while Redis is unreachable: a token bucket per key with the
//! limit and rate divided by the expected number of instances (settled reservations give tokens
//! back or take more, into debt if need be), and for concurrency limits a counting semaphore per
//! key (the limit divided alike) whose leases expire as on Redis.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::algorithm::{Algorithm, Concurrency};
use crate::types::Decision;

const MAX_KEYS: usize = 100_000;

#[derive(Debug, Default)]
pub(crate) struct LocalLimiter {
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl LocalLimiter {
    /// Capacity and rate of the local share of `algo` for `instances` instances.
    pub(crate) fn share(algo: &Algorithm, instances: u32) -> (u64, f64) {
        let n = instances.max(1);
        let capacity = (algo.limit() / u64::from(n)).max(1);
        (capacity, algo.rate_per_sec() / f64::from(n))
    }

    pub(crate) fn check(&self, key: &str, algo: &Algorithm, instances: u32, cost: u64) -> Decision {
        let (capacity, rate) = Self::share(algo, instances);
        let cap = capacity as f64;
        let now = Instant::now();
        let mut map = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_KEYS && !map.contains_key(key) {
            map.retain(|_, (tokens, ts)| {
                *tokens + now.duration_since(*ts).as_secs_f64() * rate < cap
            });
        }
        let entry = map.entry(key.to_string()).or_insert((cap, now));
        let tokens = (entry.0 + now.duration_since(entry.1).as_secs_f64() * rate).min(cap);
        let c = cost as f64;
        let allowed = c <= tokens;
        let left = if allowed && cost > 0 {
            *entry = (tokens - c, now);
            tokens - c
        } else {
            tokens
        };
        let retry_after_ms = if allowed {
            0
        } else if cost > capacity {
            -1
        } else {
            ((c - tokens) * 1000.0 / rate).ceil() as i64
        };
        Decision {
            allowed,
            remaining: left.floor() as u64,
            retry_after_ms,
            reset_after_ms: ((cap - left) * 1000.0 / rate).ceil() as u64,
            limit: capacity,
        }
    }
}

impl LocalLimiter {
    /// A partial grant from the in-process bucket: what it has left (whole units), at most `n`;
    /// nothing left is the denial of one unit.
    pub(crate) fn grant(
        &self,
        key: &str,
        algo: &Algorithm,
        instances: u32,
        n: u64,
    ) -> (Decision, u64) {
        let left = self.check(key, algo, instances, 0).remaining;
        let g = left.min(n).max(1);
        let d = self.check(key, algo, instances, g);
        (d, if d.allowed { g } else { 0 })
    }
}

impl LocalLimiter {
    /// Gives back `-delta` tokens (never above the capacity) or takes `delta` more, below zero
    /// if need be, down to minus the capacity (as the module's token bucket): a bucket in debt
    /// denies until it has refilled past it.
    pub(crate) fn adjust(
        &self,
        key: &str,
        algo: &Algorithm,
        instances: u32,
        delta: i64,
    ) -> Decision {
        let (capacity, rate) = Self::share(algo, instances);
        let cap = capacity as f64;
        let now = Instant::now();
        let mut map = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(key.to_string()).or_insert((cap, now));
        let tokens = (entry.0 + now.duration_since(entry.1).as_secs_f64() * rate).min(cap);
        let left = (tokens - delta as f64).clamp(-cap, cap);
        if delta != 0 {
            *entry = (left, now);
        }
        Decision {
            allowed: true,
            remaining: left.max(0.0).floor() as u64,
            retry_after_ms: 0,
            reset_after_ms: ((cap - left) * 1000.0 / rate).ceil() as u64,
            limit: capacity,
        }
    }
}

/// Whole milliseconds from `now` to `t` (rounded up, 0 if past).
fn ms_until(t: Instant, now: Instant) -> u64 {
    let us = t.saturating_duration_since(now).as_micros();
    u64::try_from(us.div_ceil(1000)).unwrap_or(u64::MAX)
}

/// Live leases per key: lease id -> expiry.
#[derive(Debug, Default)]
pub(crate) struct LocalLeases {
    keys: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

impl LocalLeases {
    /// The local share of `limit` for `instances` instances.
    pub(crate) fn share(limit: &Concurrency, instances: u32) -> u64 {
        (limit.limit / u64::from(instances.max(1))).max(1)
    }

    /// Takes (or renews) a slot of `key` for `id`; with `take` false only says whether it would.
    pub(crate) fn acquire(
        &self,
        key: &str,
        id: &str,
        limit: &Concurrency,
        instances: u32,
        take: bool,
    ) -> Decision {
        let share = Self::share(limit, instances);
        let lease = Duration::try_from_secs_f64(limit.lease_sec).unwrap_or(Duration::ZERO);
        let now = Instant::now();
        let mut map = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_KEYS && !map.contains_key(key) {
            map.retain(|_, leases| leases.values().any(|&t| t > now));
        }
        let leases = map.entry(key.to_string()).or_default();
        leases.retain(|_, t| *t > now);
        let held = leases.contains_key(id);
        let allowed = held || (leases.len() as u64) < share;
        if allowed && take {
            leases.insert(id.to_string(), now + lease);
        }
        let mut expiries: Vec<Instant> = leases.values().copied().collect();
        expiries.sort();
        let live = expiries.len() as u64;
        let retry_after_ms = if allowed {
            0
        } else {
            // The slot frees when live - share + 1 leases have expired.
            let i = usize::try_from(live - share).unwrap_or(usize::MAX);
            expiries.get(i).map_or(0, |&t| ms_until(t, now)) as i64
        };
        let decision = Decision {
            allowed,
            remaining: share.saturating_sub(live),
            retry_after_ms,
            reset_after_ms: expiries.last().map_or(0, |&t| ms_until(t, now)),
            limit: share,
        };
        if leases.is_empty() {
            map.remove(key);
        }
        decision
    }

    /// Frees `id`'s slot of `key`; whether it held a live one.
    pub(crate) fn release(&self, key: &str, id: &str) -> bool {
        let now = Instant::now();
        let mut map = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let Some(leases) = map.get_mut(key) else {
            return false;
        };
        let live = leases.remove(id).is_some_and(|t| t > now);
        leases.retain(|_, t| *t > now);
        if leases.is_empty() {
            map.remove(key);
        }
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_take_refunds_and_go_into_debt() {
        let l = LocalLimiter::default();
        // 100 tokens here, refilling one per 10,000 s: nothing refills during the test.
        let a = Algorithm::TokenBucket {
            capacity: 200,
            refill_per_sec: 0.0002,
        };
        let d = l.check("k", &a, 2, 40);
        assert_eq!((d.allowed, d.remaining, d.limit), (true, 60, 100));
        let r = l.adjust("k", &a, 2, -30);
        assert_eq!((r.allowed, r.remaining, r.retry_after_ms), (true, 90, 0));
        assert!(
            (99_999_000..=100_000_000).contains(&r.reset_after_ms),
            "{r:?}"
        );
        // Refunds stop at the capacity.
        assert_eq!(l.adjust("k", &a, 2, -50).remaining, 100);
        assert_eq!(l.adjust("k", &a, 2, 0).remaining, 100);
        // 130 more: 30 of debt; one token is 31 tokens away.
        let debt = l.adjust("k", &a, 2, 130);
        assert_eq!(debt.remaining, 0);
        assert!(
            (1_299_999_000..=1_300_000_000).contains(&debt.reset_after_ms),
            "{debt:?}"
        );
        let denied = l.check("k", &a, 2, 1);
        assert!(!denied.allowed);
        assert!(
            (309_999_000..=310_000_000).contains(&denied.retry_after_ms),
            "{denied:?}"
        );
        // A debt is at most one capacity.
        let deepest = l.adjust("k", &a, 2, 1_000);
        assert!(
            (1_999_999_000..=2_000_000_000).contains(&deepest.reset_after_ms),
            "{deepest:?}"
        );
        // An unknown key starts full.
        assert_eq!(l.adjust("new", &a, 2, -5).remaining, 100);
    }

    #[test]
    fn leases_take_renew_release_and_expire() {
        let l = LocalLeases::default();
        let c = Concurrency {
            limit: 4,
            lease_sec: 0.2,
        };
        // Two instances: two slots here.
        let a = l.acquire("k", "a", &c, 2, true);
        assert_eq!(
            (a.allowed, a.remaining, a.retry_after_ms, a.limit),
            (true, 1, 0, 2)
        );
        assert!(a.reset_after_ms > 150 && a.reset_after_ms <= 200, "{a:?}");
        assert!(l.acquire("k", "b", &c, 2, true).allowed);
        let full = l.acquire("k", "c", &c, 2, true);
        assert_eq!((full.allowed, full.remaining), (false, 0));
        assert!(
            full.retry_after_ms > 150 && full.retry_after_ms <= 200,
            "{full:?}"
        );
        // A peek takes nothing; a holder renews without a second slot.
        assert!(!l.acquire("k", "c", &c, 2, false).allowed);
        let renewed = l.acquire("k", "a", &c, 2, true);
        assert_eq!((renewed.allowed, renewed.remaining), (true, 0));
        assert!(l.release("k", "a"));
        assert!(!l.release("k", "a"), "released once");
        assert_eq!(l.acquire("k", "c", &c, 2, true).remaining, 0);
        assert!(l.acquire("other", "a", &c, 2, false).allowed);
        std::thread::sleep(Duration::from_millis(210));
        let d = l.acquire("k", "d", &c, 2, false);
        assert_eq!((d.allowed, d.remaining, d.reset_after_ms), (true, 2, 0));
        assert!(!l.release("k", "b"), "expired");
        assert!(l.keys.lock().unwrap().is_empty());
    }
}
