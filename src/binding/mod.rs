//! The Redis side: command registration, the panic guard at every entry point, and the glue
//! from each command to its pure core.

mod acl;
pub(crate) mod api;
mod clock;
mod commands;
mod config;
mod docs;
mod info;
mod key;
mod required;

use std::ffi::{CString, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use redis_module::{Context, ModuleOptions, RedisString, Status};

use crate::command::descriptor::Descriptor;
use crate::error::ErrorReply;
use crate::stats::{self, ErrorKind, Outcome};

const INTERNAL_ERROR: ErrorReply =
    ErrorReply(c"ERR internal error in the rate limiter module (see the server log)");

/// What a command's body answers, before it is sent.
trait Answer {
    /// `Some(admitted)` for a limiter's decision; `None` for a reply that is no decision
    /// (the test clock, a cluster key-position request), which is not observed.
    fn decision(&self) -> Option<bool>;
    /// The argument index of the key the decision is about (the command's key by default).
    fn key_index(&self) -> usize {
        1
    }
    /// Whether a denial counts among the most-denied keys (`RL.TOP`): not a release that found
    /// no lease, which denies nobody.
    fn is_limit(&self) -> bool {
        true
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int;
}

/// A reply the body has already sent (its status).
struct Sent(c_int);

impl Answer for Sent {
    fn decision(&self) -> Option<bool> {
        None
    }
    fn send(&self, _: *mut RedisModuleCtx) -> c_int {
        self.0
    }
}

type Body<A> = fn(*mut RedisModuleCtx, &[*mut RedisModuleString]) -> Result<A, ErrorReply>;

/// The one entry point of every command: runs its body with its arguments as a slice, reports
/// the outcome to the observation hook (`stats::observe`), then replies. A panic must never
/// unwind into Redis (it would abort the server), so it is caught here and answered with an
/// error.
fn entry<A: Answer>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    command: &'static Descriptor,
    body: Body<A>,
) -> c_int {
    let argv: &[*mut RedisModuleString] = match usize::try_from(argc) {
        // SAFETY: Redis passes `argc` valid strings in `argv` for the duration of the call.
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    };
    let answer = catch_unwind(AssertUnwindSafe(|| body(ctx, argv))).unwrap_or(Err(INTERNAL_ERROR));
    let observed = match &answer {
        Ok(a) => a.decision().map(|admitted| {
            let outcome = if admitted {
                Outcome::Admitted
            } else {
                Outcome::Denied
            };
            (outcome, a.key_index(), a.is_limit())
        }),
        Err(e) => Some((Outcome::Error(ErrorKind::of(e)), 1, false)),
    };
    if let Some((outcome, index, is_limit)) = observed {
        // SAFETY: argv strings live for the whole call.
        let key = || argv.get(index).map(|s| unsafe { api::string_bytes(*s) });
        // A denial was decided at the time the call read last.
        let now_ms = || clock::decided_at_us().div_euclid(1000);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            stats::observe(command, key, now_ms, outcome, is_limit)
        }));
    }
    match answer {
        Ok(a) => catch_unwind(AssertUnwindSafe(|| a.send(ctx)))
            .unwrap_or_else(|_| api::reply_error(ctx, INTERNAL_ERROR)),
        Err(err) => api::reply_error(ctx, err),
    }
}

/// A command as registered with Redis: what it is, and the function Redis calls.
struct Command {
    descriptor: &'static Descriptor,
    handler: unsafe extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int,
}

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

/// Module load: validates the load arguments, then registers the commands.
pub fn on_load(ctx: &Context, args: &[RedisString]) -> Status {
    let raw_args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let (top_slots, rest) = match config::load_argument(&raw_args) {
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

    // Limiter commands only: RL.TESTCLOCK is never in the module's ACL category.
    let mut result = acl::add_category(ctx).and_then(|acl| {
        commands::all_commands().try_for_each(|cmd| {
            register(ctx.ctx, &cmd).and_then(|()| acl.assign(ctx.ctx, cmd.descriptor))
        })
    });
    // The operator command, outside the limiters' ACL category.
    if result.is_ok() {
        result = register(ctx.ctx, &commands::TOP);
    }
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
