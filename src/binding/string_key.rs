//! The Redis side of every limiter whose state is one string (the numbers of `pipeline`, and
//! `CL.THROTTLE`'s nanoseconds): one key opened once, read without a copy and (at the same
//! length) written in place through the module key API, the effect propagated as exactly one
//! `SET key value PXAT ms`. A hash of the earlier layout is read field by field and replaced by
//! the string on its next write.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::api::{self, KeyKind, OpenKey, TempString};
use super::{Answer, Command, clock, entry};
use crate::command::all;
use crate::command::throttle::{self, ThrottleReply};
use crate::core::Reply;
use crate::error::ErrorReply;
use crate::pipeline::{self, AllReply, FieldName, FieldsLimiter, Slot, StringStore};

struct RedisStringKey {
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: OpenKey,
}

impl RedisStringKey {
    fn open(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) -> Result<Self, ErrorReply> {
        Ok(Self {
            ctx,
            name,
            key: OpenKey::open(ctx, name)?,
        })
    }
}

/// A field name of the earlier layout as a Redis string, created on first use and kept for the
/// module's life.
fn field_string(field: &'static FieldName) -> Result<*mut RedisModuleString, ErrorReply> {
    let cached = field.handle.load(Ordering::Relaxed);
    if !cached.is_null() {
        return Ok(cached.cast());
    }
    let s = api::unmanaged_string(field.name.to_bytes())?;
    field.handle.store(s.cast::<c_void>(), Ordering::Relaxed);
    Ok(s)
}

impl StringStore for RedisStringKey {
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        Ok(match self.key.kind()? {
            KeyKind::Empty => Slot::Empty,
            KeyKind::Hash => Slot::Hash,
            KeyKind::String => Slot::Value(self.key.string_bytes()?),
            KeyKind::Other => Slot::WrongType,
        })
    }

    fn legacy_fields(
        &self,
        names: &[&'static FieldName],
        out: &mut [Option<Vec<u8>>],
    ) -> Result<(), ErrorReply> {
        for (slot, field) in out.iter_mut().zip(names) {
            *slot = self
                .key
                .hash_get(field_string(field)?)?
                .map(|v| v.as_ref().to_vec());
        }
        Ok(())
    }

    fn write(&mut self, value: &[u8], expire_at_ms: i64) -> Result<(), ErrorReply> {
        api::check_memory(self.ctx)?;
        // A busy key's value often keeps its length from call to call: written in place it
        // keeps the key and its expiry, which is then set only if it moves. Any other value
        // replaces the key's, of whatever type (SET semantics: the expiry goes, and is set anew).
        let in_place =
            self.key.kind()? == KeyKind::String && self.key.string_overwrite_same_length(value)?;
        // A replaced value has no expiry left, so only an in-place write needs to look it up.
        let expiry_moved = if in_place {
            self.key.abs_expire()? != Some(expire_at_ms)
        } else {
            let fresh = TempString::new(self.ctx, value)?;
            self.key.string_set(fresh.as_ptr())?;
            true
        };
        if expiry_moved {
            self.key.set_abs_expire(expire_at_ms)?;
        }
        api::replicate_set_pxat(self.ctx, self.name, value, expire_at_ms)?;
        api::signal_string_write(self.ctx, self.name)
    }
}

/// The key and the arguments after it, as bytes; `M` is the most arguments a command takes.
fn key_and_args<const M: usize>(
    argv: &[*mut RedisModuleString],
    arity: ErrorReply,
) -> Result<(*mut RedisModuleString, [&[u8]; M], usize), ErrorReply> {
    let [_, name, rest @ ..] = argv else {
        return Err(arity);
    };
    let mut raw_args: [&[u8]; M] = [&[]; M];
    if rest.len() > M {
        return Err(arity);
    }
    for (slot, arg) in raw_args.iter_mut().zip(rest) {
        // SAFETY: argv strings live for the whole call and are not modified.
        *slot = unsafe { api::string_bytes(*arg) };
    }
    Ok((*name, raw_args, rest.len()))
}

/// Runs one call of a limiter whose state is a few numbers. `argv[0]` is the command name,
/// `argv[1]` the key.
pub fn run_fields<L: FieldsLimiter<N>, const N: usize>(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, ErrorReply> {
    let (name, raw_args, n) = key_and_args::<8>(argv, L::DESCRIPTOR.arity_error)?;
    let args = L::parse(raw_args.get(..n).unwrap_or_default())?;
    let mut store = RedisStringKey::open(ctx, name)?;
    pipeline::apply::<L, _, N>(&mut store, &args, clock::now_us())
}

/// Runs one `RL.ALL` call: every key opened once, all decided at one instant.
pub fn run_all(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<AllReply, ErrorReply> {
    let rest = argv.get(1..).unwrap_or_default();
    let bytes: Vec<&[u8]> = rest
        .iter()
        // SAFETY: argv strings live for the whole call and are not modified.
        .map(|s| unsafe { api::string_bytes(*s) })
        .collect();
    let mut call = all::parse(&bytes)?;
    // Key names as Redis strings: argv[2 ..= 1 + numkeys].
    let names = argv.get(2..2 + call.keys.len()).ok_or(all::ARITY)?;
    let mut keys = Vec::with_capacity(names.len());
    for name in names {
        keys.push(RedisStringKey::open(ctx, *name)?);
    }
    let mut stores: Vec<&mut dyn StringStore> =
        keys.iter_mut().map(|k| k as &mut dyn StringStore).collect();
    pipeline::apply_all(&mut call.limits, &mut stores, clock::now_us())
}

/// Runs one call. `argv[0]` is the command name, `argv[1]` the key.
fn run(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<ThrottleReply, ErrorReply> {
    let (name, raw_args, n) = key_and_args::<4>(argv, throttle::ARITY_ERROR)?;
    let args = throttle::parse(raw_args.get(..n).unwrap_or_default())?;
    let mut store = RedisStringKey::open(ctx, name)?;
    throttle::apply(&mut store, &args, clock::now_us())
}

unsafe extern "C" fn throttle_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, &throttle::DESCRIPTOR, run)
}

pub const THROTTLE: Command = Command {
    descriptor: &throttle::DESCRIPTOR,
    handler: throttle_command,
};

/// `[limited, limit, remaining, retry_after_s, reset_after_s]`, redis-cell's reply.
impl Answer for ThrottleReply {
    fn decision(&self) -> Option<bool> {
        Some(!self.limited)
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        api::reply_integers(ctx, &self.to_array())
    }
}
