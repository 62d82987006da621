//! Storage trait for limiters whose state is one sorted set, implemented by the Redis binding
//! (module key API) and by the in-memory model of the differential tests. No Redis types here.

use crate::error::ErrorReply;

/// What a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZsetKind {
    Empty,
    Zset,
    Other,
}

/// New entries `<score>:<first_index>` .. `<score>:<first_index + count - 1>`, all at `score`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZsetWrite {
    /// Remove entries with a score up to and including this one first.
    pub trim_up_to: Option<f64>,
    pub score: f64,
    pub first_index: i64,
    pub count: i64,
    /// Absolute expiry in Unix milliseconds.
    pub expire_at_ms: i64,
}

/// Called for each stored entry with its member and score; an error stops the scan.
pub type EntryVisitor<'a> = dyn FnMut(&[u8], f64) -> Result<(), ErrorReply> + 'a;

/// One open key of a storage layer.
pub trait ZsetStore {
    fn kind(&self) -> Result<ZsetKind, ErrorReply>;
    /// Visits every entry in Redis order (score, then member bytes); stops at the first error.
    fn scan(&self, visit: &mut EntryVisitor<'_>) -> Result<(), ErrorReply>;
    /// Applies the write and the absolute expiry, and propagates exactly that
    /// (`ZREMRANGEBYSCORE` when trimming, `ZADD`, `PEXPIREAT`).
    fn write(&mut self, write: &ZsetWrite) -> Result<(), ErrorReply>;
}

/// Writes the member name `<score>:<index>` into `out` (cleared first). Scores are integers.
pub fn member_name(score: f64, index: i64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    let _ = write!(out, "{}:{}", crate::core::lua_integer(score), index);
}
