//! Sequences of every command (`RL.SETTLE` and `RL.ALL` among them) with arbitrary arguments and
//! times on a keyspace of a few keys, through the module's own pipelines. What the module writes
//! it can always read back: after each call that wrote, a peek with the same parameters never
//! answers corrupt state; and no key grows past its bound: a string of a tag and at most three
//! numbers, a sorted set of at most the largest limit a call on it named.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::codec::error::ErrorReply;
use redis_rate_limiter::command::fixed_window::FixedWindow;
use redis_rate_limiter::command::gcra::Gcra;
use redis_rate_limiter::command::leaky_bucket::LeakyBucket;
use redis_rate_limiter::command::sliding_window::SlidingWindow;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::command::{acquire, all, release, settle, sliding_log, throttle};
use redis_rate_limiter::store::string::{self, FieldsLimiter};
use redis_rate_limiter::store::{Store, zset};

#[path = "shared/key.rs"]
mod key;
use key::{Key, Value};

const KEYS: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];

fn fields<L: FieldsLimiter<N>, const N: usize>(
    k: &mut Key,
    args: &[&[u8]],
    now: i64,
) -> Result<(), ErrorReply> {
    string::apply::<L, _, N>(k, &string::parse::<L, N>(args)?, now).map(|_| ())
}

/// One command on one key (`args` after the key).
fn one(command: u8, k: &mut Key, args: &[&[u8]], now: i64) -> Result<(), ErrorReply> {
    match command % 9 {
        0 => fields::<TokenBucket, 2>(k, args, now),
        1 => fields::<LeakyBucket, 2>(k, args, now),
        2 => fields::<FixedWindow, 2>(k, args, now),
        3 => fields::<SlidingWindow, 3>(k, args, now),
        4 => fields::<Gcra, 1>(k, args, now),
        5 => zset::apply(k, &sliding_log::parse_call(args)?, now).map(|_| ()),
        6 => zset::acquire(k, &acquire::parse(args)?, now).map(|_| ()),
        7 => zset::release(k, release::parse(args)?, now).map(|_| ()),
        _ => throttle::apply(k, &throttle::parse(args)?, now).map(|_| ()),
    }
}

/// `RL.ALL` or `RL.SETTLE` (`args` after the command name) on the keyspace.
fn multi(settling: bool, space: &mut BTreeMap<Vec<u8>, Key>, args: &[&[u8]], now: i64) -> Result<(), ErrorReply> {
    let mut call = if settling { settle::parse(args)? } else { all::parse(args)? };
    let names: Vec<Vec<u8>> = call.keys.iter().map(|k| k.to_vec()).collect();
    let mut keys: Vec<Key> = names.iter().map(|n| space.remove(n).unwrap_or_default()).collect();
    let mut stores: Vec<&mut dyn Store> = keys.iter_mut().map(|k| k as &mut dyn Store).collect();
    let r = redis_rate_limiter::store::all::apply_all(&mut call.limits, &mut stores, now, call.upto);
    for (n, k) in names.into_iter().zip(keys) {
        if k.value != Value::Empty {
            space.insert(n, k);
        }
    }
    r.map(|_| ())
}

fn is_corrupt(r: &Result<(), ErrorReply>) -> bool {
    matches!(r, Err(e) if e.message().contains("corrupt"))
}

// Records separated by 0xFF: `[op, key, time delta (4 bytes), payload]`, the payload split at NUL
// bytes into arguments. op % 11: 0..=8 one command on the key (the payload its arguments after
// the key), 9 `RL.ALL`, 10 `RL.SETTLE` (the payload their arguments, keys among them).
fuzz_target!(|data: &[u8]| {
    let mut space: BTreeMap<Vec<u8>, Key> = BTreeMap::new();
    // The largest limit a call named on each key: a sorted set never holds more.
    let mut limits: BTreeMap<Vec<u8>, f64> = BTreeMap::new();
    let mut now: i64 = 1_800_000_000_000_000;
    let mut latest = now;
    for record in data.split(|&b| b == 0xFF).take(64) {
        let [op, which, d0, d1, d2, d3, payload @ ..] = record else { continue };
        // Time moves on, or back by at most the minute a stored time may be ahead.
        let dt = i64::from(i32::from_le_bytes([*d0, *d1, *d2, *d3])) << 8;
        now = (now + dt).max(latest - 60_000_000).clamp(0, 7_000_000_000_000_000);
        latest = latest.max(now);
        for k in space.values_mut() {
            if k.expire_at_ms.is_some_and(|at| now / 1000 > at) {
                *k = Key::default();
            }
        }
        space.retain(|_, k| k.value != Value::Empty);
        let args: Vec<&[u8]> = payload.split(|&b| b == 0).collect();
        let op = op % 11;
        if op >= 9 {
            let before = space.clone();
            let r = multi(op == 10, &mut space, &args, now);
            assert!(!is_corrupt(&r), "{r:?}");
            if r.is_err() {
                assert_eq!(space, before, "an error wrote");
            }
            // Every sliding-log or concurrency limit of the call names its limit after the
            // keyword: remember the largest for the keys written.
            for (i, w) in args.iter().enumerate() {
                if w.eq_ignore_ascii_case(b"SLIDINGLOG") || w.eq_ignore_ascii_case(b"CONCURRENCY") {
                    let limit = args.get(i + 1).and_then(|l| std::str::from_utf8(l).ok()?.parse().ok());
                    for k in KEYS {
                        let e = limits.entry(k.to_vec()).or_insert(0.0);
                        *e = e.max(limit.unwrap_or(0.0));
                    }
                }
            }
        } else {
            let name = KEYS[usize::from(*which) % KEYS.len()].to_vec();
            let mut k = space.remove(&name).unwrap_or_default();
            let before = k.clone();
            let r = one(op, &mut k, &args, now);
            assert!(!is_corrupt(&r) || k == before, "a corrupt error wrote");
            if r.is_err() {
                assert_eq!(k, before, "an error wrote: {r:?}");
            }
            if matches!(op, 5 | 6) && r.is_ok() {
                let limit = args.first().and_then(|l| std::str::from_utf8(l).ok()?.parse().ok());
                let e = limits.entry(name.clone()).or_insert(0.0);
                *e = e.max(limit.unwrap_or(0.0));
            }
            let wrote = k != before && r.is_ok();
            // What it wrote, it reads: a peek with the same parameters (cost 0) is no corrupt.
            if wrote && op <= 5 {
                let mut peek = args.clone();
                match peek.len() {
                    n if n >= 2 && op != 4 => peek.truncate(2),
                    n if n >= 3 => peek.truncate(3),
                    _ => {}
                }
                peek.push(b"0");
                let mut copy = k.clone();
                let again = one(op, &mut copy, &peek, now);
                assert!(!is_corrupt(&again), "{again:?} after writing {:?}", k.value);
                assert_eq!(copy, k, "a peek wrote");
            }
            if k.value != Value::Empty {
                space.insert(name, k);
            }
        }
        for (name, k) in &space {
            match &k.value {
                Value::Str(v) => assert!(v.len() <= 8 + 3 * 26, "{v:?}"),
                Value::Zset(z) => {
                    let bound = limits.get(name).copied().unwrap_or(0.0);
                    assert!(z.len() as f64 <= bound, "{} entries, limit {bound}", z.len());
                }
                _ => {}
            }
        }
    }
});
