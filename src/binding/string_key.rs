//! The Redis side of `CL.THROTTLE`: one string key opened once, read and (at the same length)
//! written in place through the module key API, the effect propagated as `SET key value PXAT ms`.

use std::ffi::c_int;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::api::{self, OpenKey, TempString};
use super::{Command, clock, entry};
use crate::command::throttle::{self, Slot, StringStore, ThrottleReply};
use crate::error::ErrorReply;

struct RedisStringKey {
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: OpenKey,
}

impl StringStore for RedisStringKey {
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        if self.key.kind()? == crate::pipeline::KeyKind::Empty {
            return Ok(Slot::Empty);
        }
        if !self.key.is_string()? {
            return Ok(Slot::WrongType);
        }
        Ok(Slot::Value(self.key.string_bytes()?))
    }

    fn write(&mut self, value: &[u8], expire_at_ms: i64) -> Result<(), ErrorReply> {
        api::check_memory(self.ctx)?;
        // A stored time keeps its length (19 digits of nanoseconds) from call to call: written
        // in place it keeps the key and its expiry, which is then set only if it moves. Any
        // other value replaces the key's (SET semantics: the expiry goes, and is set anew).
        let in_place = self.key.kind()? != crate::pipeline::KeyKind::Empty
            && self.key.string_overwrite_same_length(value)?;
        if !in_place {
            let fresh = TempString::new(self.ctx, value)?;
            self.key.string_set(fresh.as_ptr())?;
        }
        if self.key.abs_expire()? != Some(expire_at_ms) {
            self.key.set_abs_expire(expire_at_ms)?;
        }
        api::replicate_set_pxat(self.ctx, self.name, value, expire_at_ms)?;
        api::signal_string_write(self.ctx, self.name)
    }
}

/// Runs one call. `argv[0]` is the command name, `argv[1]` the key.
fn run(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<ThrottleReply, ErrorReply> {
    let [_, name, rest @ ..] = argv else {
        return Err(throttle::ARITY_ERROR);
    };
    let mut raw_args: [&[u8]; 4] = [&[]; 4];
    if rest.len() > raw_args.len() {
        return Err(throttle::ARITY_ERROR);
    }
    for (slot, arg) in raw_args.iter_mut().zip(rest) {
        // SAFETY: argv strings live for the whole call and are not modified.
        *slot = unsafe { api::string_bytes(*arg) };
    }
    let args = throttle::parse(raw_args.get(..rest.len()).unwrap_or_default())?;
    let mut store = RedisStringKey {
        ctx,
        name: *name,
        key: OpenKey::open(ctx, *name)?,
    };
    throttle::apply(&mut store, &args, clock::now_us())
}

unsafe extern "C" fn throttle_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, |ctx, argv| {
        let outcome = run(ctx, argv);
        throttle::STATS.record(&outcome.map(|r| r.as_reply()));
        Ok(api::reply_integers(ctx, &outcome?.to_array()))
    })
}

pub const THROTTLE: Command = Command {
    name: throttle::NAME,
    handler: throttle_command,
    flags: super::commands::LIMITER_FLAGS,
    keys: (1, 1, 1),
    stats: Some(&throttle::STATS),
};
