//! The Redis side: command registration, the panic guard at every entry point, and the glue
//! from each command to its pure core.

mod acl;
pub(crate) mod api;
mod clock;
mod commands;
mod docs;
mod info;
mod string_key;
mod zset_key;

use std::ffi::{CStr, CString, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use redis_module::{Context, ModuleOptions, RedisString, Status};

use crate::error::ErrorReply;
use crate::stats::CommandStats;

const INTERNAL_ERROR: ErrorReply =
    ErrorReply(c"ERR internal error in the rate limiter module (see the server log)");

type Body = fn(*mut RedisModuleCtx, &[*mut RedisModuleString]) -> Result<c_int, ErrorReply>;

/// Runs a command body with its arguments as a slice. A panic must never unwind into Redis (it
/// would abort the server), so it is caught here and answered with an error.
fn entry(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    body: Body,
) -> c_int {
    let argv: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` valid strings in `argv` for the duration of the call.
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    };
    match catch_unwind(AssertUnwindSafe(|| body(ctx, argv))) {
        Ok(Ok(status)) => status,
        Ok(Err(err)) => api::reply_error(ctx, err),
        Err(_) => api::reply_error(ctx, INTERNAL_ERROR),
    }
}

/// A command as registered with Redis.
struct Command {
    name: &'static CStr,
    handler: unsafe extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int,
    flags: &'static CStr,
    /// First key, last key, key step (0, 0, 0: no keys).
    keys: (c_int, c_int, c_int),
    /// Counters shown by INFO (limiter commands only).
    stats: Option<&'static CommandStats>,
}

fn register(ctx: *mut RedisModuleCtx, cmd: &Command) -> Result<(), String> {
    let create = api::api!(RedisModule_CreateCommand).map_err(|e| e.message().to_string())?;
    let (first, last, step) = cmd.keys;
    // Registered in lower case, as Redis names its own commands: Redis's arity error quotes the
    // registered name, and ours quote the same.
    let name = CString::new(cmd.name.to_bytes().to_ascii_lowercase()).map_err(|e| e.to_string())?;
    // SAFETY: valid load-time context; name and flags are NUL-terminated, Redis copies the name.
    let status = unsafe {
        create(
            ctx,
            name.as_ptr(),
            Some(cmd.handler),
            cmd.flags.as_ptr(),
            first,
            last,
            step,
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not register {}", cmd.name.to_string_lossy()));
    }
    match docs::doc_for(cmd.name) {
        Some(doc) => docs::set(ctx, cmd.name, doc),
        None => Ok(()),
    }
}

/// Module load: validates the load arguments, then registers the commands.
pub fn on_load(ctx: &Context, args: &[RedisString]) -> Status {
    let mut test_clock = false;
    for arg in args {
        if arg.as_slice().eq_ignore_ascii_case(b"TESTCLOCK") {
            test_clock = true;
        } else {
            ctx.log_warning(&format!(
                "ratelimit: refusing to load: unknown argument '{}' (the only one is TESTCLOCK, for tests)",
                arg.to_string_lossy()
            ));
            return Status::Err;
        }
    }
    // Keys are signalled as modified only when a call really writes them; a denial is a read.
    ctx.set_module_options(ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED);

    // Limiter commands only: RL.TESTCLOCK is never in the module's ACL category.
    let mut result = acl::add_category(ctx).and_then(|acl| {
        commands::ALL
            .iter()
            .try_for_each(|cmd| register(ctx.ctx, cmd).and_then(|()| acl.assign(ctx.ctx, cmd)))
    });
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
