//! Every command's argument parser, and the stored-value readers, on arbitrary input: each
//! returns a value or an error, never panics. Arguments are the input split at NUL bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::codec::error::ErrorReply;
use redis_rate_limiter::command::fixed_window::FixedWindow;
use redis_rate_limiter::command::gcra::Gcra;
use redis_rate_limiter::command::leaky_bucket::LeakyBucket;
use redis_rate_limiter::command::sliding_window::SlidingWindow;
use redis_rate_limiter::command::token_bucket::TokenBucket;
use redis_rate_limiter::command::{acquire, all, release, settle, sliding_log, throttle};
use redis_rate_limiter::store::string::{self, FieldsLimiter};

fuzz_target!(|data: &[u8]| {
    let args: Vec<&[u8]> = data.split(|&b| b == 0).collect();
    let _ = TokenBucket::parse(&args);
    let _ = string::parse::<TokenBucket, 2>(&args);
    let _ = LeakyBucket::parse(&args);
    let _ = string::parse::<LeakyBucket, 2>(&args);
    let _ = FixedWindow::parse(&args);
    let _ = string::parse::<FixedWindow, 2>(&args);
    let _ = SlidingWindow::parse(&args);
    let _ = string::parse::<SlidingWindow, 3>(&args);
    let _ = Gcra::parse(&args);
    let _ = string::parse::<Gcra, 1>(&args);
    let _ = sliding_log::parse(&args);
    let _ = sliding_log::parse_call(&args);
    let _ = acquire::parse(&args);
    let _ = release::parse(&args);
    let _ = throttle::parse(&args);
    let _ = throttle::decode(data);
    if let Ok(call) = all::parse(&args) {
        assert_eq!(call.keys.len(), call.limits.len());
    }
    if let Ok(call) = settle::parse(&args) {
        assert_eq!(call.keys.len(), call.limits.len());
    }
    let positions = all::key_positions(args.first().copied(), args.len());
    assert!(positions.end <= args.len() + 1);
    // A call longer than any valid one gets, from the part a parse reads, its whole error.
    let errors =
        |r: Result<all::Call, ErrorReply>| r.map(|c| c.limits.len()).map_err(|e| e.message());
    let part = all::read_part(&args, all::OPTION_WORDS);
    assert_eq!(errors(all::parse(&part)), errors(all::parse(&args)));
    let part = all::read_part(&args, settle::LAST_WORDS);
    assert_eq!(errors(settle::parse(&part)), errors(settle::parse(&args)));
});
