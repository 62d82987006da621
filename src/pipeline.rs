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
    /// Sets the fields (in order) and the key's absolute expiry, and propagates exactly that.
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
    let prior = match store.kind()? {
        KeyKind::Empty => None,
        KeyKind::Other => return Err(WRONGTYPE),
        KeyKind::Hash => {
            let mut held: [Option<S::Bytes>; N] = [const { None }; N];
            for (slot, field) in held.iter_mut().zip(L::FIELDS) {
                *slot = store.get(field)?;
            }
            Some(L::decode(
                held.each_ref().map(|v| v.as_ref().map(AsRef::as_ref)),
            )?)
        }
    };
    let (reply, write) = L::decide(args, now_us, prior);
    if let Some(write) = write {
        let mut text = [[0u8; G17_MAX_LEN]; N];
        let mut lens = [0usize; N];
        for ((buf, len), v) in text.iter_mut().zip(lens.iter_mut()).zip(write.values) {
            *len = format_g17(v, buf);
        }
        let mut fields: [(&'static FieldName, &[u8]); N] = L::FIELDS.map(|f| (f, &[][..]));
        for ((slot, buf), len) in fields.iter_mut().zip(&text).zip(lens) {
            slot.1 = buf.get(..len).unwrap_or_default();
        }
        store.write(&fields, write.expire_at_ms)?;
    }
    Ok(reply)
}
