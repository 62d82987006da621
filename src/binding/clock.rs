//! The time limiters decide with: the server's own clock, in microseconds.
//!
//! Loading the module with the `TESTCLOCK` argument replaces it with a clock that only the
//! `RL.TESTCLOCK` command moves, and routes every `TIME` call (from clients and from scripts) to
//! that clock, so that the module and the Lua twins can be compared at identical instants.
//! Without that load argument neither the command nor the routing exists.

use std::ffi::c_int;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_module::raw::{self, RedisModuleCommandFilterCtx, RedisModuleCtx, RedisModuleString};

use super::api::{self, api, string_bytes};
use crate::codec::error::ErrorReply;
use crate::codec::number::parse_integer;
use crate::command::descriptor::{ArgKind, Descriptor, Keys, arg, optional};
use crate::observe::stats::CommandStats;

/// `RL.TESTCLOCK SET|ADVANCE|GET|TIME [us]`, registered only with the `TESTCLOCK` load argument.
/// Flagged `write`: it changes the time every later call decides at, so a read-only replica and a
/// read-only script (`EVAL_RO`, `FCALL_RO`, a script flagged `no-writes`) refuse it, and with it
/// the `TIME` it stands in for.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: c"RL.TESTCLOCK",
    flags: c"write fast",
    keys: Keys::None,
    arity: -2,
    summary: c"Test clock (TESTCLOCK load argument only): SET or ADVANCE it in microseconds, GET it, or TIME as TIME replies",
    complexity: c"O(1)",
    args: &[
        arg(c"subcommand", ArgKind::String),
        optional(c"microseconds", ArgKind::Integer),
    ],
    arity_error: ErrorReply(c"ERR wrong number of arguments for 'rl.testclock' command"),
    all_keyword: None,
    stats: &STATS,
};

/// Never shown: INFO lists the limiters only.
static STATS: CommandStats = CommandStats::new();

static TEST_CLOCK_ON: AtomicBool = AtomicBool::new(false);
static TEST_CLOCK_US: AtomicI64 = AtomicI64::new(0);

/// The time the latest call decided at (`now_us`), for what observes that call.
static LAST_US: AtomicI64 = AtomicI64::new(0);

/// The time `now_us` last returned: the instant the current call decided at, read again without
/// asking the clock (the observation hook stamps denials with it).
pub fn decided_at_us() -> i64 {
    LAST_US.load(Ordering::Relaxed)
}

/// Current time in Unix microseconds.
pub fn now_us() -> i64 {
    let now = read_clock();
    LAST_US.store(now, Ordering::Relaxed);
    now
}

fn read_clock() -> i64 {
    if TEST_CLOCK_ON.load(Ordering::Relaxed) {
        return TEST_CLOCK_US.load(Ordering::Relaxed);
    }
    // Redis 7.2+ and Valkey keep the time the running command started at (the time `call()`
    // read before the command, the one every key expiry of that command is judged by; frozen for
    // the whole of a script or a transaction, as the server freezes it for expiries there): read
    // without asking the clock again. Failing that, the clock itself (`Microseconds`); on 7.0 the
    // process clock is the same clock (the module runs inside redis-server, and TIME reads it
    // with gettimeofday).
    // SAFETY: plain reads of function pointers written once, at module load.
    if let Some(cached) = unsafe { raw::RedisModule_CachedMicroseconds } {
        // SAFETY: takes no arguments, only reads the server's cached time.
        return unsafe { cached() };
    }
    // SAFETY: as above.
    if let Some(micros) = unsafe { raw::RedisModule_Microseconds } {
        // SAFETY: takes no arguments, only reads the clock.
        return unsafe { micros() };
    }
    // gettimeofday's clock, read directly (through the vDSO, no system call): `SystemTime`
    // would add a 128-bit division per call.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec that we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec
        .saturating_mul(1_000_000)
        .saturating_add(ts.tv_nsec / 1000)
}

/// Switches to the test clock, starting at the real time. Called only from module load.
pub fn enable_test_clock(ctx: *mut RedisModuleCtx) -> Result<(), &'static str> {
    TEST_CLOCK_US.store(now_us(), Ordering::Relaxed);
    TEST_CLOCK_ON.store(true, Ordering::Relaxed);
    let register = api!(RedisModule_RegisterCommandFilter).map_err(|_| "no command filter API")?;
    // SAFETY: valid load-time context; the callback is a plain extern "C" fn.
    let filter = unsafe {
        register(
            ctx,
            Some(route_time_to_test_clock),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    if filter.is_null() {
        return Err("could not register the TIME filter");
    }
    Ok(())
}

/// Rewrites `TIME` into `RL.TESTCLOCK TIME`.
unsafe extern "C" fn route_time_to_test_clock(fctx: *mut RedisModuleCommandFilterCtx) {
    let (Ok(get), Ok(replace), Ok(insert), Ok(create)) = (
        api!(RedisModule_CommandFilterArgGet),
        api!(RedisModule_CommandFilterArgReplace),
        api!(RedisModule_CommandFilterArgInsert),
        api!(RedisModule_CreateString),
    ) else {
        return;
    };
    // SAFETY: the filter context is valid during the callback; strings created with a NULL
    // context are handed over to the filter, which owns them from then on.
    unsafe {
        let name = get(fctx, 0);
        if name.is_null() || !string_bytes(name).eq_ignore_ascii_case(b"time") {
            return;
        }
        let command = create(ptr::null_mut(), c"RL.TESTCLOCK".as_ptr(), 12);
        let sub = create(ptr::null_mut(), c"TIME".as_ptr(), 4);
        replace(fctx, 0, command);
        insert(fctx, 1, sub);
    }
}

const TESTCLOCK_USAGE: ErrorReply =
    ErrorReply(c"ERR usage: RL.TESTCLOCK GET | TIME | SET <unix_us> | ADVANCE <us> | PANIC");

/// The latest time the test clock takes, in Unix µs (year 2255): every time the module stores or
/// replicates stays far from the integers' limits.
const MAX_TEST_US: i64 = 9_000_000_000_000_000;

const OUT_OF_RANGE: ErrorReply = ErrorReply(
    c"ERR the test clock's time must be between 0 and 9000000000000000 (Unix microseconds)",
);

/// `us` as the test clock's time, if it is one.
fn in_range(us: i64) -> Result<i64, ErrorReply> {
    if (0..=MAX_TEST_US).contains(&us) {
        Ok(us)
    } else {
        Err(OUT_OF_RANGE)
    }
}

/// `RL.TESTCLOCK GET | TIME | SET us | ADVANCE us`, registered only with the test clock.
pub fn test_clock_command(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<c_int, ErrorReply> {
    // SAFETY: argv strings live for the whole call.
    let arg = |i: usize| argv.get(i).map(|s| unsafe { string_bytes(*s) });
    let sub = arg(1).ok_or(TESTCLOCK_USAGE)?;
    // An integer, at most the clock's range in size (so a sum of two stays within i64).
    let value = || -> Result<i64, ErrorReply> {
        let v = arg(2).and_then(parse_integer).ok_or(TESTCLOCK_USAGE)?;
        if v.abs() <= MAX_TEST_US as f64 {
            Ok(v as i64)
        } else {
            Err(OUT_OF_RANGE)
        }
    };
    let now = if sub.eq_ignore_ascii_case(b"get") && argv.len() == 2 {
        TEST_CLOCK_US.load(Ordering::Relaxed)
    } else if sub.eq_ignore_ascii_case(b"set") && argv.len() == 3 {
        let v = in_range(value()?)?;
        TEST_CLOCK_US.store(v, Ordering::Relaxed);
        v
    } else if sub.eq_ignore_ascii_case(b"advance") && argv.len() == 3 {
        // Backwards too (a clock that steps back), but never before 0.
        let v = in_range(TEST_CLOCK_US.load(Ordering::Relaxed) + value()?)?;
        TEST_CLOCK_US.store(v, Ordering::Relaxed);
        v
    } else if sub.eq_ignore_ascii_case(b"time") && argv.len() == 2 {
        return reply_time(ctx, TEST_CLOCK_US.load(Ordering::Relaxed));
    } else if sub.eq_ignore_ascii_case(b"panic") && argv.len() == 2 {
        // Test-only, to prove that the entry guard turns a panic into an error reply instead of
        // letting it abort the server.
        std::panic::panic_any("RL.TESTCLOCK PANIC");
    } else {
        return Err(TESTCLOCK_USAGE);
    };
    Ok(api::reply_integer(ctx, now))
}

/// Replies as `TIME` does: two bulk strings, seconds and microseconds.
fn reply_time(ctx: *mut RedisModuleCtx, now_us: i64) -> Result<c_int, ErrorReply> {
    let array = api!(RedisModule_ReplyWithArray)?;
    let bulk = api!(RedisModule_ReplyWithStringBuffer)?;
    let secs = now_us.div_euclid(1_000_000).to_string();
    let micros = now_us.rem_euclid(1_000_000).to_string();
    // SAFETY: valid context; two elements follow the array header.
    unsafe {
        array(ctx, 2);
        bulk(ctx, secs.as_ptr().cast(), secs.len());
        bulk(ctx, micros.as_ptr().cast(), micros.len());
    }
    Ok(raw::REDISMODULE_OK as c_int)
}
