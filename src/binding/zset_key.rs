//! The Redis side of sorted-set limiters: one key opened once, entries read and written through
//! the module key API, effects propagated as `ZREMRANGEBYSCORE` + `ZADD` + `PEXPIREAT` (the last
//! only when the expiry moves).

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use super::api::{self, OpenKey, TempString};
use super::clock;
use crate::command::sliding_log;
use crate::core::Reply;
use crate::error::ErrorReply;
use crate::number::{G17_MAX_LEN, format_g17};
use crate::zset_store::{EntryVisitor, ZsetKind, ZsetStore, ZsetWrite, member_name};

struct RedisZsetKey {
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: OpenKey,
}

/// A score as Redis would print it from a Lua number (`%.17g`); scores here are integers.
fn score_string(ctx: *mut RedisModuleCtx, score: f64) -> Result<TempString, ErrorReply> {
    let mut buf = [0u8; G17_MAX_LEN];
    let len = format_g17(score, &mut buf);
    TempString::new(ctx, buf.get(..len).unwrap_or_default())
}

impl ZsetStore for RedisZsetKey {
    fn kind(&self) -> Result<ZsetKind, ErrorReply> {
        self.key.zset_kind()
    }

    fn scan(&self, visit: &mut EntryVisitor<'_>) -> Result<(), ErrorReply> {
        self.key
            .zset_range(f64::NEG_INFINITY, f64::INFINITY, &mut |member, score| {
                visit(member.as_ref(), score)
            })
    }

    fn write(&mut self, w: &ZsetWrite) -> Result<(), ErrorReply> {
        api::check_memory(self.ctx)?;
        // Trim first, then add, as the replicated commands do: a set emptied by the trim is
        // deleted and created anew, so the encoding Redis picks (listpack or skiplist) is the
        // one a replica or the Lua twin ends up with too.
        let trim = match w.trim_up_to {
            Some(up_to) => {
                let mut old = Vec::new();
                self.key.zset_range(f64::NEG_INFINITY, up_to, &mut |m, _| {
                    old.push(m);
                    Ok(())
                })?;
                for m in &old {
                    self.key.zset_rem(m.as_ptr())?;
                }
                Some(score_string(self.ctx, up_to)?)
            }
            None => None,
        };
        let score = score_string(self.ctx, w.score)?;
        // ZADD's argument vector: score member score member ...
        let capacity = usize::try_from(w.count).unwrap_or(0);
        let mut members: Vec<TempString> = Vec::with_capacity(capacity);
        let mut zadd: Vec<*mut RedisModuleString> = Vec::with_capacity(capacity * 2);
        let mut name = Vec::new();
        for i in w.first_index..w.first_index.saturating_add(w.count) {
            member_name(w.score, i, &mut name);
            let member = TempString::new(self.ctx, &name)?;
            self.key.zset_add(w.score, member.as_ptr())?;
            zadd.push(score.as_ptr());
            zadd.push(member.as_ptr());
            members.push(member);
        }
        // Checked after the writes: a trim that empties the set deletes the key and its expiry.
        // An unchanged expiry is neither set nor propagated again (replicas already have it).
        let expiry_changes = self.key.abs_expire()? != Some(w.expire_at_ms);
        if expiry_changes {
            self.key.set_abs_expire(w.expire_at_ms)?;
        }
        if let Some(up_to) = &trim {
            let low = TempString::new(self.ctx, b"-inf")?;
            api::replicate_key_command(
                self.ctx,
                c"ZREMRANGEBYSCORE",
                self.name,
                &[low.as_ptr(), up_to.as_ptr()],
            )?;
        }
        api::replicate_key_command(self.ctx, c"ZADD", self.name, &zadd)?;
        if expiry_changes {
            api::replicate_pexpireat(self.ctx, self.name, w.expire_at_ms)?;
        }
        api::signal_zset_write(self.ctx, self.name, trim.is_some())
    }
}

/// Runs one `RL.SLIDINGLOG` call. `argv[0]` is the command name, `argv[1]` the key.
pub fn run_sliding_log(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, ErrorReply> {
    let [_, name, rest @ ..] = argv else {
        return Err(sliding_log::ARITY_ERROR);
    };
    let mut raw_args: [&[u8]; 3] = [&[]; 3];
    if rest.len() > raw_args.len() {
        return Err(sliding_log::ARITY_ERROR);
    }
    for (slot, arg) in raw_args.iter_mut().zip(rest) {
        // SAFETY: argv strings live for the whole call and are not modified.
        *slot = unsafe { api::string_bytes(*arg) };
    }
    let args = sliding_log::parse(raw_args.get(..rest.len()).unwrap_or_default())?;
    let mut store = RedisZsetKey {
        ctx,
        name: *name,
        key: OpenKey::open(ctx, *name)?,
    };
    sliding_log::apply(&mut store, &args, clock::now_us())
}
