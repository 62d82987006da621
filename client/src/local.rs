//! The in-process fallback: a token bucket per key with the limit and rate divided by the
//! expected number of instances, used while Redis is unreachable.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::algorithm::Algorithm;
use crate::client::Decision;

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
