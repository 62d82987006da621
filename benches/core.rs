//! Micro-benchmarks of the pure code on the command path: the token-bucket decision, the `%.17g`
//! formatting of stored numbers, and argument parsing. No Redis involved; each figure is the cost
//! of one call (criterion's `time` line, per iteration).
//!
//! Run with `cargo bench --bench core` (or `make bench`, which also runs the server benchmark).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use redis_rate_limiter::codec::number::{G17_MAX_LEN, format_g17};
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::core::token_bucket::{self, Params, State};
use redis_rate_limiter::store::string::FieldsLimiter;

/// A plausible "now" in Unix microseconds.
const NOW_US: i64 = 1_700_000_000_123_456;

fn token_bucket_decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("token_bucket::decide");

    // Mostly admitting: large bucket, fast refill.
    let open = Params {
        capacity: 100.0,
        refill_per_sec: 1_000_000.0,
    };
    group.bench_function("new key", |b| {
        b.iter(|| token_bucket::decide(black_box(&open), black_box(1.0), black_box(NOW_US), None))
    });

    // Existing state, 1.5 ms old, half full: refills a little and admits.
    let half_full = State {
        tokens: 50.0,
        ts_us: (NOW_US - 1_500) as f64,
    };
    let slow = Params {
        capacity: 100.0,
        refill_per_sec: 10.0,
    };
    group.bench_function("admitted", |b| {
        b.iter(|| {
            token_bucket::decide(
                black_box(&slow),
                black_box(1.0),
                black_box(NOW_US),
                black_box(Some(half_full)),
            )
        })
    });

    // Empty bucket of capacity 1 refilling once a minute: denied, nothing to write.
    let tight = Params {
        capacity: 1.0,
        refill_per_sec: 1.0 / 60.0,
    };
    let empty = State {
        tokens: 0.0,
        ts_us: (NOW_US - 1_000) as f64,
    };
    group.bench_function("denied", |b| {
        b.iter(|| {
            token_bucket::decide(
                black_box(&tight),
                black_box(1.0),
                black_box(NOW_US),
                black_box(Some(empty)),
            )
        })
    });
    group.finish();
}

fn number_format_g17(c: &mut Criterion) {
    let mut group = c.benchmark_group("number::format_g17");
    // A timestamp: the integer fast path.
    group.bench_function("integral", |b| {
        let mut buf = [0u8; G17_MAX_LEN];
        b.iter(|| format_g17(black_box(1_700_000_000_123_456.0), &mut buf))
    });
    // A token count after a partial refill: not an integer, so it goes through snprintf.
    group.bench_function("non-integral", |b| {
        let mut buf = [0u8; G17_MAX_LEN];
        b.iter(|| format_g17(black_box(99.015), &mut buf))
    });
    group.finish();
}

fn args_token_bucket(c: &mut Criterion) {
    let mut group = c.benchmark_group("TokenBucket::parse");
    let two: [&[u8]; 2] = [b"100", b"1000000"];
    group.bench_function("capacity rate", |b| {
        b.iter(|| TokenBucket::parse(black_box(&two)))
    });
    let three: [&[u8]; 3] = [b"100", b"0.5", b"3"];
    group.bench_function("capacity rate cost", |b| {
        b.iter(|| TokenBucket::parse(black_box(&three)))
    });
    group.finish();
}

criterion_group!(
    benches,
    token_bucket_decide,
    number_format_g17,
    args_token_bucket
);
criterion_main!(benches);
