//! Concurrency leases' whole path (arguments, the reads of a stored sorted set with entry checks,
//! the core, the lease effect) for `RL.ACQUIRE` and `RL.RELEASE` on arbitrary arguments,
//! arbitrary stored entries and arbitrary times, calls chained on one key. Beyond "never
//! panics": a reply is coherent, a denial or an error changes nothing, an admitted acquire holds
//! its lease until `now + lease` and never removes a live lease of another id, and a release
//! removes only its own live lease.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::command::{acquire, release};
use redis_rate_limiter::codec::error::ErrorReply;
use redis_rate_limiter::store::{Effect, EntryVisitor, FieldName, Slot, Store};
use redis_rate_limiter::store::zset;

/// A sorted set in Redis order (score, then member bytes).
#[derive(Default, Clone, PartialEq, Debug)]
struct Key {
    entries: Vec<(f64, Vec<u8>)>,
    expire_at_ms: Option<i64>,
}

impl Key {
    fn sort(&mut self) {
        self.entries
            .sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    }

    fn live_others(&self, id: &[u8], now: i64) -> Vec<(f64, Vec<u8>)> {
        self.entries
            .iter()
            .filter(|(s, m)| *s > now as f64 && m != id)
            .cloned()
            .collect()
    }
}

impl Store for Key {
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        Ok(if self.entries.is_empty() { Slot::Empty } else { Slot::Zset })
    }

    fn legacy_fields(&self, _: &[&'static FieldName], _: &mut [Option<Vec<u8>>]) -> Result<(), ErrorReply> {
        Ok(())
    }

    fn zset_len(&self) -> Result<i64, ErrorReply> {
        Ok(self.entries.len() as i64)
    }

    fn zset_count(&self, min: f64, min_inclusive: bool, max: f64) -> Result<i64, ErrorReply> {
        let inside = |s: f64| (if min_inclusive { s >= min } else { s > min }) && s <= max;
        Ok(self.entries.iter().filter(|(s, _)| inside(*s)).count() as i64)
    }

    fn zset_from_last(&self, rank: i64, visit: &mut EntryVisitor<'_>) -> Result<bool, ErrorReply> {
        let i = self.entries.len() as i64 - 1 - rank;
        match usize::try_from(i).ok().and_then(|i| self.entries.get(i)) {
            Some((score, member)) if rank >= 0 => {
                visit(member, *score)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn zset_score(&self, member: &[u8]) -> Result<Option<f64>, ErrorReply> {
        Ok(self.entries.iter().find(|(_, m)| m == member).map(|(s, _)| *s))
    }

    fn apply(&mut self, effect: &Effect<'_>) -> Result<(), ErrorReply> {
        let Effect::Lease { trim_up_to, id, expiry, expire_at_ms } = effect else {
            panic!("a lease call wrote something else");
        };
        if let Some(up_to) = trim_up_to {
            self.entries.retain(|(s, _)| *s > *up_to);
        }
        self.entries.retain(|(_, m)| m != id);
        if let Some(e) = expiry {
            self.entries.push((*e, id.to_vec()));
        }
        self.sort();
        match expire_at_ms {
            Some(at) => self.expire_at_ms = Some(*at),
            None => assert!(self.entries.is_empty(), "a key with leases left got no expiry"),
        }
        Ok(())
    }
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
            if score.is_nan() || key.entries.len() > 2_000 {
                continue;
            }
            key.entries.retain(|(_, m)| m != member);
            key.entries.push((score, member.to_vec()));
            key.sort();
            continue;
        }
        let args: Vec<&[u8]> = payload.split(|&b| b == 0).collect();
        let before = key.clone();
        if op % 4 == 1 {
            let Ok(id) = release::parse(&args) else { continue };
            let own_live = before.entries.iter().any(|(s, m)| m == id && *s > now as f64);
            match zset::release(&mut key, id, now) {
                Err(_) => assert_eq!(key, before, "an error changed the key"),
                Ok(released) => {
                    assert_eq!(released, own_live);
                    if !released {
                        assert_eq!(key, before, "a release of nothing changed the key");
                    } else {
                        assert!(key.entries.iter().all(|(_, m)| m != id));
                        assert_eq!(key.live_others(id, now), before.live_others(id, now));
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
                    assert!(key.entries.contains(&(expiry, request.id.to_vec())));
                    assert_eq!(
                        key.live_others(request.id, now),
                        before.live_others(request.id, now),
                        "another live lease changed"
                    );
                    let live = key.entries.iter().filter(|(s, _)| *s > now as f64).count() as i64;
                    let was = before.entries.iter().filter(|(s, _)| *s > now as f64).count() as i64;
                    assert!(live <= was.max(request.params.limit), "over the limit");
                }
            }
        }
    }
});
