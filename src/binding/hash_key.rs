//! The Redis side of the hash pipeline: one key opened once, fields read and written through the
//! module key API, effects propagated as `HSET` of the changed fields + `PEXPIREAT` when the
//! expiry moves.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::api::{self, OpenKey, TempString};
use super::clock;
use crate::command::all;
use crate::core::Reply;
use crate::error::ErrorReply;
use crate::pipeline::{self, AllReply, DynHashStore, FieldName, HashLimiter, HashStore, KeyKind};

/// The field name as a Redis string, created on first use and kept for the module's life.
fn field_string(field: &'static FieldName) -> Result<*mut RedisModuleString, ErrorReply> {
    let cached = field.handle.load(Ordering::Relaxed);
    if !cached.is_null() {
        return Ok(cached.cast());
    }
    let s = api::unmanaged_string(field.name.to_bytes())?;
    field.handle.store(s.cast::<c_void>(), Ordering::Relaxed);
    Ok(s)
}

struct RedisHashKey {
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: OpenKey,
}

impl HashStore for RedisHashKey {
    type Bytes = TempString;

    fn kind(&self) -> Result<KeyKind, ErrorReply> {
        self.key.kind()
    }

    fn get(&self, field: &'static FieldName) -> Result<Option<TempString>, ErrorReply> {
        self.key.hash_get(field_string(field)?)
    }

    fn get_many<const N: usize>(
        &self,
        fields: [&'static FieldName; N],
    ) -> Result<[Option<TempString>; N], ErrorReply> {
        let mut names = [std::ptr::null_mut(); N];
        for (name, field) in names.iter_mut().zip(fields) {
            *name = field_string(field)?;
        }
        self.key.hash_get_many(names)
    }

    fn write(
        &mut self,
        fields: &[(&'static FieldName, &[u8])],
        expire_at_ms: i64,
    ) -> Result<(), ErrorReply> {
        api::check_memory(self.ctx)?;
        // HSET's argument vector: f1 v1 f2 v2 ... (at most 8 fields).
        let mut held: [Option<TempString>; 8] = [const { None }; 8];
        let mut argv = [std::ptr::null_mut(); 16];
        let mut pairs = [(std::ptr::null_mut(), std::ptr::null_mut()); 8];
        let mut used = 0;
        for ((((field, value), slot), pair), set) in fields
            .iter()
            .zip(&mut held)
            .zip(argv.chunks_exact_mut(2))
            .zip(&mut pairs)
        {
            let value = slot.insert(TempString::new(self.ctx, value)?);
            let [f, v] = pair else { continue };
            *f = field_string(field)?;
            *v = value.as_ptr();
            *set = (*f, *v);
            used += 1;
        }
        // A busy key keeps the same expiry (whole milliseconds) over many calls; then neither the
        // key nor the replicas need it set again, and one of the two propagated commands goes.
        let expiry_changes = self.key.abs_expire()? != Some(expire_at_ms);
        self.key
            .hash_set_many(pairs.get(..used).unwrap_or_default())?;
        api::replicate_hset(
            self.ctx,
            self.name,
            argv.get(..2 * used).unwrap_or_default(),
        )?;
        if expiry_changes {
            self.key.set_abs_expire(expire_at_ms)?;
            api::replicate_pexpireat(self.ctx, self.name, expire_at_ms)?;
        }
        api::signal_hash_write(self.ctx, self.name)
    }
}

/// Runs one call of a hash limiter. `argv[0]` is the command name, `argv[1]` the key.
pub fn run<L: HashLimiter<N>, const N: usize>(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, ErrorReply> {
    let [_, name, rest @ ..] = argv else {
        return Err(L::ARITY_ERROR);
    };
    let mut raw_args: [&[u8]; 8] = [&[]; 8];
    if rest.len() > raw_args.len() {
        return Err(L::ARITY_ERROR);
    }
    for (slot, arg) in raw_args.iter_mut().zip(rest) {
        // SAFETY: argv strings live for the whole call and are not modified.
        *slot = unsafe { api::string_bytes(*arg) };
    }
    let args = L::parse(raw_args.get(..rest.len()).unwrap_or_default())?;
    let mut store = RedisHashKey {
        ctx,
        name: *name,
        key: OpenKey::open(ctx, *name)?,
    };
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
        keys.push(RedisHashKey {
            ctx,
            name: *name,
            key: OpenKey::open(ctx, *name)?,
        });
    }
    let mut stores: Vec<&mut dyn DynHashStore> = keys
        .iter_mut()
        .map(|k| k as &mut dyn DynHashStore)
        .collect();
    pipeline::apply_all(&mut call.limits, &mut stores, clock::now_us())
}
