//! The module's INFO section: per limiter command, calls / allowed / denied / errors.
//!
//! Shown by `INFO modules`, `INFO ratelimit` and `INFO ratelimit_limits`, one line per command:
//! `ratelimit_rl_tokenbucket:calls=12,allowed=10,denied=2,errors=0`.

use std::ffi::{CString, c_int};

use redis_module::raw::RedisModuleInfoCtx;

use super::api::api;
use crate::command::registry::DESCRIPTORS;

pub fn register(ctx: *mut redis_module::raw::RedisModuleCtx) -> Result<(), &'static str> {
    let register = api!(RedisModule_RegisterInfoFunc).map_err(|e| e.message())?;
    // SAFETY: valid load-time context; the callback is a plain extern "C" fn.
    if unsafe { register(ctx, Some(info)) } == 0 {
        Ok(())
    } else {
        Err("could not register INFO")
    }
}

unsafe extern "C" fn info(ctx: *mut RedisModuleInfoCtx, _for_crash_report: c_int) {
    let _ = std::panic::catch_unwind(|| write_section(ctx));
}

fn write_section(ctx: *mut RedisModuleInfoCtx) -> Result<(), crate::codec::error::ErrorReply> {
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
    }
    Ok(())
}
