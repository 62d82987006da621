//! Thin, checked wrappers over the Redis module C API used on the command path.
//!
//! Every API pointer is an `Option` filled in at load time; a missing one becomes an error reply,
//! never a panic. Nothing here allocates Rust memory per call.

use std::ffi::{c_int, c_long, c_longlong, c_void};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, PoisonError};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::codec::error::ErrorReply;
use crate::codec::number::{G17_MAX_LEN, format_i64};

pub(crate) const API_MISSING: ErrorReply =
    ErrorReply(c"ERR this Redis server lacks a module API this command needs");

/// Reads an API function pointer, or fails with an error reply.
macro_rules! api {
    ($name:ident) => {
        // SAFETY: a plain read of a function pointer written once, at module load.
        match unsafe { redis_module::raw::$name } {
            Some(f) => Ok(f),
            None => Err($crate::binding::api::API_MISSING),
        }
    };
}
pub(crate) use api;

/// The database the calling client has selected (0 where the call has no client's context).
pub fn selected_db(ctx: *mut RedisModuleCtx) -> i32 {
    match api!(RedisModule_GetSelectedDb) {
        // SAFETY: `ctx` is the context of the call being answered.
        Ok(f) if !ctx.is_null() => unsafe { f(ctx) },
        _ => 0,
    }
}

/// The bytes of a Redis string, borrowed for as long as the string lives.
///
/// # Safety
/// `s` must be a valid `RedisModuleString` that outlives the returned slice and is not modified.
pub unsafe fn string_bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    let Ok(ptr_len) = api!(RedisModule_StringPtrLen) else {
        return &[];
    };
    let mut len = 0usize;
    // SAFETY: `s` is valid per the contract; Redis returns a pointer to `len` bytes it owns.
    unsafe {
        let p = ptr_len(s, &mut len);
        if p.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }
}

/// A Redis string created with no context: it lives until freed (`free_kept_strings`, at
/// module unload).
fn unmanaged_string(bytes: &[u8]) -> Result<*mut RedisModuleString, ErrorReply> {
    let create = api!(RedisModule_CreateString)?;
    // SAFETY: a NULL context makes an unmanaged string; the bytes are valid for `len`.
    let s = unsafe { create(ptr::null_mut(), bytes.as_ptr().cast(), bytes.len()) };
    if s.is_null() { Err(API_MISSING) } else { Ok(s) }
}

/// A string created for one call, freed when dropped.
pub struct TempString {
    ctx: *mut RedisModuleCtx,
    ptr: NonNull<RedisModuleString>,
}

impl TempString {
    pub fn new(ctx: *mut RedisModuleCtx, bytes: &[u8]) -> Result<Self, ErrorReply> {
        let create = api!(RedisModule_CreateString)?;
        // SAFETY: valid context and byte range; Redis copies the bytes.
        let p = unsafe { create(ctx, bytes.as_ptr().cast(), bytes.len()) };
        NonNull::new(p)
            .map(|ptr| Self { ctx, ptr })
            .ok_or(API_MISSING)
    }

    pub fn as_ptr(&self) -> *mut RedisModuleString {
        self.ptr.as_ptr()
    }

    fn adopt(ctx: *mut RedisModuleCtx, p: *mut RedisModuleString) -> Option<Self> {
        NonNull::new(p).map(|ptr| Self { ctx, ptr })
    }
}

impl AsRef<[u8]> for TempString {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the string lives as long as `self` and is never modified.
        unsafe { string_bytes(self.ptr.as_ptr()) }
    }
}

impl Drop for TempString {
    fn drop(&mut self) {
        // SAFETY: we own one reference to the string, created in this context.
        if let Some(free) = unsafe { raw::RedisModule_FreeString } {
            unsafe { free(self.ctx, self.ptr.as_ptr()) }
        }
    }
}

/// A key opened for reading and writing, closed when dropped.
/// The type of an open key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    String,
    Hash,
    Zset,
    Other,
}

pub struct OpenKey {
    ctx: *mut RedisModuleCtx,
    key: NonNull<RedisModuleKey>,
}

impl OpenKey {
    pub fn open(
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
    ) -> Result<Self, ErrorReply> {
        let open = api!(RedisModule_OpenKey)?;
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: valid context and key name from argv.
        let key = unsafe { open(ctx, name, mode) };
        NonNull::new(key.cast::<RedisModuleKey>())
            .map(|key| Self { ctx, key })
            .ok_or(API_MISSING)
    }

    /// What the key holds.
    pub fn kind(&self) -> Result<KeyKind, ErrorReply> {
        let key_type = api!(RedisModule_KeyType)?;
        // SAFETY: the key is open.
        let t = unsafe { key_type(self.key.as_ptr()) } as isize;
        Ok(match t {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Empty,
            raw::REDISMODULE_KEYTYPE_STRING => KeyKind::String,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            raw::REDISMODULE_KEYTYPE_ZSET => KeyKind::Zset,
            _ => KeyKind::Other,
        })
    }

    /// One field of a hash key; `None` when the field is absent.
    pub fn hash_get(
        &self,
        field: *mut RedisModuleString,
    ) -> Result<Option<TempString>, ErrorReply> {
        let get = api!(RedisModule_HashGet)?;
        let mut out: *mut RedisModuleString = ptr::null_mut();
        let none = raw::REDISMODULE_HASH_NONE as c_int;
        // SAFETY: NULL-terminated variadic list of (field, out-pointer) pairs.
        unsafe {
            get(
                self.key.as_ptr(),
                none,
                field,
                &mut out as *mut _,
                ptr::null_mut::<u8>(),
            )
        };
        Ok(TempString::adopt(self.ctx, out))
    }

    /// The key's absolute expiry in Unix milliseconds, `None` when it has none.
    pub fn abs_expire(&self) -> Result<Option<i64>, ErrorReply> {
        self.abs_expire_of(self.kind()?)
    }

    /// `abs_expire` of a key of type `kind`, known to the caller.
    pub fn abs_expire_of(&self, kind: KeyKind) -> Result<Option<i64>, ErrorReply> {
        // An empty key has none; asking Redis would still search the expiry table.
        if kind == KeyKind::Empty {
            return Ok(None);
        }
        let get = api!(RedisModule_GetAbsExpire)?;
        // SAFETY: the key is open.
        let at = unsafe { get(self.key.as_ptr()) };
        Ok((at != raw::REDISMODULE_NO_EXPIRE as i64).then_some(at))
    }

    pub fn set_abs_expire(&self, unix_ms: i64) -> Result<(), ErrorReply> {
        let set = api!(RedisModule_SetAbsExpire)?;
        // SAFETY: the key is open for writing and holds a value.
        unsafe { set(self.key.as_ptr(), unix_ms) };
        Ok(())
    }
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        // SAFETY: the key was opened by us and is closed once.
        if let Some(close) = unsafe { raw::RedisModule_CloseKey } {
            unsafe { close(self.key.as_ptr()) }
        }
    }
}

/// Propagates `PEXPIREAT key unix_ms`: an absolute time, so replicas and AOF replays agree.
pub fn replicate_pexpireat(
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleString,
    unix_ms: i64,
) -> Result<(), ErrorReply> {
    let replicate = api!(RedisModule_Replicate)?;
    // SAFETY: format "sl" takes a key string and a long long.
    unsafe {
        replicate(
            ctx,
            c"PEXPIREAT".as_ptr(),
            c"sl".as_ptr(),
            key,
            unix_ms as c_longlong,
        )
    };
    Ok(())
}

pub fn reply_error(ctx: *mut RedisModuleCtx, err: ErrorReply) -> c_int {
    match api!(RedisModule_ReplyWithError) {
        // SAFETY: valid context; the message is NUL-terminated and static.
        Ok(f) => unsafe { f(ctx, err.0.as_ptr()) },
        Err(_) => raw::REDISMODULE_ERR as c_int,
    }
}

pub fn reply_integers(ctx: *mut RedisModuleCtx, values: &[i64]) -> c_int {
    let (Ok(array), Ok(int)) = (
        api!(RedisModule_ReplyWithArray),
        api!(RedisModule_ReplyWithLongLong),
    ) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    // SAFETY: valid context; the array length matches the elements that follow.
    unsafe {
        array(ctx, values.len() as c_long);
        for v in values {
            int(ctx, *v as c_longlong);
        }
    }
    raw::REDISMODULE_OK as c_int
}

pub fn reply_integer(ctx: *mut RedisModuleCtx, value: i64) -> c_int {
    match api!(RedisModule_ReplyWithLongLong) {
        // SAFETY: valid context.
        Ok(f) => unsafe { f(ctx, value as c_longlong) },
        Err(_) => raw::REDISMODULE_ERR as c_int,
    }
}

/// An array of `head` integers followed by one integer array per element of `nested`.
pub fn reply_nested<R: AsRef<[i64]>>(
    ctx: *mut RedisModuleCtx,
    head: &[i64],
    nested: &[R],
) -> c_int {
    let (Ok(array), Ok(int)) = (
        api!(RedisModule_ReplyWithArray),
        api!(RedisModule_ReplyWithLongLong),
    ) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    // SAFETY: valid context; every array length matches the elements that follow it.
    unsafe {
        array(ctx, (head.len() + nested.len()) as c_long);
        for v in head {
            int(ctx, *v as c_longlong);
        }
        for inner in nested {
            let inner = inner.as_ref();
            array(ctx, inner.len() as c_long);
            for v in inner {
                int(ctx, *v as c_longlong);
            }
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// `+OK`.
pub fn reply_ok(ctx: *mut RedisModuleCtx) -> c_int {
    match api!(RedisModule_ReplyWithSimpleString) {
        // SAFETY: valid context; the string is NUL-terminated.
        Ok(f) => unsafe { f(ctx, c"OK".as_ptr()) },
        Err(_) => raw::REDISMODULE_ERR as c_int,
    }
}

/// `RL.TOP`'s reply: per entry `[key, denied, error, command, first_denied_ms, last_denied_ms]`,
/// with the key's database after the key when `with_db` (`RL.TOP count WITHDB`).
pub fn reply_top(
    ctx: *mut RedisModuleCtx,
    entries: &[crate::observe::top::Entry],
    with_db: bool,
) -> c_int {
    let (Ok(array), Ok(int), Ok(bulk)) = (
        api!(RedisModule_ReplyWithArray),
        api!(RedisModule_ReplyWithLongLong),
        api!(RedisModule_ReplyWithStringBuffer),
    ) else {
        return raw::REDISMODULE_ERR as c_int;
    };
    let saturate = |v: u64| c_longlong::try_from(v).unwrap_or(c_longlong::MAX);
    // SAFETY: valid context; every array length matches the elements that follow it, and Redis
    // copies the buffers.
    unsafe {
        array(ctx, entries.len() as c_long);
        for e in entries {
            array(ctx, if with_db { 7 } else { 6 });
            bulk(ctx, e.key.as_ptr().cast(), e.key.len());
            if with_db {
                int(ctx, e.db as c_longlong);
            }
            int(ctx, saturate(e.denied));
            int(ctx, saturate(e.error));
            let command = e.command.to_bytes();
            bulk(ctx, command.as_ptr().cast(), command.len());
            int(ctx, e.first_denied_ms as c_longlong);
            int(ctx, e.last_denied_ms as c_longlong);
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// Redis's own reply to a write refused for lack of memory.
pub const OOM: ErrorReply = ErrorReply(c"OOM command not allowed when used memory > 'maxmemory'.");

/// Fails with Redis's OOM error when the server is over `maxmemory` (and may not evict). Called
/// right before a write, so denials and peeks keep answering under memory pressure.
pub fn check_memory() -> Result<(), ErrorReply> {
    // The share of `maxmemory` in use as eviction counts it (0 without a limit): above 1 is when
    // Redis sets the OOM context flag (up to the float's rounding, about maxmemory / 2^24 bytes),
    // and asking for it alone costs a fraction of computing every context flag.
    let used_ratio = api!(RedisModule_GetUsedMemoryRatio)?;
    // SAFETY: takes no arguments, only reads the server's memory counters.
    if unsafe { used_ratio() } > 1.0 {
        Err(OOM)
    } else {
        Ok(())
    }
}

/// True when Redis calls the command only to learn its key positions (flag `getkeys-api`).
pub fn is_keys_position_request(ctx: *mut RedisModuleCtx) -> bool {
    match api!(RedisModule_IsKeysPositionRequest) {
        // SAFETY: valid context.
        Ok(f) => unsafe { f(ctx) != 0 },
        Err(_) => false,
    }
}

/// Answers a key-positions request.
pub fn report_key_positions(ctx: *mut RedisModuleCtx, positions: std::ops::Range<usize>) -> c_int {
    if let Ok(key_at) = api!(RedisModule_KeyAtPos) {
        for pos in positions {
            // SAFETY: valid context during a key-positions request; positions are within argc.
            unsafe { key_at(ctx, pos as c_int) };
        }
    }
    raw::REDISMODULE_OK as c_int
}

impl OpenKey {
    /// The bytes of a string key, valid while the key stays open and unmodified.
    pub fn string_bytes(&self) -> Result<&[u8], ErrorReply> {
        let dma = api!(RedisModule_StringDMA)?;
        let mut len = 0usize;
        let mode = raw::REDISMODULE_READ as c_int;
        // SAFETY: the key is open and holds a string; Redis returns `len` bytes it owns, which
        // live until the key is closed or written (both need `&mut self` or drop).
        unsafe {
            let p = dma(self.key.as_ptr(), &mut len, mode);
            if p.is_null() {
                Err(API_MISSING)
            } else {
                Ok(std::slice::from_raw_parts(p.cast::<u8>(), len))
            }
        }
    }

    /// Overwrites a string key's value in place when the new one has the same length (the
    /// key, its expiry and its allocation stay). Returns false, writing nothing, otherwise.
    pub fn string_overwrite_same_length(&mut self, value: &[u8]) -> Result<bool, ErrorReply> {
        let dma = api!(RedisModule_StringDMA)?;
        let mut len = 0usize;
        let mode = raw::REDISMODULE_WRITE as c_int;
        // SAFETY: the key is open for writing and holds a string; Redis returns its own buffer
        // of `len` bytes, which we fill only when the lengths match.
        unsafe {
            let p = dma(self.key.as_ptr(), &mut len, mode);
            if p.is_null() || len != value.len() {
                return Ok(false);
            }
            ptr::copy_nonoverlapping(value.as_ptr(), p.cast::<u8>(), len);
        }
        Ok(true)
    }

    /// Replaces the key's value with a string (dropping any expiry, as `SET` does).
    pub fn string_set(&mut self, value: *mut RedisModuleString) -> Result<(), ErrorReply> {
        let set = api!(RedisModule_StringSet)?;
        // SAFETY: the key is open for writing; Redis takes its own reference to `value`.
        unsafe { set(self.key.as_ptr(), value) };
        Ok(())
    }
}

/// The string kept in `cell`, made (unmanaged) on first use: for names and constant arguments that
/// live as long as the module. Format `s` of `RedisModule_Replicate` hands Redis a reference to
/// one, where `c` would copy it into a new object on every call. Commands run on the main thread
/// only, so the cell is filled once, and listed for `free_kept_strings`.
#[inline(always)]
pub fn kept_string(
    cell: &'static AtomicPtr<c_void>,
    text: &[u8],
) -> Result<*mut RedisModuleString, ErrorReply> {
    let kept = cell.load(Ordering::Relaxed);
    if !kept.is_null() {
        return Ok(kept.cast());
    }
    make_kept_string(cell, text)
}

/// `kept_string`'s first call for a cell, out of the line every later call runs.
#[cold]
#[inline(never)]
fn make_kept_string(
    cell: &'static AtomicPtr<c_void>,
    text: &[u8],
) -> Result<*mut RedisModuleString, ErrorReply> {
    let made = unmanaged_string(text)?;
    cell.store(made.cast(), Ordering::Relaxed);
    KEPT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(cell);
    Ok(made)
}

/// Every cell `kept_string` filled.
static KEPT: Mutex<Vec<&'static AtomicPtr<c_void>>> = Mutex::new(Vec::new());

/// Frees every kept string and empties its cell (and the list), so that module unload leaves
/// none behind and a cell never points at a freed string.
pub fn free_kept_strings() {
    let cells = std::mem::take(&mut *KEPT.lock().unwrap_or_else(PoisonError::into_inner));
    let Ok(free) = api!(RedisModule_FreeString) else {
        return;
    };
    for cell in cells {
        let s = cell.swap(ptr::null_mut(), Ordering::Relaxed);
        if !s.is_null() {
            // SAFETY: an unmanaged string made by `kept_string`, freed once (its cell is empty
            // from now on), with the NULL context it was made with.
            unsafe { free(ptr::null_mut(), s.cast()) };
        }
    }
}

static PXAT: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Propagates `SET key value PXAT unix_ms`: one command, with an absolute expiry. The key is the
/// caller's argument and `PXAT` a kept string (both passed by reference); the value and the
/// expiry are each copied once, the expiry as digits formatted here (format `l` would build it
/// through an sds and a second object).
pub fn replicate_set_pxat(
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleString,
    value: &[u8],
    unix_ms: i64,
) -> Result<(), ErrorReply> {
    let replicate = api!(RedisModule_Replicate)?;
    let pxat = kept_string(&PXAT, b"PXAT")?;
    let mut digits = [0u8; G17_MAX_LEN];
    let digits_len = format_i64(unix_ms, &mut digits);
    // SAFETY: format "sbsb": key string, buffer and its length (copied), string, buffer and its
    // length (copied).
    unsafe {
        replicate(
            ctx,
            c"SET".as_ptr(),
            c"sbsb".as_ptr(),
            key,
            value.as_ptr(),
            value.len(),
            pxat,
            digits.as_ptr(),
            digits_len,
        )
    };
    Ok(())
}

/// Tells WATCH, client-side caching and keyspace-notification subscribers that a string was set
/// with an expiry: `set`, then `expire`, the events of `SET key value PXAT ms` (what replicas and
/// the Lua twins run).
pub fn signal_string_write(
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleString,
) -> Result<(), ErrorReply> {
    let signal = api!(RedisModule_SignalModifiedKey)?;
    let notify = api!(RedisModule_NotifyKeyspaceEvent)?;
    // SAFETY: valid context and key name; the event names are NUL-terminated.
    unsafe {
        signal(ctx, key);
        notify(ctx, raw::REDISMODULE_NOTIFY_STRING, c"set".as_ptr(), key);
        notify(
            ctx,
            raw::REDISMODULE_NOTIFY_GENERIC,
            c"expire".as_ptr(),
            key,
        );
    }
    Ok(())
}

/// Sorted-set access on an open key, for limiters whose state is one sorted set.
impl OpenKey {
    /// The number of entries of a sorted set.
    pub fn zset_len(&self) -> Result<i64, ErrorReply> {
        self.value_len()
    }

    /// The length of the key's value: entries of a sorted set, fields of a hash.
    pub fn value_len(&self) -> Result<i64, ErrorReply> {
        let len = api!(RedisModule_ValueLength)?;
        // SAFETY: the key is open.
        let n = unsafe { len(self.key.as_ptr()) };
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Visits the entries with `min <= score <= max` in Redis order (score, then member bytes),
    /// from the first or from the last, while `visit` returns true. Returns true when the walk
    /// went past the last entry of the range.
    pub fn zset_walk(
        &self,
        from_last: bool,
        min: f64,
        max: f64,
        visit: &mut dyn FnMut(TempString, f64) -> Result<bool, ErrorReply>,
    ) -> Result<bool, ErrorReply> {
        let (start, step) = if from_last {
            (
                api!(RedisModule_ZsetLastInScoreRange)?,
                api!(RedisModule_ZsetRangePrev)?,
            )
        } else {
            (
                api!(RedisModule_ZsetFirstInScoreRange)?,
                api!(RedisModule_ZsetRangeNext)?,
            )
        };
        let end_reached = api!(RedisModule_ZsetRangeEndReached)?;
        let current = api!(RedisModule_ZsetRangeCurrentElement)?;
        let stop = api!(RedisModule_ZsetRangeStop)?;
        let key = self.key.as_ptr();
        // SAFETY: the key is open and holds a sorted set (else the range is refused).
        if unsafe { start(key, min, max, 0, 0) } != raw::REDISMODULE_OK as c_int {
            return Ok(true);
        }
        let mut walk = || -> Result<bool, ErrorReply> {
            // SAFETY: the range iterator is active on this key until `stop` below.
            while unsafe { end_reached(key) } == 0 {
                let mut score = 0.0f64;
                let Some(member) = TempString::adopt(self.ctx, unsafe { current(key, &mut score) })
                else {
                    return Ok(true);
                };
                if !visit(member, score)? {
                    return Ok(false);
                }
                if unsafe { step(key) } == 0 {
                    return Ok(true);
                }
            }
            Ok(true)
        };
        let result = walk();
        // SAFETY: ends the iterator started above, also after an error.
        unsafe { stop(key) };
        result
    }

    pub fn zset_add(&self, score: f64, member: *mut RedisModuleString) -> Result<(), ErrorReply> {
        let add = api!(RedisModule_ZsetAdd)?;
        let mut flags: c_int = 0;
        // SAFETY: the key is open for writing; Redis copies the member.
        if unsafe { add(self.key.as_ptr(), score, member, &mut flags) }
            == raw::REDISMODULE_OK as c_int
        {
            Ok(())
        } else {
            Err(API_MISSING)
        }
    }

    /// The score of `member`, `None` when it is not in the set.
    pub fn zset_score(&self, member: *mut RedisModuleString) -> Result<Option<f64>, ErrorReply> {
        let score_of = api!(RedisModule_ZsetScore)?;
        let mut score = 0.0f64;
        // SAFETY: the key is open and holds a sorted set.
        let found = unsafe { score_of(self.key.as_ptr(), member, &mut score) };
        Ok((found == raw::REDISMODULE_OK as c_int).then_some(score))
    }

    pub fn zset_rem(&self, member: *mut RedisModuleString) -> Result<(), ErrorReply> {
        let rem = api!(RedisModule_ZsetRem)?;
        let mut deleted: c_int = 0;
        // SAFETY: the key is open for writing and holds a sorted set.
        unsafe { rem(self.key.as_ptr(), member, &mut deleted) };
        Ok(())
    }
}

/// Propagates `<command> key args...` to replicas and the AOF.
pub fn replicate_key_command(
    ctx: *mut RedisModuleCtx,
    command: &'static std::ffi::CStr,
    key: *mut RedisModuleString,
    args: &[*mut RedisModuleString],
) -> Result<(), ErrorReply> {
    let replicate = api!(RedisModule_Replicate)?;
    // SAFETY: format "sv" takes a key string and an array of strings with its length.
    unsafe {
        replicate(
            ctx,
            command.as_ptr(),
            c"sv".as_ptr(),
            key,
            args.as_ptr(),
            args.len(),
        )
    };
    Ok(())
}

/// What a write did to a sorted set, for its keyspace events.
pub struct ZsetWrite {
    /// Entries were trimmed (`zremrangebyrank`).
    pub trimmed: bool,
    /// The entry event: `zadd` or `zrem`.
    pub event: &'static std::ffi::CStr,
    /// The set was left empty, so the key is gone (`del`).
    pub deleted: bool,
    /// The expiry moved (`expire`).
    pub expiry_moved: bool,
}

/// Tells WATCH, client-side caching and keyspace-notification subscribers what a write did to a
/// sorted set, as the replicated commands would.
pub fn signal_zset_write(
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleString,
    w: &ZsetWrite,
) -> Result<(), ErrorReply> {
    let signal = api!(RedisModule_SignalModifiedKey)?;
    let notify = api!(RedisModule_NotifyKeyspaceEvent)?;
    // SAFETY: valid context and key name; the event names are NUL-terminated.
    unsafe {
        signal(ctx, key);
        if w.trimmed {
            notify(
                ctx,
                raw::REDISMODULE_NOTIFY_ZSET,
                c"zremrangebyrank".as_ptr(),
                key,
            );
        }
        notify(ctx, raw::REDISMODULE_NOTIFY_ZSET, w.event.as_ptr(), key);
        if w.deleted {
            notify(ctx, raw::REDISMODULE_NOTIFY_GENERIC, c"del".as_ptr(), key);
        }
        if w.expiry_moved {
            notify(
                ctx,
                raw::REDISMODULE_NOTIFY_GENERIC,
                c"expire".as_ptr(),
                key,
            );
        }
    }
    Ok(())
}

/// A command run inside this one (`RedisModule_Call`) failed or answered unexpectedly.
const CALL_FAILED: ErrorReply =
    ErrorReply(c"ERR internal error in the rate limiter module (a sorted-set read failed)");

/// The reply of a command run with `RedisModule_Call`, freed when dropped.
struct CallReply(NonNull<raw::RedisModuleCallReply>);

impl CallReply {
    fn new(reply: *mut raw::RedisModuleCallReply) -> Result<Self, ErrorReply> {
        NonNull::new(reply).map(CallReply).ok_or(CALL_FAILED)
    }

    fn integer(&self) -> Result<i64, ErrorReply> {
        let kind = api!(RedisModule_CallReplyType)?;
        let integer = api!(RedisModule_CallReplyInteger)?;
        // SAFETY: a live reply.
        unsafe {
            if kind(self.0.as_ptr()) != raw::REDISMODULE_REPLY_INTEGER as c_int {
                return Err(CALL_FAILED);
            }
            Ok(integer(self.0.as_ptr()))
        }
    }

    /// The bytes of element `i` of an array reply of strings.
    fn element(&self, i: usize) -> Result<Option<&[u8]>, ErrorReply> {
        let kind = api!(RedisModule_CallReplyType)?;
        let length = api!(RedisModule_CallReplyLength)?;
        let element = api!(RedisModule_CallReplyArrayElement)?;
        let string = api!(RedisModule_CallReplyStringPtr)?;
        // SAFETY: a live reply; elements and their bytes live as long as it does.
        unsafe {
            let r = self.0.as_ptr();
            if kind(r) != raw::REDISMODULE_REPLY_ARRAY as c_int {
                return Err(CALL_FAILED);
            }
            if i >= length(r) {
                return Ok(None);
            }
            let e = element(r, i);
            if e.is_null() {
                return Err(CALL_FAILED);
            }
            let mut len = 0usize;
            let p = string(e, &mut len);
            if p.is_null() {
                return Err(CALL_FAILED);
            }
            Ok(Some(std::slice::from_raw_parts(p.cast::<u8>(), len)))
        }
    }
}

impl Drop for CallReply {
    fn drop(&mut self) {
        // SAFETY: the reply is ours and freed once.
        if let Some(free) = unsafe { raw::RedisModule_FreeCallReply } {
            unsafe { free(self.0.as_ptr()) }
        }
    }
}

/// `ZCOUNT key min max` (bounds as Redis reads them: `(x` is exclusive), run inside this call:
/// O(log n) where walking the set would be O(n).
pub fn call_zcount(
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleString,
    min: &[u8],
    max: &[u8],
) -> Result<i64, ErrorReply> {
    let call = api!(RedisModule_Call)?;
    // SAFETY: format "sbb": a key string and two buffers with their lengths (copied).
    let reply = unsafe {
        call(
            ctx,
            c"ZCOUNT".as_ptr(),
            c"sbb".as_ptr(),
            key,
            min.as_ptr(),
            min.len(),
            max.as_ptr(),
            max.len(),
        )
    };
    CallReply::new(reply)?.integer()
}

/// `ZREVRANGE key rank rank WITHSCORES` run inside this call: visits that entry's member and
/// score, or returns false when there is none. O(log n).
pub fn call_zrevrange_one(
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleString,
    rank: i64,
    visit: &mut crate::store::EntryVisitor<'_>,
) -> Result<bool, ErrorReply> {
    let call = api!(RedisModule_Call)?;
    // SAFETY: format "sllc": a key string, two long longs and a C string.
    let reply = unsafe {
        call(
            ctx,
            c"ZREVRANGE".as_ptr(),
            c"sllc".as_ptr(),
            key,
            rank as c_longlong,
            rank as c_longlong,
            c"WITHSCORES".as_ptr(),
        )
    };
    let reply = CallReply::new(reply)?;
    let (Some(member), Some(score)) = (reply.element(0)?, reply.element(1)?) else {
        return Ok(false);
    };
    // Redis prints scores so that they read back exactly (also `inf` and `-inf`).
    let score = std::str::from_utf8(score)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .ok_or(CALL_FAILED)?;
    visit(member, score)?;
    Ok(true)
}

/// `ACL CAT category` run inside this call (at load): the commands in it, as the server names
/// them.
pub fn call_acl_cat(
    ctx: *mut RedisModuleCtx,
    category: &std::ffi::CStr,
) -> Result<Vec<String>, ErrorReply> {
    let call = api!(RedisModule_Call)?;
    // SAFETY: format "cc": two NUL-terminated C strings.
    let reply = unsafe {
        call(
            ctx,
            c"ACL".as_ptr(),
            c"cc".as_ptr(),
            c"CAT".as_ptr(),
            category.as_ptr(),
        )
    };
    let reply = CallReply::new(reply)?;
    let mut names = Vec::new();
    while let Some(name) = reply.element(names.len())? {
        names.push(String::from_utf8_lossy(name).into_owned());
    }
    Ok(names)
}
