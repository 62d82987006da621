//! The module's configuration, through Redis's module config API: `CONFIG SET/GET
//! ratelimit.top-slots`, a `ratelimit.top-slots N` line in redis.conf after `loadmodule`, or
//! `MODULE LOADEX ... CONFIG ratelimit.top-slots N`; `top-slots N` as a load argument sets the
//! value the module starts with. Redis checks the range and answers a bad value with its own
//! error, changing nothing.
//!
//! A `CONFIG SET` of several configs sets each, then applies them; when one fails, the server
//! sets every one back to its old value. A module's apply callback may already have run by then
//! (Redis 8.2 runs it before the apply of a config named after it, which can still fail), so
//! the set callback only records the value, and `RL.TOP` is resized when the server announces a
//! `CONFIG SET` that succeeded (the config-change server event, fired after every config was
//! applied) and once the configs are loaded at load: a `CONFIG SET` that fails leaves `RL.TOP`
//! as it was.

use std::ffi::{CStr, c_int, c_longlong, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use super::api::api;
use crate::codec::number::parse_integer;
use crate::observe::stats::{DEFAULT_TOP_SLOTS, MAX_TOP_SLOTS, with_top};

/// The config's name without the module's prefix (Redis adds `ratelimit.`).
const TOP_SLOTS: &CStr = c"top-slots";

/// The value the server holds for `ratelimit.top-slots`: set (and set back when a `CONFIG SET`
/// fails), and given to `RL.TOP` once it is kept.
static TOP_SLOTS_VALUE: AtomicUsize = AtomicUsize::new(DEFAULT_TOP_SLOTS);

unsafe extern "C" fn get_top_slots(_name: *const i8, _privdata: *mut c_void) -> c_longlong {
    TOP_SLOTS_VALUE.load(Ordering::Relaxed) as c_longlong
}

unsafe extern "C" fn set_top_slots(
    _name: *const i8,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    // Redis has checked the range given at registration.
    let slots = usize::try_from(value).unwrap_or(0).min(MAX_TOP_SLOTS);
    TOP_SLOTS_VALUE.store(slots, Ordering::Relaxed);
    raw::REDISMODULE_OK as c_int
}

/// Resizes `RL.TOP` to the value set (nothing when it already has that many slots).
fn apply_top_slots() {
    let slots = TOP_SLOTS_VALUE.load(Ordering::Relaxed);
    with_top(|t| {
        if t.slots() != slots {
            t.resize(slots);
        }
    });
}

/// The config-change event: a `CONFIG SET` succeeded, every value it set is the server's now.
unsafe extern "C" fn config_changed(
    _ctx: *mut RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    // A panic must not unwind into the server; resizing allocates and could only fail that way.
    let _ = std::panic::catch_unwind(apply_top_slots);
}

/// The value of `top-slots N` (or `ratelimit.top-slots N`) among the load arguments, and the
/// arguments left; an error names a bad value.
pub fn load_argument<'a>(args: &'a [&'a [u8]]) -> Result<(Option<usize>, Vec<&'a [u8]>), String> {
    let mut slots = None;
    let mut rest = Vec::new();
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        let named = arg.eq_ignore_ascii_case(b"top-slots")
            || arg.eq_ignore_ascii_case(b"ratelimit.top-slots");
        if !named {
            rest.push(*arg);
            i += 1;
            continue;
        }
        let value = args.get(i + 1).copied().unwrap_or_default();
        match parse_integer(value) {
            Some(v) if (0.0..=MAX_TOP_SLOTS as f64).contains(&v) => slots = Some(v as usize),
            _ => {
                return Err(format!(
                    "top-slots must be an integer between 0 and {MAX_TOP_SLOTS}, not '{}'",
                    String::from_utf8_lossy(value)
                ));
            }
        }
        i += 2;
    }
    Ok((slots, rest))
}

/// Registers the configs (starting from `slots`, or the default) and loads the values redis.conf
/// or `MODULE LOADEX` give.
pub fn register(ctx: *mut RedisModuleCtx, slots: Option<usize>) -> Result<(), String> {
    let start = slots.unwrap_or(DEFAULT_TOP_SLOTS);
    TOP_SLOTS_VALUE.store(start, Ordering::Relaxed);
    let numeric = api!(RedisModule_RegisterNumericConfig).map_err(|e| e.message().to_string())?;
    let load = api!(RedisModule_LoadConfigs).map_err(|e| e.message().to_string())?;
    // SAFETY: valid load-time context; the name is NUL-terminated and static; the callbacks
    // match the API's signatures.
    let status = unsafe {
        numeric(
            ctx,
            TOP_SLOTS.as_ptr(),
            start as c_longlong,
            raw::REDISMODULE_CONFIG_DEFAULT,
            0,
            MAX_TOP_SLOTS as c_longlong,
            Some(get_top_slots),
            Some(set_top_slots),
            None,
            std::ptr::null_mut(),
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err("could not register the config ratelimit.top-slots".to_string());
    }
    // SAFETY: valid load-time context, after every config is registered.
    if unsafe { load(ctx) } != raw::REDISMODULE_OK as c_int {
        return Err("could not load the module's configs".to_string());
    }
    // Loading sets the values; not every server applies them then.
    apply_top_slots();
    let subscribe =
        api!(RedisModule_SubscribeToServerEvent).map_err(|e| e.message().to_string())?;
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_CONFIG,
        dataver: 1,
    };
    // SAFETY: valid load-time context; the callback matches the API's signature.
    if unsafe { subscribe(ctx, event, Some(config_changed)) } != raw::REDISMODULE_OK as c_int {
        return Err("could not subscribe to config changes".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_argument_sets_the_start_value() {
        let args: Vec<&[u8]> = vec![b"TESTCLOCK", b"top-slots", b"7"];
        assert_eq!(load_argument(&args), Ok((Some(7), vec![&b"TESTCLOCK"[..]])));
        let args: Vec<&[u8]> = vec![b"ratelimit.top-slots", b"0"];
        assert_eq!(load_argument(&args), Ok((Some(0), vec![])));
        for bad in [&b"x"[..], b"-1", b"10001", b""] {
            let args: Vec<&[u8]> = vec![b"top-slots", bad];
            assert!(load_argument(&args).is_err());
        }
    }
}
