//! The Redis side of every limiter's key: one key opened once, read through the module key API
//! (a string without a copy, a sorted set by counts and single entries), and written by one
//! applier of `store::Effect` that changes the key, propagates exactly the effect and signals
//! it. A hash of the earlier layout is read field by field and replaced by the string on its next
//! write.

use std::cell::Cell;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::binding::api::{self, KeyKind, OpenKey, TempString, ZsetWrite};
use crate::codec::error::ErrorReply;
use crate::codec::number::{G17_MAX_LEN, format_g17, format_i64};
use crate::store::{Effect, Entries, EntryVisitor, FieldName, OpenStore, Slot, Store, member_name};

/// A sorted-set read walks at most this many entries from either end; past that it asks Redis
/// (`ZCOUNT`, `ZREVRANGE`), which answers in O(log n) where a walk would be O(n).
const WALK: i64 = 32;

pub(crate) struct RedisKey {
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: OpenKey,
    /// The key's type as the reads found it, until a write (`apply` forgets it): a sorted-set
    /// read asks for it several times, and a string write once more, and the server answers each
    /// with a call.
    read_kind: Cell<Option<KeyKind>>,
}

impl RedisKey {
    pub(crate) fn open(
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
    ) -> Result<Self, ErrorReply> {
        Ok(Self {
            ctx,
            name,
            key: OpenKey::open(ctx, name)?,
            read_kind: Cell::new(None),
        })
    }

    /// The key's type, for the reads before a write.
    fn kind(&self) -> Result<KeyKind, ErrorReply> {
        if let Some(kind) = self.read_kind.get() {
            return Ok(kind);
        }
        let kind = self.key.kind()?;
        self.read_kind.set(Some(kind));
        Ok(kind)
    }

    fn set(&mut self, value: &[u8], expire_at_ms: i64) -> Result<(), ErrorReply> {
        // A busy key's value often keeps its length from call to call: written in place it
        // keeps the key. Any other value replaces the key's, of whatever type (SET semantics:
        // the expiry goes, and is set anew).
        let in_place =
            self.kind()? == KeyKind::String && self.key.string_overwrite_same_length(value)?;
        if !in_place {
            let fresh = TempString::new(self.ctx, value)?;
            self.key.string_set(fresh.as_ptr())?;
        }
        // Set every time, as the propagated `SET ... PXAT` and the twin's set it: one lookup,
        // where asking first whether it moved would take one more.
        self.key.set_abs_expire(expire_at_ms)?;
        api::replicate_set_pxat(self.ctx, self.name, value, expire_at_ms)?;
        api::signal_string_write(self.ctx, self.name)
    }

    fn append(&mut self, e: &Entries, expire_at_ms: i64) -> Result<(), ErrorReply> {
        // Trim first, then add, as the replicated commands do: a set emptied by the trim is
        // deleted and created anew, so the encoding Redis picks (listpack or skiplist) is the
        // one a replica or the Lua twin ends up with too.
        let trim = self.trim_first(e.trim)?;
        let score = score_string(self.ctx, e.score)?;
        // ZADD's argument vector: score member score member ...
        let capacity = usize::try_from(e.count).unwrap_or(0);
        let mut members: Vec<TempString> = Vec::with_capacity(capacity);
        let mut zadd: Vec<*mut RedisModuleString> = Vec::with_capacity(capacity * 2);
        let mut name = Vec::new();
        for i in e.first_index..e.first_index.saturating_add(e.count) {
            member_name(e.score, i, &mut name);
            let member = TempString::new(self.ctx, &name)?;
            self.key.zset_add(e.score, member.as_ptr())?;
            zadd.push(score.as_ptr());
            zadd.push(member.as_ptr());
            members.push(member);
        }
        // Checked after the writes: a trim that empties the set deletes the key and its expiry.
        // An unchanged expiry is neither set nor propagated again (replicas already have it).
        let expiry_moved = self.key.abs_expire()? != Some(expire_at_ms);
        if expiry_moved {
            self.key.set_abs_expire(expire_at_ms)?;
        }
        self.replicate_trim(trim.as_ref())?;
        api::replicate_key_command(self.ctx, c"ZADD", self.name, &zadd)?;
        if expiry_moved {
            api::replicate_pexpireat(self.ctx, self.name, expire_at_ms)?;
        }
        api::signal_zset_write(
            self.ctx,
            self.name,
            &ZsetWrite {
                trimmed: trim.is_some(),
                event: c"zadd",
                deleted: false,
                expiry_moved,
            },
        )
    }

    /// Removes the expired leases, then adds, moves or removes one.
    fn lease(
        &mut self,
        trim: i64,
        id: &[u8],
        expiry: Option<f64>,
        expire_at_ms: Option<i64>,
    ) -> Result<(), ErrorReply> {
        let trim = self.trim_first(trim)?;
        let member = TempString::new(self.ctx, id)?;
        let score = match expiry {
            Some(e) => {
                self.key.zset_add(e, member.as_ptr())?;
                Some(score_string(self.ctx, e)?)
            }
            None => {
                self.key.zset_rem(member.as_ptr())?;
                None
            }
        };
        let (deleted, expiry_moved) = self.move_expiry(expire_at_ms)?;
        self.replicate_trim(trim.as_ref())?;
        match &score {
            Some(s) => api::replicate_key_command(
                self.ctx,
                c"ZADD",
                self.name,
                &[s.as_ptr(), member.as_ptr()],
            )?,
            None => api::replicate_key_command(self.ctx, c"ZREM", self.name, &[member.as_ptr()])?,
        }
        self.replicate_expiry(expiry_moved, expire_at_ms)?;
        api::signal_zset_write(
            self.ctx,
            self.name,
            &ZsetWrite {
                trimmed: trim.is_some(),
                event: if score.is_some() { c"zadd" } else { c"zrem" },
                deleted,
                expiry_moved,
            },
        )
    }

    /// Removes the oldest `trim` entries, then the newest `count`.
    fn pop(&mut self, trim: i64, count: i64, expire_at_ms: Option<i64>) -> Result<(), ErrorReply> {
        let trim = self.trim_first(trim)?;
        let mut newest = Vec::new();
        let mut left = count;
        self.key
            .zset_walk(true, f64::NEG_INFINITY, f64::INFINITY, &mut |m, _| {
                newest.push(m);
                left -= 1;
                Ok(left > 0)
            })?;
        for m in &newest {
            self.key.zset_rem(m.as_ptr())?;
        }
        let (deleted, expiry_moved) = self.move_expiry(expire_at_ms)?;
        self.replicate_trim(trim.as_ref())?;
        let from = TempString::new(self.ctx, format!("{}", -count).as_bytes())?;
        let to = TempString::new(self.ctx, b"-1")?;
        api::replicate_key_command(
            self.ctx,
            c"ZREMRANGEBYRANK",
            self.name,
            &[from.as_ptr(), to.as_ptr()],
        )?;
        self.replicate_expiry(expiry_moved, expire_at_ms)?;
        api::signal_zset_write(
            self.ctx,
            self.name,
            &ZsetWrite {
                trimmed: trim.is_some(),
                event: c"zremrangebyrank",
                deleted,
                expiry_moved,
            },
        )
    }

    /// Removes the oldest `count` entries (when above 0), first of a sorted-set write, as the
    /// replicated commands do; the last rank as `ZREMRANGEBYRANK` gets it.
    fn trim_first(&mut self, count: i64) -> Result<Option<TempString>, ErrorReply> {
        if count <= 0 {
            return Ok(None);
        }
        self.trim(count)?;
        let mut digits = [0u8; G17_MAX_LEN];
        let len = format_i64(count - 1, &mut digits);
        TempString::new(self.ctx, digits.get(..len).unwrap_or_default()).map(Some)
    }

    /// After a sorted-set write: whether it left the key empty (deleted), and whether the
    /// expiry moved to `expire_at_ms` (set only when it did; none on a deleted key).
    fn move_expiry(&mut self, expire_at_ms: Option<i64>) -> Result<(bool, bool), ErrorReply> {
        let deleted = self.key.kind()? == KeyKind::Empty;
        let moved = match expire_at_ms {
            Some(at) if !deleted => {
                let moved = self.key.abs_expire()? != Some(at);
                if moved {
                    self.key.set_abs_expire(at)?;
                }
                moved
            }
            _ => false,
        };
        Ok((deleted, moved))
    }

    /// `ZREMRANGEBYRANK key 0 last`, when entries were trimmed.
    fn replicate_trim(&self, last: Option<&TempString>) -> Result<(), ErrorReply> {
        let Some(last) = last else {
            return Ok(());
        };
        let first = TempString::new(self.ctx, b"0")?;
        api::replicate_key_command(
            self.ctx,
            c"ZREMRANGEBYRANK",
            self.name,
            &[first.as_ptr(), last.as_ptr()],
        )
    }

    /// `PEXPIREAT key ms`, when the expiry moved.
    fn replicate_expiry(&self, moved: bool, expire_at_ms: Option<i64>) -> Result<(), ErrorReply> {
        match expire_at_ms {
            Some(at) if moved => api::replicate_pexpireat(self.ctx, self.name, at),
            _ => Ok(()),
        }
    }

    /// Removes the oldest `count` entries.
    fn trim(&mut self, count: i64) -> Result<(), ErrorReply> {
        let mut old = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        let mut left = count;
        self.key
            .zset_walk(false, f64::NEG_INFINITY, f64::INFINITY, &mut |m, _| {
                old.push(m);
                left -= 1;
                Ok(left > 0)
            })?;
        for m in &old {
            self.key.zset_rem(m.as_ptr())?;
        }
        Ok(())
    }
}

/// A score as `%.17g`; scores here are integers, which every server prints as their digits.
fn score_string(ctx: *mut RedisModuleCtx, score: f64) -> Result<TempString, ErrorReply> {
    let mut buf = [0u8; G17_MAX_LEN];
    let len = format_g17(score, &mut buf);
    TempString::new(ctx, buf.get(..len).unwrap_or_default())
}

/// A score bound as `ZCOUNT` reads it: `(x` when exclusive. `%.17g` spells infinity `inf`,
/// which Redis reads as such.
fn bound(score: f64, exclusive: bool, out: &mut [u8; G17_MAX_LEN + 1]) -> &[u8] {
    let mut digits = [0u8; G17_MAX_LEN];
    let len = format_g17(score, &mut digits);
    if let Some(open) = out.first_mut() {
        *open = b'(';
    }
    if let (Some(dest), Some(src)) = (out.get_mut(1..=len), digits.get(..len)) {
        dest.copy_from_slice(src);
    }
    out.get(usize::from(!exclusive)..=len).unwrap_or_default()
}

/// A field name of the earlier layout as a Redis string, created on first use and kept for the
/// module's life.
fn field_string(field: &'static FieldName) -> Result<*mut RedisModuleString, ErrorReply> {
    api::kept_string(&field.handle, field.name.to_bytes())
}

impl Store for RedisKey {
    #[inline(always)]
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        Ok(match self.kind()? {
            KeyKind::Empty => Slot::Empty,
            KeyKind::Hash => Slot::Hash,
            KeyKind::Zset => Slot::Zset,
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

    fn zset_len(&self) -> Result<i64, ErrorReply> {
        if self.kind()? != KeyKind::Zset {
            return Ok(0);
        }
        self.key.zset_len()
    }

    fn zset_count(&self, min: f64, min_inclusive: bool, max: f64) -> Result<i64, ErrorReply> {
        let len = self.zset_len()?;
        if len == 0 {
            return Ok(0);
        }
        let below = |s: f64| if min_inclusive { s < min } else { s <= min };
        let mut steps = 0i64;
        let mut counted = 0i64;
        let mut ended = false;
        // Walk from the end the range is at: from the first entry past those below it (a range
        // open to the top), or from the last over those in it.
        let past_end = if max == f64::INFINITY {
            self.key
                .zset_walk(false, f64::NEG_INFINITY, f64::INFINITY, &mut |_, s| {
                    if !below(s) {
                        ended = true;
                        return Ok(false);
                    }
                    steps += 1;
                    Ok(steps < WALK)
                })?
        } else {
            self.key
                .zset_walk(true, f64::NEG_INFINITY, f64::INFINITY, &mut |_, s| {
                    if below(s) {
                        ended = true;
                        return Ok(false);
                    }
                    if s <= max {
                        counted += 1;
                    }
                    steps += 1;
                    Ok(steps < WALK)
                })?
        };
        if ended || past_end {
            return Ok(if max == f64::INFINITY {
                len - steps
            } else {
                counted
            });
        }
        let (mut low, mut high) = ([0u8; G17_MAX_LEN + 1], [0u8; G17_MAX_LEN + 1]);
        api::call_zcount(
            self.ctx,
            self.name,
            bound(min, !min_inclusive, &mut low),
            bound(max, false, &mut high),
        )
    }

    fn zset_from_last(&self, rank: i64, visit: &mut EntryVisitor<'_>) -> Result<bool, ErrorReply> {
        let len = self.zset_len()?;
        if rank < 0 || rank >= len {
            return Ok(false);
        }
        // The nearer end, if it is near: `rank` back from the last, or `len - 1 - rank` on from
        // the first.
        let from_first = len - 1 - rank;
        let (from_last, mut skip) = if rank.min(from_first) >= WALK {
            return api::call_zrevrange_one(self.ctx, self.name, rank, visit);
        } else if rank <= from_first {
            (true, rank)
        } else {
            (false, from_first)
        };
        let mut found = false;
        self.key
            .zset_walk(from_last, f64::NEG_INFINITY, f64::INFINITY, &mut |m, s| {
                if skip > 0 {
                    skip -= 1;
                    return Ok(true);
                }
                found = true;
                visit(m.as_ref(), s)?;
                Ok(false)
            })?;
        Ok(found)
    }

    fn zset_score(&self, member: &[u8]) -> Result<Option<f64>, ErrorReply> {
        if self.kind()? != KeyKind::Zset {
            return Ok(None);
        }
        let member = TempString::new(self.ctx, member)?;
        self.key.zset_score(member.as_ptr())
    }

    fn zset_first(&self, count: i64, visit: &mut EntryVisitor<'_>) -> Result<(), ErrorReply> {
        if count <= 0 || self.kind()? != KeyKind::Zset {
            return Ok(());
        }
        let mut left = count;
        self.key
            .zset_walk(false, f64::NEG_INFINITY, f64::INFINITY, &mut |m, s| {
                visit(m.as_ref(), s)?;
                left -= 1;
                Ok(left > 0)
            })
            .map(|_| ())
    }

    fn hash_len(&self) -> Result<i64, ErrorReply> {
        if self.kind()? != KeyKind::Hash {
            return Ok(0);
        }
        self.key.value_len()
    }

    fn has_expiry(&self) -> Result<bool, ErrorReply> {
        Ok(self.key.abs_expire_of(self.kind()?)?.is_some())
    }

    fn writable(&self) -> Result<(), ErrorReply> {
        api::check_memory()
    }

    fn apply(&mut self, effect: &Effect<'_>) -> Result<(), ErrorReply> {
        // The type the reads found holds until this write changes the key (a string is set
        // from it); then it is forgotten, and the write's own checks after a change (whether a
        // trim emptied a set) ask the server.
        let applied = match effect {
            Effect::Set {
                value,
                expire_at_ms,
            } => self.set(value, *expire_at_ms),
            Effect::Append {
                entries,
                expire_at_ms,
            } => self.append(entries, *expire_at_ms),
            Effect::Lease {
                trim,
                id,
                expiry,
                expire_at_ms,
            } => self.lease(*trim, id, *expiry, *expire_at_ms),
            Effect::Pop {
                trim,
                count,
                expire_at_ms,
            } => self.pop(*trim, *count, *expire_at_ms),
        };
        self.read_kind.set(None);
        applied
    }
}

/// A call's key, opened when the command asks for it.
pub(crate) struct Opener {
    pub(crate) ctx: *mut RedisModuleCtx,
    pub(crate) name: *mut RedisModuleString,
    pub(crate) key: Option<RedisKey>,
}

impl OpenStore for Opener {
    #[inline(always)]
    fn open(&mut self) -> Result<&mut dyn Store, ErrorReply> {
        let key = match self.key.take() {
            Some(key) => key,
            None => RedisKey::open(self.ctx, self.name)?,
        };
        Ok(self.key.insert(key))
    }
}
