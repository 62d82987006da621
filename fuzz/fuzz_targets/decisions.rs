//! Every limiter of numbers' whole decision path (argument parsing, stored-state checks of both
//! layouts, core, `%.17g` encoding) on arbitrary arguments, arbitrary stored values and
//! arbitrary times, calls chained on one key. Beyond "never panics", each reply must be coherent.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

#[path = "shared/key.rs"]
mod key;
use key::{Key, Value};
use redis_rate_limiter::command::fixed_window::FixedWindow;
use redis_rate_limiter::command::gcra::Gcra;
use redis_rate_limiter::command::leaky_bucket::LeakyBucket;
use redis_rate_limiter::command::sliding_window::SlidingWindow;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::core::{Operation, Reply};
use redis_rate_limiter::store::string::{self, FieldsLimiter};

fn coherent(r: &Reply) {
    assert!(r.remaining >= 0 && r.remaining <= r.limit, "{r:?}");
    assert!(r.retry_after_ms >= -1 && r.reset_after_ms >= 0, "{r:?}");
    assert!(!r.allowed || r.retry_after_ms == 0, "{r:?}");
    // A partial grant takes something exactly when it admits.
    assert!(r.granted.is_none_or(|g| (g > 0) == r.allowed && g >= 0), "{r:?}");
}

/// Runs calls described by `data` against one limiter: each record is
/// `[op, time delta (8 bytes), payload...]` separated by 0xFF; op picks a call or a state edit.
fn run<L: FieldsLimiter<N>, const N: usize>(data: &[u8]) {
    let mut key = Key::default();
    let mut now: i64 = 1_700_000_000_000_000;
    for record in data.split(|&b| b == 0xFF) {
        let Some((&op, rest)) = record.split_first() else { continue };
        let (delta, payload) = rest.split_at(rest.len().min(8));
        let mut d = [0u8; 8];
        d[..delta.len()].copy_from_slice(delta);
        now = now.wrapping_add(i64::from_le_bytes(d) >> 20).clamp(0, 1 << 53);
        if op % 4 == 0 {
            if op & 4 == 0 {
                // Overwrite the stored string with arbitrary bytes.
                key.value = Value::Str(payload.to_vec());
            } else {
                // A field of a hash in the earlier layout, with arbitrary bytes.
                let field = L::FIELDS[usize::from(op / 8) % N].name.to_bytes().to_vec();
                if !matches!(key.value, Value::Hash(_)) {
                    key.value = Value::Hash(BTreeMap::new());
                }
                if let Value::Hash(h) = &mut key.value {
                    h.insert(field, payload.to_vec());
                }
            }
            continue;
        }
        let args: Vec<&[u8]> = payload.split(|&b| b == 0).collect();
        let Ok(parsed) = string::parse::<L, N>(&args) else { continue };
        let before = (key.value.clone(), key.expire_at_ms);
        match string::apply::<L, _, N>(&mut key, &parsed, now) {
            Ok(reply) => {
                coherent(&reply);
                if let Operation::UpTo(n) = parsed.op {
                    assert!(reply.granted.is_some_and(|g| g as f64 <= n), "{reply:?}");
                }
                if reply.allowed && (key.value.clone(), key.expire_at_ms) != before {
                    assert!(key.expire_at_ms >= Some(now / 1000), "expiry in the past");
                    assert!(matches!(key.value, Value::Str(_)), "a limiter of numbers wrote a set");
                }
                if !reply.allowed {
                    assert_eq!((key.value.clone(), key.expire_at_ms), before, "a denial wrote");
                }
            }
            Err(_) => assert_eq!((key.value.clone(), key.expire_at_ms), before, "an error wrote"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 5 {
        0 => run::<TokenBucket, 2>(rest),
        1 => run::<LeakyBucket, 2>(rest),
        2 => run::<FixedWindow, 2>(rest),
        3 => run::<SlidingWindow, 3>(rest),
        _ => run::<Gcra, 1>(rest),
    }
});
