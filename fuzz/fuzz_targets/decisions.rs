//! Every hash-backed limiter's whole decision path (argument parsing, stored-state checks, core, `%.17g`
//! encoding) on arbitrary arguments, arbitrary stored fields and arbitrary times, calls chained
//! on one key. Beyond "never panics", each reply must be coherent.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::command::fixed_window::FixedWindow;
use redis_rate_limiter::command::gcra::Gcra;
use redis_rate_limiter::command::leaky_bucket::LeakyBucket;
use redis_rate_limiter::command::sliding_window::SlidingWindow;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::core::Reply;
use redis_rate_limiter::error::ErrorReply;
use redis_rate_limiter::pipeline::{self, FieldName, HashLimiter, HashStore, KeyKind};

#[derive(Default)]
struct Key {
    fields: Option<BTreeMap<Vec<u8>, Vec<u8>>>,
    expire_at_ms: i64,
}

impl HashStore for Key {
    type Bytes = Vec<u8>;

    fn kind(&self) -> Result<KeyKind, ErrorReply> {
        Ok(if self.fields.is_some() { KeyKind::Hash } else { KeyKind::Empty })
    }

    fn get(&self, field: &'static FieldName) -> Result<Option<Vec<u8>>, ErrorReply> {
        Ok(self.fields.as_ref().and_then(|f| f.get(field.name.to_bytes()).cloned()))
    }

    fn write(&mut self, fields: &[(&'static FieldName, &[u8])], expire_at_ms: i64) -> Result<(), ErrorReply> {
        let map = self.fields.get_or_insert_with(BTreeMap::new);
        for (f, v) in fields {
            map.insert(f.name.to_bytes().to_vec(), v.to_vec());
        }
        self.expire_at_ms = expire_at_ms;
        Ok(())
    }
}

fn coherent(r: &Reply) {
    assert!(r.remaining >= 0 && r.remaining <= r.limit, "{r:?}");
    assert!(r.retry_after_ms >= -1 && r.reset_after_ms >= 0, "{r:?}");
    assert!(!r.allowed || r.retry_after_ms == 0, "{r:?}");
}

/// Runs calls described by `data` against one limiter: each record is
/// `[op, time delta (8 bytes), payload...]` separated by 0xFF; op picks a call or a state edit.
fn run<L: HashLimiter<N>, const N: usize>(data: &[u8]) {
    let mut key = Key::default();
    let mut now: i64 = 1_700_000_000_000_000;
    for record in data.split(|&b| b == 0xFF) {
        let Some((&op, rest)) = record.split_first() else { continue };
        let (delta, payload) = rest.split_at(rest.len().min(8));
        let mut d = [0u8; 8];
        d[..delta.len()].copy_from_slice(delta);
        now = now.wrapping_add(i64::from_le_bytes(d) >> 20).clamp(0, 1 << 53);
        if op % 4 == 0 {
            // Overwrite a stored field with arbitrary bytes.
            let field = L::FIELDS[usize::from(op / 4) % N].name.to_bytes().to_vec();
            key.fields.get_or_insert_with(BTreeMap::new).insert(field, payload.to_vec());
            continue;
        }
        let args: Vec<&[u8]> = payload.split(|&b| b == 0).collect();
        let Ok(parsed) = L::parse(&args) else { continue };
        let before = (key.fields.clone(), key.expire_at_ms);
        match pipeline::apply::<L, _, N>(&mut key, &parsed, now) {
            Ok(reply) => {
                coherent(&reply);
                if reply.allowed && (key.fields.clone(), key.expire_at_ms) != before {
                    assert!(key.expire_at_ms >= now / 1000, "expiry in the past");
                }
                if !reply.allowed {
                    assert_eq!((key.fields.clone(), key.expire_at_ms), before, "a denial wrote");
                }
            }
            Err(_) => assert_eq!((key.fields.clone(), key.expire_at_ms), before, "an error wrote"),
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
