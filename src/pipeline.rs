//! The decision pipeline shared by every limiter whose state is one hash of numeric fields,
//! written against a storage trait: the Redis binding implements it over the module key API, and
//! the differential tests over an in-memory store. No Redis types here.
//!
//! load (key kind, fields) -> decode -> decide -> encode (`%.17g`) -> store with expiry.

use std::ffi::{CStr, c_void};
use std::sync::atomic::AtomicPtr;

use crate::core::Reply;
use crate::error::{ErrorReply, WRONGTYPE};
use crate::number::{G17_MAX_LEN, format_g17};
use crate::stats::CommandStats;

/// A hash field name. `handle` is a slot where a storage layer may keep its own representation of
/// the name (the Redis binding keeps a `RedisModuleString` there, created once).
pub struct FieldName {
    pub name: &'static CStr,
    pub handle: AtomicPtr<c_void>,
}

impl FieldName {
    pub const fn new(name: &'static CStr) -> Self {
        Self {
            name,
            handle: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

/// What a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Hash,
    Other,
}

/// One open key of a storage layer.
pub trait HashStore {
    type Bytes: AsRef<[u8]>;
    fn kind(&self) -> Result<KeyKind, ErrorReply>;
    fn get(&self, field: &'static FieldName) -> Result<Option<Self::Bytes>, ErrorReply>;
    /// Several fields; a store may fetch them in one go.
    fn get_many<const N: usize>(
        &self,
        fields: [&'static FieldName; N],
    ) -> Result<[Option<Self::Bytes>; N], ErrorReply> {
        let mut out: [Option<Self::Bytes>; N] = [const { None }; N];
        for (slot, field) in out.iter_mut().zip(fields) {
            *slot = self.get(field)?;
        }
        Ok(out)
    }
    /// Sets the given fields (in order; the others keep their values) and the key's absolute
    /// expiry, and propagates exactly that.
    fn write(
        &mut self,
        fields: &[(&'static FieldName, &[u8])],
        expire_at_ms: i64,
    ) -> Result<(), ErrorReply>;
}

/// New field values (in `FIELDS` order) and the key's absolute expiry in Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HashWrite<const N: usize> {
    pub values: [f64; N],
    pub expire_at_ms: i64,
}

/// One limiter command whose state is a hash of `N` numeric fields.
pub trait HashLimiter<const N: usize> {
    type Args;
    type State: Copy;

    /// The command's name as registered (`RL.TOKENBUCKET`).
    const NAME: &'static CStr;
    /// The command's counters, shown by INFO.
    const STATS: &'static CommandStats;

    /// Field names, in the order `decode` reads them and `HashWrite::values` stores them.
    const FIELDS: [&'static FieldName; N];
    /// The reply to a call with too few or too many arguments.
    const ARITY_ERROR: ErrorReply;

    /// Arguments after the key.
    fn parse(args: &[&[u8]]) -> Result<Self::Args, ErrorReply>;
    /// The stored fields of an existing hash (absent fields are `None`).
    fn decode(fields: [Option<&[u8]>; N]) -> Result<Self::State, ErrorReply>;
    fn decide(
        args: &Self::Args,
        now_us: i64,
        prior: Option<Self::State>,
    ) -> (Reply, Option<HashWrite<N>>);
}

/// Loads, decides and stores for one call whose arguments are already parsed.
pub fn apply<L: HashLimiter<N>, S: HashStore, const N: usize>(
    store: &mut S,
    args: &L::Args,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let mut held: [Option<S::Bytes>; N] = [const { None }; N];
    let prior = match store.kind()? {
        KeyKind::Empty => None,
        KeyKind::Other => return Err(WRONGTYPE),
        KeyKind::Hash => {
            held = store.get_many(L::FIELDS)?;
            Some(L::decode(
                held.each_ref().map(|v| v.as_ref().map(AsRef::as_ref)),
            )?)
        }
    };
    let (reply, write) = L::decide(args, now_us, prior);
    if let Some(write) = write {
        let stored = held.each_ref().map(|v| v.as_ref().map(AsRef::as_ref));
        store_write(store, L::FIELDS, &write, stored)?;
    }
    Ok(reply)
}

/// Formats the values as Redis stores Lua numbers (`%.17g`) and writes them with the expiry.
/// Only fields whose stored bytes change are written (all of them when none would change, so
/// an admitted call always writes): the resulting hash is the same, the write and its
/// replication are smaller.
fn store_write<S: DynHashStore + ?Sized, const N: usize>(
    store: &mut S,
    names: [&'static FieldName; N],
    write: &HashWrite<N>,
    stored: [Option<&[u8]>; N],
) -> Result<(), ErrorReply> {
    let mut text = [[0u8; G17_MAX_LEN]; N];
    let mut lens = [0usize; N];
    for ((buf, len), v) in text.iter_mut().zip(lens.iter_mut()).zip(write.values) {
        *len = format_g17(v, buf);
    }
    let mut all: [(&'static FieldName, &[u8]); N] = names.map(|f| (f, &[][..]));
    for ((slot, buf), len) in all.iter_mut().zip(&text).zip(lens) {
        slot.1 = buf.get(..len).unwrap_or_default();
    }
    let mut changed: [(&'static FieldName, &[u8]); N] = all;
    let mut used = 0;
    for (field, old) in all.iter().zip(stored) {
        if old != Some(field.1)
            && let Some(slot) = changed.get_mut(used)
        {
            *slot = *field;
            used += 1;
        }
    }
    let fields = match changed.get(..used) {
        Some(some) if !some.is_empty() => some,
        _ => &all[..],
    };
    store.write(fields, write.expire_at_ms)
}

/// A storage key seen through an object-safe interface, for calls that mix algorithms.
pub trait DynHashStore {
    fn kind(&self) -> Result<KeyKind, ErrorReply>;
    fn get_owned(&self, field: &'static FieldName) -> Result<Option<Vec<u8>>, ErrorReply>;
    fn write(
        &mut self,
        fields: &[(&'static FieldName, &[u8])],
        expire_at_ms: i64,
    ) -> Result<(), ErrorReply>;
}

impl<S: HashStore> DynHashStore for S {
    fn kind(&self) -> Result<KeyKind, ErrorReply> {
        HashStore::kind(self)
    }

    fn get_owned(&self, field: &'static FieldName) -> Result<Option<Vec<u8>>, ErrorReply> {
        Ok(self.get(field)?.map(|b| b.as_ref().to_vec()))
    }

    fn write(
        &mut self,
        fields: &[(&'static FieldName, &[u8])],
        expire_at_ms: i64,
    ) -> Result<(), ErrorReply> {
        HashStore::write(self, fields, expire_at_ms)
    }
}

/// One limit of a multi-limit call: its parsed arguments (with the call's cost, and with cost 0
/// for reporting), its loaded state and, once decided, its pending write.
pub trait Limit {
    fn load(&mut self, store: &dyn DynHashStore) -> Result<(), ErrorReply>;
    /// Decides with the call's cost; the write is kept until `commit`.
    fn decide(&mut self, now_us: i64) -> Reply;
    /// The reply this limit gives without consuming (used when another limit denied the call).
    fn peek(&self, now_us: i64) -> Reply;
    fn commit(&self, store: &mut dyn DynHashStore) -> Result<(), ErrorReply>;
}

pub struct LimitOf<L: HashLimiter<N>, const N: usize> {
    args: L::Args,
    peek_args: L::Args,
    prior: Option<L::State>,
    /// The stored bytes `prior` was decoded from, so a commit writes only what changes.
    stored: [Option<Vec<u8>>; N],
    write: Option<HashWrite<N>>,
}

impl<L: HashLimiter<N>, const N: usize> LimitOf<L, N> {
    /// `params` are the limit's arguments without the cost.
    pub fn parse(params: &[&[u8]], cost: &[u8]) -> Result<Self, ErrorReply> {
        Ok(Self {
            peek_args: Self::parse_with_cost(params, b"0")?,
            args: Self::parse_with_cost(params, cost)?,
            prior: None,
            stored: [const { None }; N],
            write: None,
        })
    }

    fn parse_with_cost(params: &[&[u8]], cost: &[u8]) -> Result<L::Args, ErrorReply> {
        let mut buf: [&[u8]; 8] = [&[]; 8];
        let mut n = 0;
        for (slot, arg) in buf.iter_mut().zip(params.iter().copied().chain([cost])) {
            *slot = arg;
            n += 1;
        }
        if n != params.len() + 1 {
            return Err(L::ARITY_ERROR);
        }
        L::parse(buf.get(..n).unwrap_or_default())
    }
}

impl<L: HashLimiter<N>, const N: usize> Limit for LimitOf<L, N> {
    fn load(&mut self, store: &dyn DynHashStore) -> Result<(), ErrorReply> {
        self.prior = match store.kind()? {
            KeyKind::Empty => None,
            KeyKind::Other => return Err(WRONGTYPE),
            KeyKind::Hash => {
                for (slot, field) in self.stored.iter_mut().zip(L::FIELDS) {
                    *slot = store.get_owned(field)?;
                }
                Some(L::decode(self.stored.each_ref().map(|v| v.as_deref()))?)
            }
        };
        Ok(())
    }

    fn decide(&mut self, now_us: i64) -> Reply {
        let (reply, write) = L::decide(&self.args, now_us, self.prior);
        self.write = write;
        reply
    }

    fn peek(&self, now_us: i64) -> Reply {
        L::decide(&self.peek_args, now_us, self.prior).0
    }

    fn commit(&self, store: &mut dyn DynHashStore) -> Result<(), ErrorReply> {
        let Some(write) = &self.write else {
            return Ok(());
        };
        let stored = self.stored.each_ref().map(|v| v.as_deref());
        store_write(store, L::FIELDS, write, stored)
    }
}

/// The outcome of a multi-limit call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllReply {
    pub allowed: bool,
    /// 1-based position of the first limit that denied; 0 when all admitted.
    pub denied_by: usize,
    pub replies: Vec<Reply>,
}

/// Admits only if every limit admits, consuming from all or none. Keys are loaded in order (the
/// first bad key's error is the reply), decided at one instant, then written only if all admit.
/// A limit that would admit while another denies reports its unconsumed state (cost 0).
pub fn apply_all(
    limits: &mut [Box<dyn Limit>],
    stores: &mut [&mut dyn DynHashStore],
    now_us: i64,
) -> Result<AllReply, ErrorReply> {
    for (limit, store) in limits.iter_mut().zip(stores.iter()) {
        limit.load(&**store)?;
    }
    let mut replies: Vec<Reply> = limits.iter_mut().map(|l| l.decide(now_us)).collect();
    let denied_by = replies.iter().position(|r| !r.allowed).map_or(0, |i| i + 1);
    if denied_by == 0 {
        // A store refuses a write before changing anything (e.g. out of memory), and every store
        // of one call refuses alike, so either all limits are written or none.
        for (limit, store) in limits.iter().zip(stores.iter_mut()) {
            limit.commit(&mut **store)?;
        }
    } else {
        for (reply, limit) in replies.iter_mut().zip(limits.iter()) {
            if reply.allowed {
                *reply = limit.peek(now_us);
            }
        }
    }
    Ok(AllReply {
        allowed: denied_by == 0,
        denied_by,
        replies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: FieldName = FieldName::new(c"a");
    static B: FieldName = FieldName::new(c"b");

    /// Records what a write was asked to set.
    #[derive(Default)]
    struct Recorder {
        written: Vec<(String, String, i64)>,
    }

    impl HashStore for Recorder {
        type Bytes = Vec<u8>;
        fn kind(&self) -> Result<KeyKind, ErrorReply> {
            Ok(KeyKind::Hash)
        }
        fn get(&self, _: &'static FieldName) -> Result<Option<Vec<u8>>, ErrorReply> {
            Ok(None)
        }
        fn write(
            &mut self,
            fields: &[(&'static FieldName, &[u8])],
            expire_at_ms: i64,
        ) -> Result<(), ErrorReply> {
            for (f, v) in fields {
                let name = f.name.to_string_lossy().into_owned();
                let value = String::from_utf8_lossy(v).into_owned();
                self.written.push((name, value, expire_at_ms));
            }
            Ok(())
        }
    }

    fn written(stored: [Option<&[u8]>; 2]) -> Vec<(String, String, i64)> {
        let mut store = Recorder::default();
        let write = HashWrite {
            values: [0.5, 7.0],
            expire_at_ms: 9,
        };
        store_write(&mut store, [&A, &B], &write, stored).unwrap();
        store.written
    }

    fn entry(f: &str, v: &str) -> (String, String, i64) {
        (f.to_string(), v.to_string(), 9)
    }

    #[test]
    fn only_fields_whose_bytes_change_are_written() {
        let both = vec![entry("a", "0.5"), entry("b", "7")];
        assert_eq!(written([None, None]), both, "a new key gets every field");
        assert_eq!(written([Some(b"0.5"), Some(b"6")]), [entry("b", "7")]);
        assert_eq!(written([Some(b"0.25"), Some(b"7")]), [entry("a", "0.5")]);
        // Same number, other bytes (written by hand): rewritten in the canonical form.
        assert_eq!(written([Some(b"0.50"), Some(b"7")]), [entry("a", "0.5")]);
        assert_eq!(written([Some(b"0.5"), None]), [entry("b", "7")]);
        assert_eq!(
            written([Some(b"0.5"), Some(b"7")]),
            both,
            "an admitted call always writes, even when nothing changes"
        );
    }
}
