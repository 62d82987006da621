//! The one entry point of every command: the panic guard, the observation hook and the reply.

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::binding::{api, clock};
use crate::codec::error::ErrorReply;
use crate::command::descriptor::Descriptor;
use crate::observe::stats::{self, ErrorKind, Outcome};

pub(crate) const INTERNAL_ERROR: ErrorReply =
    ErrorReply(c"ERR internal error in the rate limiter module (see the server log)");

/// What a command's body answers, before it is sent.
pub(crate) trait Answer {
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
pub(crate) struct Sent(pub(crate) c_int);

impl Answer for Sent {
    fn decision(&self) -> Option<bool> {
        None
    }
    fn send(&self, _: *mut RedisModuleCtx) -> c_int {
        self.0
    }
}

/// The one entry point of every command: runs its body with its arguments as a slice, reports
/// the outcome to the observation hook (`stats::observe`), then replies. A panic must never
/// unwind into Redis (it would abort the server), so it is caught here and answered with an
/// error. Inlined into each command's handler with its body, so that a call runs as one
/// function (no calls through a pointer, no answer copied between frames).
#[inline(always)]
pub(crate) fn entry<A: Answer>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    command: &'static Descriptor,
    body: impl FnOnce(*mut RedisModuleCtx, &[*mut RedisModuleString]) -> Result<A, ErrorReply>,
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
        // The key's database: one name in two databases is two keys.
        let db = || api::selected_db(ctx);
        // A denial was decided at the time the call read last.
        let now_ms = || clock::decided_at_us().div_euclid(1000);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            stats::observe(
                command.stats,
                command.name,
                key,
                db,
                now_ms,
                outcome,
                is_limit,
            )
        }));
    }
    match answer {
        Ok(a) => catch_unwind(AssertUnwindSafe(|| a.send(ctx)))
            .unwrap_or_else(|_| api::reply_error(ctx, INTERNAL_ERROR)),
        Err(err) => api::reply_error(ctx, err),
    }
}

/// A command as registered with Redis: what it is, and the function Redis calls.
pub(crate) struct Command {
    pub(crate) descriptor: &'static Descriptor,
    pub(crate) handler:
        unsafe extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int,
}
