//! The module's configuration, through Redis's module config API: `CONFIG SET/GET
//! ratelimit.top-slots`, a `ratelimit.top-slots N` line in redis.conf after `loadmodule`, or
//! `MODULE LOADEX ... CONFIG ratelimit.top-slots N`; `top-slots N` as a load argument sets the
//! value the module starts with. Redis checks the range and answers a bad value with its own
//! error, changing nothing.

use std::ffi::{CStr, c_int, c_longlong, c_void};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use super::api::api;
use crate::codec::number::parse_integer;
use crate::observe::stats::{DEFAULT_TOP_SLOTS, MAX_TOP_SLOTS, with_top};

/// The config's name without the module's prefix (Redis adds `ratelimit.`).
const TOP_SLOTS: &CStr = c"top-slots";

unsafe extern "C" fn get_top_slots(_name: *const i8, _privdata: *mut c_void) -> c_longlong {
    with_top(|t| t.slots()) as c_longlong
}

unsafe extern "C" fn set_top_slots(
    _name: *const i8,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut RedisModuleString,
) -> c_int {
    // Redis has checked the range given at registration.
    let slots = usize::try_from(value).unwrap_or(0).min(MAX_TOP_SLOTS);
    with_top(|t| t.resize(slots));
    raw::REDISMODULE_OK as c_int
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
    with_top(|t| t.resize(start));
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
