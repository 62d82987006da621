//! The sliding log's whole path (arguments, the reads of a stored sorted set with entry checks,
//! the core, the append) on arbitrary arguments, arbitrary stored entries and arbitrary times,
//! calls chained on one key. Beyond "never panics": a reply is coherent, a denial, a peek or an
//! error changes nothing, and an admitted call adds exactly its cost in entries after trimming
//! only entries that left the window, and at most max(cost, 128) of them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::command::sliding_log;
use redis_rate_limiter::core::Operation;
use redis_rate_limiter::store::zset;

#[path = "shared/key.rs"]
mod key;
use key::Key;

// Records `[op, time delta (8 bytes), payload...]` separated by 0xFF: an op divisible by 5 adds an
// entry from the payload (`score bytes (8) member...`), any other is a call whose arguments are the
// payload split at NUL bytes.
fuzz_target!(|data: &[u8]| {
    let mut key = Key::default();
    let mut now: i64 = 1_700_000_000_000_000;
    for record in data.split(|&b| b == 0xFF) {
        let Some((&op, rest)) = record.split_first() else { continue };
        let (delta, payload) = rest.split_at(rest.len().min(8));
        let mut d = [0u8; 8];
        d[..delta.len()].copy_from_slice(delta);
        now = now.wrapping_add(i64::from_le_bytes(d) >> 24).clamp(0, 1 << 53);
        if op % 5 == 0 {
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
        let Ok(request) = sliding_log::parse_call(&args) else { continue };
        if let Operation::Consume(cost) = request.op && cost > 1_000.0 {
            panic!("a cost above the sliding log's maximum parsed");
        }
        let before = key.clone();
        match zset::apply(&mut key, &request, now) {
            Err(_) => assert_eq!(key, before, "an error changed the key"),
            Ok(r) => {
                assert!(r.remaining >= 0 && r.remaining <= r.limit, "{r:?}");
                assert!(r.retry_after_ms >= -1 && r.reset_after_ms >= 0, "{r:?}");
                assert!(!r.allowed || r.retry_after_ms == 0, "{r:?}");
                let cost = request.op.units() as usize;
                if !r.allowed || cost == 0 {
                    assert_eq!(key, before, "a denial or a peek changed the key");
                } else {
                    let window_start = now as f64 - request.params.window_us;
                    let kept = before.entries().iter().filter(|(s, _)| *s > window_start).count();
                    let old = before.entries().len() - kept;
                    assert!(
                        key.entries().len() <= kept + cost + old.saturating_sub(cost.max(128)),
                        "more than cost entries added, or fewer old ones removed than it may"
                    );
                    assert!(
                        key.entries().len() + cost.max(128) >= before.entries().len(),
                        "more old entries removed than a call may"
                    );
                    // An entry still in the window stays, unless the call wrote its member anew
                    // (ZADD moves a member that is already there).
                    let written: Vec<&Vec<u8>> = key
                        .entries()
                        .iter()
                        .filter(|e| !before.entries().contains(e))
                        .map(|(_, m)| m)
                        .collect();
                    assert!(
                        before
                            .entries()
                            .iter()
                            .filter(|(s, _)| *s > window_start)
                            .all(|e| key.entries().contains(e) || written.contains(&&e.1)),
                        "an entry still in the window was removed"
                    );
                }
            }
        }
    }
});
