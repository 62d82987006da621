//! The sliding log's whole path (arguments, the reads of a stored sorted set with entry checks,
//! the core, the append) on arbitrary arguments, arbitrary stored entries and arbitrary times,
//! calls chained on one key. Beyond "never panics": a reply is coherent, a denial, a peek or an
//! error changes nothing, and an admitted call adds exactly its cost in entries after trimming
//! only entries that left the window.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::command::sliding_log;
use redis_rate_limiter::core::Operation;
use redis_rate_limiter::codec::error::ErrorReply;
use redis_rate_limiter::store::{
    Effect, EntryVisitor, FieldName, Slot, Store, member_name,
};
use redis_rate_limiter::store::zset;

/// A sorted set in Redis order (score, then member bytes).
#[derive(Default, Clone, PartialEq, Debug)]
struct Key {
    entries: Vec<(f64, Vec<u8>)>,
    expire_at_ms: i64,
}

impl Key {
    fn sort(&mut self) {
        self.entries
            .sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
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
        if let Effect::Pop { trim_up_to, count, expire_at_ms } = effect {
            if let Some(up_to) = trim_up_to {
                self.entries.retain(|(s, _)| *s > *up_to);
            }
            let keep = self.entries.len().saturating_sub(*count as usize);
            self.entries.truncate(keep);
            if let Some(at) = expire_at_ms {
                self.expire_at_ms = *at;
            }
            return Ok(());
        }
        let Effect::Append { entries, expire_at_ms } = effect else {
            panic!("the sliding log set a string");
        };
        if let Some(up_to) = entries.trim_up_to {
            self.entries.retain(|(s, _)| *s > up_to);
        }
        let mut name = Vec::new();
        for i in entries.first_index..entries.first_index + entries.count {
            member_name(entries.score, i, &mut name);
            self.entries.retain(|(_, m)| *m != name);
            self.entries.push((entries.score, name.clone()));
        }
        self.sort();
        self.expire_at_ms = *expire_at_ms;
        Ok(())
    }
}

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
            if score.is_nan() || key.entries.len() > 2_000 {
                continue;
            }
            key.entries.retain(|(_, m)| m != member);
            key.entries.push((score, member.to_vec()));
            key.sort();
            continue;
        }
        let args: Vec<&[u8]> = payload.split(|&b| b == 0).collect();
        let Ok(request) = sliding_log::parse(&args) else { continue };
        if let Operation::Consume(cost) = request.op && cost > 5_000.0 {
            continue;
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
                    let kept = before.entries.iter().filter(|(s, _)| *s > window_start).count();
                    assert!(key.entries.len() <= kept + cost, "more than cost entries added");
                    // An entry still in the window stays, unless the call wrote its member anew
                    // (ZADD moves a member that is already there).
                    let written: Vec<&Vec<u8>> = key
                        .entries
                        .iter()
                        .filter(|e| !before.entries.contains(e))
                        .map(|(_, m)| m)
                        .collect();
                    assert!(
                        before
                            .entries
                            .iter()
                            .filter(|(s, _)| *s > window_start)
                            .all(|e| key.entries.contains(e) || written.contains(&&e.1)),
                        "an entry still in the window was removed"
                    );
                }
            }
        }
    }
});
