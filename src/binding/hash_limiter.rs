//! The command pipeline shared by limiters whose state is one hash of numeric fields:
//! parse -> open the key once -> read fields -> decide -> write + replicate effects -> reply.

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::api::{self, KeyKind, OpenKey, StaticName, TempString};
use super::clock;
use crate::core::Reply;
use crate::error::{ErrorReply, WRONGTYPE};
use crate::number::{G17_MAX_LEN, format_g17};

/// New field values (in `FIELDS` order) and the key's absolute expiry.
pub struct HashWrite<const N: usize> {
    pub values: [f64; N],
    pub expire_at_ms: i64,
}

/// One limiter algorithm stored as a hash of `N` numeric fields.
pub trait HashLimiter<const N: usize> {
    type Args;
    type State: Copy;

    /// Field names, in the order `decode` reads them and `HashWrite::values` stores them.
    const FIELDS: [&'static StaticName; N];

    /// Arguments after the key.
    fn parse(args: &[&[u8]]) -> Result<Self::Args, ErrorReply>;
    /// The stored fields of an existing hash (absent fields are `None`).
    fn decode(fields: [Option<&[u8]>; N]) -> Result<Self::State, ErrorReply>;
    fn decide(args: &Self::Args, now_us: i64, prior: Option<Self::State>)
    -> (Reply, Option<HashWrite<N>>);
}

/// Runs one call. `argv[0]` is the command name, `argv[1]` the key.
pub fn run<L: HashLimiter<N>, const N: usize>(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
    arity_error: ErrorReply,
) -> Result<Reply, ErrorReply> {
    let [_, key_name, rest @ ..] = argv else {
        return Err(arity_error);
    };
    let key_name = *key_name;
    let mut raw_args: [&[u8]; 8] = [&[]; 8];
    if rest.len() > raw_args.len() {
        return Err(arity_error);
    }
    for (slot, arg) in raw_args.iter_mut().zip(rest) {
        // SAFETY: argv strings live for the whole call and are not modified.
        *slot = unsafe { api::string_bytes(*arg) };
    }
    let args = L::parse(raw_args.get(..rest.len()).ok_or(arity_error)?)?;

    let key = OpenKey::open(ctx, key_name)?;
    let prior = match key.kind()? {
        KeyKind::Empty => None,
        KeyKind::Other => return Err(WRONGTYPE),
        KeyKind::Hash => {
            let mut held: [Option<TempString>; N] = [const { None }; N];
            for (slot, field) in held.iter_mut().zip(L::FIELDS) {
                *slot = key.hash_get(field.get()?)?;
            }
            Some(L::decode(held.each_ref().map(|v| v.as_ref().map(TempString::bytes)))?)
        }
    };

    let (reply, write) = L::decide(&args, clock::now_us(), prior);
    if let Some(write) = write {
        store(ctx, &key, key_name, L::FIELDS, &write)?;
    }
    Ok(reply)
}

fn store<const N: usize>(
    ctx: *mut RedisModuleCtx,
    key: &OpenKey,
    key_name: *mut RedisModuleString,
    fields: [&'static StaticName; N],
    write: &HashWrite<N>,
) -> Result<(), ErrorReply> {
    let mut values: [Option<TempString>; N] = [const { None }; N];
    for (slot, v) in values.iter_mut().zip(write.values) {
        let mut buf = [0u8; G17_MAX_LEN];
        let len = format_g17(v, &mut buf);
        *slot = Some(TempString::new(ctx, &buf[..len])?);
    }
    // HSET's argument vector: f1 v1 f2 v2 ... (at most 8 fields).
    let mut pairs = [std::ptr::null_mut(); 16];
    let mut used = 0;
    for ((field, value), pair) in fields.iter().zip(&values).zip(pairs.chunks_exact_mut(2)) {
        let (Some(value), [f, v]) = (value, pair) else { continue };
        *f = field.get()?;
        *v = value.as_ptr();
        key.hash_set(*f, *v)?;
        used += 2;
    }
    key.set_abs_expire(write.expire_at_ms)?;
    api::replicate_hset(ctx, key_name, pairs.get(..used).unwrap_or_default())?;
    api::replicate_pexpireat(ctx, key_name, write.expire_at_ms)?;
    api::signal_hash_write(ctx, key_name)
}
