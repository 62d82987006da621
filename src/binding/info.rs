//! The module's INFO sections: per limiter command, calls / allowed / denied / errors; and what
//! `RL.TOP` holds.
//!
//! Shown by `INFO modules`, `INFO ratelimit` and `INFO ratelimit_limits`, one line per command:
//! `ratelimit_rl_tokenbucket:calls=12,allowed=10,denied=2,errors=0`; then `INFO ratelimit_top`:
//! `ratelimit_top_slots`, `ratelimit_top_keys` (tracked now) and `ratelimit_top_bytes` (the
//! memory its slots take, all of it reserved when the number of slots is set); then
//! `INFO ratelimit_counters`: the same counters as `limits`, one number per line
//! (`ratelimit_rl_tokenbucket_calls:12`, `ratelimit_rl_tokenbucket_wrongtype:0`), the form
//! exporters that read `name:value` lines parse (docs/monitoring.md).

use std::ffi::{CString, c_int};

use redis_module::raw::RedisModuleInfoCtx;

use super::api::api;
use crate::command::registry::DESCRIPTORS;
use crate::observe::stats::top_figures;

pub fn register(ctx: *mut redis_module::raw::RedisModuleCtx) -> Result<(), &'static str> {
    let register = api!(RedisModule_RegisterInfoFunc).map_err(|e| e.message())?;
    // SAFETY: valid load-time context; the callback is a plain extern "C" fn.
    if unsafe { register(ctx, Some(info)) } == 0 {
        Ok(())
    } else {
        Err("could not register INFO")
    }
}

/// INFO, and the module's part of a crash report: a crash report may be written from another
/// thread while a command runs, so it leaves out what `RL.TOP` holds (kept by the server's main
/// thread, `stats::with_top`); the counters are atomics, read from anywhere.
unsafe extern "C" fn info(ctx: *mut RedisModuleInfoCtx, for_crash_report: c_int) {
    let _ = std::panic::catch_unwind(|| write_section(ctx, for_crash_report == 0));
}

fn write_section(
    ctx: *mut RedisModuleInfoCtx,
    with_top: bool,
) -> Result<(), crate::codec::error::ErrorReply> {
    let section = api!(RedisModule_InfoAddSection)?;
    let begin = api!(RedisModule_InfoBeginDictField)?;
    let end = api!(RedisModule_InfoEndDictField)?;
    let field = api!(RedisModule_InfoAddFieldULongLong)?;
    // SAFETY: valid INFO context; every name is a NUL-terminated string that outlives the call.
    unsafe {
        section(ctx, c"limits".as_ptr());
        for descriptor in DESCRIPTORS {
            let stats = descriptor.stats;
            let Ok(name) = CString::new(descriptor.info_name()) else {
                continue;
            };
            begin(ctx, name.as_ptr());
            for (label, value) in stats.snapshot() {
                let Ok(label) = CString::new(label) else {
                    continue;
                };
                field(ctx, label.as_ptr(), value);
            }
            end(ctx);
        }
        if with_top {
            let (slots, keys, bytes) = top_figures();
            section(ctx, c"top".as_ptr());
            field(ctx, c"top_slots".as_ptr(), slots as u64);
            field(ctx, c"top_keys".as_ptr(), keys as u64);
            field(ctx, c"top_bytes".as_ptr(), bytes as u64);
        }
        section(ctx, c"counters".as_ptr());
        for descriptor in DESCRIPTORS {
            let command = descriptor.info_name();
            for (label, value) in descriptor.stats.snapshot() {
                let Ok(name) = CString::new(format!("{command}_{label}")) else {
                    continue;
                };
                field(ctx, name.as_ptr(), value);
            }
        }
    }
    Ok(())
}
