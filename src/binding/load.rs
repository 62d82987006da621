//! Module load: the load arguments, the module APIs the commands need, then every command, its
//! ACL category, the module's config, its INFO section and, for tests, the test clock. Module
//! unload: what the module keeps for its life, freed.

use std::ffi::{CString, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use redis_module::{Context, ModuleOptions, Status};

use crate::binding::entry::Command;
use crate::binding::{acl, api, clock, commands, config, docs, info, required};
use crate::codec::owner;
use crate::observe::stats::with_top;

fn register(ctx: *mut RedisModuleCtx, cmd: &Command) -> Result<(), String> {
    let create = api::api!(RedisModule_CreateCommand).map_err(|e| e.message().to_string())?;
    let d = cmd.descriptor;
    let (first, last, step) = d.key_range();
    // Registered in lower case, as Redis names its own commands: Redis's arity error quotes the
    // registered name, and ours quote the same.
    let name = CString::new(d.name.to_bytes().to_ascii_lowercase()).map_err(|e| e.to_string())?;
    // SAFETY: valid load-time context; name and flags are NUL-terminated, Redis copies the name.
    let status = unsafe {
        create(
            ctx,
            name.as_ptr(),
            Some(cmd.handler),
            d.flags.as_ptr(),
            first,
            last,
            step,
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not register {}", d.name.to_string_lossy()));
    }
    docs::set(ctx, d)
}

/// The module's name: its commands' prefix in logs, its configs' (`ratelimit.top-slots`) and its
/// INFO sections'.
const NAME: &std::ffi::CStr = c"ratelimit";
const VERSION: c_int = 1;

/// Module load (`RedisModule_OnLoad`): binds the module API, then `load`. Nothing is allocated
/// before the API is bound: from then on every allocation goes through the server's allocator.
///
/// # Safety
/// `ctx` is the server's load context and `argv` holds `argc` valid strings.
pub unsafe fn on_load(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    let err = raw::REDISMODULE_ERR as c_int;
    // SAFETY: the server's context; the name is NUL-terminated and static.
    let init = unsafe {
        raw::Export_RedisModule_Init(
            ctx,
            NAME.as_ptr(),
            VERSION,
            raw::REDISMODULE_APIVER_1 as c_int,
        )
    };
    if init == err {
        return err;
    }
    let argv: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: the server passes `argc` valid strings, alive during the load.
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    };
    let loaded = catch_unwind(AssertUnwindSafe(|| {
        // The server's main thread keeps RL.TOP's keys and the limiters' remembered arguments
        // (its commands run there).
        owner::claim();
        // SAFETY: the load arguments live for the whole load and are not modified.
        let args: Vec<&[u8]> = argv
            .iter()
            .map(|s| unsafe { api::string_bytes(*s) })
            .collect();
        load(&Context::new(ctx), &args)
    }));
    match loaded {
        Ok(Status::Ok) => raw::REDISMODULE_OK as c_int,
        _ => err,
    }
}

/// Validates the load arguments, then registers the commands.
fn load(ctx: &Context, raw_args: &[&[u8]]) -> Status {
    let (top_slots, rest) = match config::load_argument(raw_args) {
        Ok(found) => found,
        Err(e) => {
            ctx.log_warning(&format!("ratelimit: refusing to load: {e}"));
            return Status::Err;
        }
    };
    let mut test_clock = false;
    for arg in rest {
        if arg.eq_ignore_ascii_case(b"TESTCLOCK") {
            test_clock = true;
        } else {
            ctx.log_warning(&format!(
                "ratelimit: refusing to load: unknown argument '{}' (the arguments are top-slots N and, for tests, TESTCLOCK)",
                String::from_utf8_lossy(arg)
            ));
            return Status::Err;
        }
    }
    // Every API a command calls must be there: refuse now, naming them, rather than answer
    // every call with an error later.
    let mut needed = required::required();
    if test_clock {
        needed.extend(required::test_clock());
    }
    if let Some(missing) = required::missing(&needed) {
        ctx.log_warning(&format!(
            "ratelimit: refusing to load: this server lacks module APIs the commands call: {missing}"
        ));
        return Status::Err;
    }
    if let Some(absent) = required::missing(&required::optional()) {
        ctx.log_notice(&format!(
            "ratelimit: optional module APIs absent, done without: {absent}"
        ));
    }
    // Keys are signalled as modified only when a call really writes them; a denial is a read.
    ctx.set_module_options(ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED);

    // Limiter commands only: RL.TESTCLOCK is never in the module's ACL category; the operator
    // command is in the server's @admin, outside the limiters' category.
    let mut result = acl::add_category(ctx).and_then(|acl| {
        commands::all_commands().try_for_each(|cmd| {
            register(ctx.ctx, &cmd).and_then(|()| acl.assign(ctx.ctx, cmd.descriptor))
        })?;
        register(ctx.ctx, &commands::TOP)
            .and_then(|()| acl.assign_operator(ctx.ctx, commands::TOP.descriptor))
    });
    if result.is_ok() {
        result = config::register(ctx.ctx, top_slots);
    }
    if result.is_ok() {
        result = info::register(ctx.ctx).map_err(str::to_string);
    }
    if test_clock && result.is_ok() {
        ctx.log_warning(
            "ratelimit: TESTCLOCK is on: time stands still until RL.TESTCLOCK moves it",
        );
        result = clock::enable_test_clock(ctx.ctx)
            .map_err(str::to_string)
            .and_then(|()| register(ctx.ctx, &commands::TEST_CLOCK));
    }
    match result {
        Ok(()) => Status::Ok,
        Err(e) => {
            ctx.log_warning(&format!("ratelimit: refusing to load: {e}"));
            Status::Err
        }
    }
}

/// Module unload (`MODULE UNLOAD`): frees what the module allocated and kept for its life, which
/// Redis counts in `used_memory` (the module allocates through Redis): `RL.TOP`'s slots and the
/// Redis strings kept for names. Redis runs nothing of the module after this, and a load that
/// follows starts from empty cells.
pub fn on_unload(_ctx: *mut RedisModuleCtx) -> c_int {
    let freed = catch_unwind(|| {
        with_top(|t| t.resize(0));
        api::free_kept_strings();
    });
    match freed {
        Ok(()) => raw::REDISMODULE_OK as c_int,
        Err(_) => raw::REDISMODULE_ERR as c_int,
    }
}
