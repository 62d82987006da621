//! Every limiter of numbers' whole decision path (argument parsing, stored-state checks of both
//! layouts, core, `%.17g` encoding) on arbitrary arguments, arbitrary stored values and
//! arbitrary times, calls chained on one key. Beyond "never panics", each reply must be coherent.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::command::fixed_window::FixedWindow;
use redis_rate_limiter::command::gcra::Gcra;
use redis_rate_limiter::command::leaky_bucket::LeakyBucket;
use redis_rate_limiter::command::sliding_window::SlidingWindow;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::core::Reply;
use redis_rate_limiter::codec::error::ErrorReply;
use redis_rate_limiter::store::string::{self, FieldsLimiter};
use redis_rate_limiter::store::{Effect, EntryVisitor, FieldName, Slot, Store};

/// A key: empty, a string (the stored layout) or a hash (the earlier layout).
#[derive(Debug, Default, Clone, PartialEq)]
enum Value {
    #[default]
    Empty,
    Str(Vec<u8>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
}

#[derive(Default)]
struct Key {
    value: Value,
    expire_at_ms: i64,
}

impl Store for Key {
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        Ok(match &self.value {
            Value::Empty => Slot::Empty,
            Value::Str(v) => Slot::Value(v),
            Value::Hash(_) => Slot::Hash,
        })
    }

    fn legacy_fields(
        &self,
        names: &[&'static FieldName],
        out: &mut [Option<Vec<u8>>],
    ) -> Result<(), ErrorReply> {
        if let Value::Hash(h) = &self.value {
            for (slot, name) in out.iter_mut().zip(names) {
                *slot = h.get(name.name.to_bytes()).cloned();
            }
        }
        Ok(())
    }

    // These limiters never keep a sorted set.
    fn zset_len(&self) -> Result<i64, ErrorReply> {
        Ok(0)
    }

    fn zset_count(&self, _: f64, _: bool, _: f64) -> Result<i64, ErrorReply> {
        Ok(0)
    }

    fn zset_from_last(&self, _: i64, _: &mut EntryVisitor<'_>) -> Result<bool, ErrorReply> {
        Ok(false)
    }

    fn zset_score(&self, _: &[u8]) -> Result<Option<f64>, ErrorReply> {
        Ok(None)
    }

    fn apply(&mut self, effect: &Effect<'_>) -> Result<(), ErrorReply> {
        match effect {
            Effect::Set {
                value,
                expire_at_ms,
            } => {
                self.value = Value::Str(value.to_vec());
                self.expire_at_ms = *expire_at_ms;
                Ok(())
            }
            Effect::Append { .. } | Effect::Lease { .. } | Effect::Pop { .. } => {
                panic!("a limiter of numbers wrote a sorted set")
            }
        }
    }
}

fn coherent(r: &Reply) {
    assert!(r.remaining >= 0 && r.remaining <= r.limit, "{r:?}");
    assert!(r.retry_after_ms >= -1 && r.reset_after_ms >= 0, "{r:?}");
    assert!(!r.allowed || r.retry_after_ms == 0, "{r:?}");
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
        let Ok(parsed) = L::parse(&args) else { continue };
        let before = (key.value.clone(), key.expire_at_ms);
        match string::apply::<L, _, N>(&mut key, &parsed, now) {
            Ok(reply) => {
                coherent(&reply);
                if reply.allowed && (key.value.clone(), key.expire_at_ms) != before {
                    assert!(key.expire_at_ms >= now / 1000, "expiry in the past");
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
