//! Concurrency leases' whole path (arguments, the reads of a stored sorted set with entry checks,
//! the core, the lease effect) for `RL.ACQUIRE` and `RL.RELEASE` on arbitrary arguments,
//! arbitrary stored entries and arbitrary times, calls chained on one key. Beyond "never
//! panics": a reply is coherent, a denial or an error changes nothing, an admitted acquire holds
//! its lease until `now + lease` and never removes a live lease of another id, and a release
//! removes only its own live lease.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::command::{acquire, release};
use redis_rate_limiter::store::zset;

#[path = "shared/key.rs"]
mod key;
use key::Key;

/// The live leases of ids other than `id`.
fn live_others(key: &Key, id: &[u8], now: i64) -> Vec<(f64, Vec<u8>)> {
    key.entries()
        .iter()
        .filter(|(s, m)| *s > now as f64 && m != id)
        .cloned()
        .collect()
}

// Records `[op, time delta (8 bytes), payload...]` separated by 0xFF: an op divisible by 4 adds an
// entry from the payload (`score bytes (8) member...`), one of 1 mod 4 releases (the payload is
// the arguments split at NUL bytes), any other acquires.
fuzz_target!(|data: &[u8]| {
    let mut key = Key::default();
    let mut now: i64 = 1_700_000_000_000_000;
    for record in data.split(|&b| b == 0xFF) {
        let Some((&op, rest)) = record.split_first() else { continue };
        let (delta, payload) = rest.split_at(rest.len().min(8));
        let mut d = [0u8; 8];
        d[..delta.len()].copy_from_slice(delta);
        now = now.wrapping_add(i64::from_le_bytes(d) >> 24).clamp(0, 1 << 52);
        if op % 4 == 0 {
            let (score, member) = payload.split_at(payload.len().min(8));
            let mut s = [0u8; 8];
            s[..score.len()].copy_from_slice(score);
            let score = f64::from_le_bytes(s);
            if score.is_nan() || key.entries().len() > 2_000 {
                continue;
            }
            key.zadd(score, member);
            // The module's sets have an expiry; now and then one without.
            if op & 8 == 0 {
                key.expire_at_ms.get_or_insert(now / 1000 + 60_000);
            }
            continue;
        }
        let args: Vec<&[u8]> = payload.split(|&b| b == 0).collect();
        let before = key.clone();
        if op % 4 == 1 {
            let Ok(id) = release::parse(&args) else { continue };
            let own_live = before.entries().iter().any(|(s, m)| m == id && *s > now as f64);
            match zset::release(&mut key, id, now) {
                Err(_) => assert_eq!(key, before, "an error changed the key"),
                Ok(released) => {
                    assert_eq!(released, own_live);
                    if !released {
                        assert_eq!(key, before, "a release of nothing changed the key");
                    } else {
                        assert!(key.entries().iter().all(|(_, m)| m != id));
                        assert_eq!(live_others(&key, id, now), live_others(&before, id, now));
                    }
                }
            }
            continue;
        }
        let Ok(request) = acquire::parse(&args) else { continue };
        match zset::acquire(&mut key, &request, now) {
            Err(_) => assert_eq!(key, before, "an error changed the key"),
            Ok(r) => {
                assert!(r.remaining >= 0 && r.remaining < r.limit.max(1) + 1, "{r:?}");
                assert!(r.retry_after_ms >= -1 && r.reset_after_ms >= 0, "{r:?}");
                assert!(!r.allowed || r.retry_after_ms == 0, "{r:?}");
                if !r.allowed {
                    assert_eq!(key, before, "a denial changed the key");
                } else {
                    let expiry = now as f64 + request.params.lease_us;
                    assert!(key.entries().contains(&(expiry, request.id.to_vec())));
                    assert_eq!(
                        live_others(&key, request.id, now),
                        live_others(&before, request.id, now),
                        "another live lease changed"
                    );
                    let live = key.entries().iter().filter(|(s, _)| *s > now as f64).count() as i64;
                    let was = before.entries().iter().filter(|(s, _)| *s > now as f64).count() as i64;
                    assert!(live <= was.max(request.params.limit), "over the limit");
                }
            }
        }
    }
});
