//! The command table: every command the module registers, and the generic entry points that
//! connect a command's definition (`crate::command`) to Redis.

use std::ffi::c_int;
use std::mem::MaybeUninit;

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::binding::entry::{Answer, Command, INTERNAL_ERROR, Sent, entry};
use crate::binding::key::{Opener, RedisKey};
use crate::binding::{api, clock};
use crate::codec::error::ErrorReply;
use crate::command::registry::{self, REGISTRY};
use crate::command::throttle::{self, ThrottleReply};
use crate::command::{self, Entry, Runner, all, release, settle};
use crate::core::Reply;
use crate::store::all::{AllReply, apply_all};
use crate::store::{Store, zset};

// No limiter is `deny-oom`: under memory pressure Redis would then refuse every call, denials
// and peeks included; instead the module refuses with the same OOM error only the calls that would
// write (`api::check_memory`).

type Handler =
    unsafe extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;

/// The function Redis calls for the command at `I` in `crate::command::REGISTRY`.
unsafe extern "C" fn handler<const I: usize>(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    let Some(e) = (const { registry::entry(I) }) else {
        return api::reply_error(ctx, INTERNAL_ERROR);
    };
    match e.runner {
        Runner::OneKey { .. } => entry(ctx, argv, argc, e.descriptor, run_one::<I>),
        Runner::Throttle => entry(ctx, argv, argc, e.descriptor, run_throttle),
        Runner::Release => entry(ctx, argv, argc, e.descriptor, run_release),
        Runner::All => entry(ctx, argv, argc, e.descriptor, all_body),
        Runner::Settle => entry(ctx, argv, argc, e.descriptor, settle_body),
    }
}

/// One handler per place in the registry (the registry may grow to this many commands).
const HANDLERS: [Handler; 16] = [
    handler::<0>,
    handler::<1>,
    handler::<2>,
    handler::<3>,
    handler::<4>,
    handler::<5>,
    handler::<6>,
    handler::<7>,
    handler::<8>,
    handler::<9>,
    handler::<10>,
    handler::<11>,
    handler::<12>,
    handler::<13>,
    handler::<14>,
    handler::<15>,
];
const _: () = assert!(REGISTRY.len() <= HANDLERS.len());

/// Every command of the registry, in its order, with its handler.
pub fn all_commands() -> impl Iterator<Item = Command> {
    REGISTRY.iter().zip(HANDLERS).map(|(e, handler)| Command {
        descriptor: e.descriptor,
        handler,
    })
}

pub const TEST_CLOCK: Command = Command {
    descriptor: &clock::DESCRIPTOR,
    handler: test_clock_command,
};

/// `RL.TOP`, registered beside the limiters but outside their ACL category.
pub const TOP: Command = Command {
    descriptor: &command::top::DESCRIPTOR,
    handler: top_command,
};

unsafe extern "C" fn top_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, &command::top::DESCRIPTOR, |ctx, argv| {
        // At most two arguments are valid: three are enough for the arity error, however many
        // came.
        let args: Vec<&[u8]> = argv
            .get(1..)
            .unwrap_or_default()
            .iter()
            .take(3)
            // SAFETY: argv strings live for the whole call and are not modified.
            .map(|s| unsafe { api::string_bytes(*s) })
            .collect();
        Ok(Sent(match command::top::parse(&args)? {
            command::top::Request::Reset => {
                crate::observe::stats::with_top(|t| t.reset());
                api::reply_ok(ctx)
            }
            command::top::Request::List { count, with_db } => {
                let entries = crate::observe::stats::with_top(|t| t.heaviest(count));
                api::reply_top(ctx, &entries, with_db)
            }
        }))
    })
}

impl Answer for Reply {
    fn decision(&self) -> Option<bool> {
        Some(self.allowed)
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        api::reply_integers(ctx, self.fields().as_ref())
    }
}

/// `RL.ALL`: `[allowed, denied_by, [reply of limit 1], [reply of limit 2], ...]`.
impl Answer for AllReply {
    fn decision(&self) -> Option<bool> {
        Some(self.allowed)
    }
    /// The key of the limit that denied (argv: name, numkeys, keys...); the first when admitted.
    fn key_index(&self) -> usize {
        1 + self.denied_by.max(1)
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        let head = [
            i64::from(self.allowed),
            i64::try_from(self.denied_by).unwrap_or(0),
        ];
        let nested: Vec<_> = self.replies.iter().map(|x| x.fields()).collect();
        api::reply_nested(ctx, &head, &nested)
    }
}

/// The cluster's key-position request, or a decision.
enum AllAnswer {
    KeyPositions(c_int),
    Decided(AllReply),
}

impl Answer for AllAnswer {
    fn decision(&self) -> Option<bool> {
        match self {
            AllAnswer::KeyPositions(_) => None,
            AllAnswer::Decided(r) => r.decision(),
        }
    }
    fn key_index(&self) -> usize {
        match self {
            AllAnswer::KeyPositions(_) => 1,
            AllAnswer::Decided(r) => r.key_index(),
        }
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        match self {
            AllAnswer::KeyPositions(status) => *status,
            AllAnswer::Decided(r) => r.send(ctx),
        }
    }
}

unsafe extern "C" fn test_clock_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    entry(ctx, argv, argc, &clock::DESCRIPTOR, |ctx, argv| {
        clock::test_clock_command(ctx, argv).map(Sent)
    })
}

/// `RL.ALL`: a cluster's key-position request, or a decision.
fn all_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<AllAnswer, crate::codec::error::ErrorReply> {
    if api::is_keys_position_request(ctx) {
        return Ok(AllAnswer::KeyPositions(report_keys(ctx, argv)));
    }
    run_all(ctx, argv).map(AllAnswer::Decided)
}

/// Answers a key-positions request of `RL.ALL` or `RL.SETTLE` (numkeys and the keys after it).
fn report_keys(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> c_int {
    // SAFETY: argv strings live for the whole call and are not modified.
    let numkeys = argv.get(1).map(|s| unsafe { api::string_bytes(*s) });
    let positions = all::key_positions(numkeys, argv.len().saturating_sub(1));
    api::report_key_positions(ctx, positions)
}

/// The arguments after the command name that a parse reads, as bytes: all of them, or for a
/// call longer than any valid one its first ones and its last `tail` (`all::read_part`), so
/// converting them costs the same however many there are.
fn arg_bytes<'a>(argv: &[*mut RedisModuleString], tail: usize) -> Vec<&'a [u8]> {
    all::read_part(argv.get(1..).unwrap_or_default(), tail)
        .into_iter()
        // SAFETY: argv strings live for the whole call and are not modified.
        .map(|s| unsafe { api::string_bytes(s) })
        .collect()
}

/// `RL.SETTLE`: `[[reply of limit 1], [reply of limit 2], ...]`.
pub struct Settled(pub Vec<Reply>);

impl Answer for Settled {
    fn decision(&self) -> Option<bool> {
        Some(true)
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        let nested: Vec<[i64; 5]> = self.0.iter().map(|x| x.to_array()).collect();
        api::reply_nested(ctx, &[], &nested)
    }
}

/// The cluster's key-position request, or a settlement.
enum SettleAnswer {
    KeyPositions(c_int),
    Settled(Settled),
}

impl Answer for SettleAnswer {
    fn decision(&self) -> Option<bool> {
        match self {
            SettleAnswer::KeyPositions(_) => None,
            SettleAnswer::Settled(s) => s.decision(),
        }
    }
    fn key_index(&self) -> usize {
        2
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        match self {
            SettleAnswer::KeyPositions(status) => *status,
            SettleAnswer::Settled(s) => s.send(ctx),
        }
    }
}

/// `RL.SETTLE`: a cluster's key-position request, or a settlement.
fn settle_body(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<SettleAnswer, crate::codec::error::ErrorReply> {
    if api::is_keys_position_request(ctx) {
        return Ok(SettleAnswer::KeyPositions(report_keys(ctx, argv)));
    }
    run_settle(ctx, argv).map(|r| SettleAnswer::Settled(Settled(r.replies)))
}

/// The key, and the arguments after it as bytes in `slots` (`M`, the most arguments a command
/// takes): the slice of them that the call has. Filled where the caller keeps them, so that they
/// are not copied on the way back, and only as far as the call has arguments (the slots are not
/// cleared first).
#[inline(always)]
fn key_and_args<'a, const M: usize>(
    argv: &[*mut RedisModuleString],
    slots: &'a mut [MaybeUninit<&'a [u8]>; M],
    arity: ErrorReply,
) -> Result<(*mut RedisModuleString, &'a [&'a [u8]]), ErrorReply> {
    let [_, name, rest @ ..] = argv else {
        return Err(arity);
    };
    if rest.len() > M {
        return Err(arity);
    }
    for (slot, arg) in slots.iter_mut().zip(rest) {
        // SAFETY: argv strings live for the whole call and are not modified.
        slot.write(unsafe { api::string_bytes(*arg) });
    }
    // SAFETY: the first `rest.len()` slots (at most `M`) were written just above, and a
    // `MaybeUninit<T>` is laid out as a `T`.
    let args = unsafe { std::slice::from_raw_parts(slots.as_ptr().cast::<&[u8]>(), rest.len()) };
    Ok((*name, args))
}

/// Runs one call of the one-key limiter at `I` in the registry. `argv[0]` is the command name,
/// `argv[1]` the key.
#[inline(always)]
pub fn run_one<const I: usize>(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Reply, ErrorReply> {
    let Some(Entry {
        descriptor,
        runner: Runner::OneKey { run, .. },
    }) = (const { registry::entry(I) })
    else {
        return Err(INTERNAL_ERROR);
    };
    let mut slots = [MaybeUninit::uninit(); 8];
    let (name, args) = key_and_args(argv, &mut slots, descriptor.arity_error)?;
    let mut key = Opener {
        ctx,
        name,
        key: None,
    };
    run(args, &mut key, clock::now_us())
}

/// Runs one `RL.ALL` call: every key opened once, all decided at one instant.
pub fn run_all(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<AllReply, ErrorReply> {
    let bytes = arg_bytes(argv, all::OPTION_WORDS);
    let mut call = all::parse(&bytes)?;
    // Key names as Redis strings: argv[2 ..= 1 + numkeys].
    let names = argv.get(2..2 + call.keys.len()).ok_or(all::ARITY)?;
    let mut keys = Vec::with_capacity(names.len());
    for name in names {
        keys.push(RedisKey::open(ctx, *name)?);
    }
    let mut stores: Vec<&mut dyn Store> = keys.iter_mut().map(|k| k as &mut dyn Store).collect();
    apply_all(&mut call.limits, &mut stores, clock::now_us(), call.upto)
}

/// Runs one `RL.SETTLE` call: every key opened once, all settled at one instant.
pub fn run_settle(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<AllReply, ErrorReply> {
    let bytes = arg_bytes(argv, settle::LAST_WORDS);
    let mut call = settle::parse(&bytes)?;
    let names = argv.get(2..2 + call.keys.len()).ok_or(settle::ARITY)?;
    let mut keys = Vec::with_capacity(names.len());
    for name in names {
        keys.push(RedisKey::open(ctx, *name)?);
    }
    let mut stores: Vec<&mut dyn Store> = keys.iter_mut().map(|k| k as &mut dyn Store).collect();
    apply_all(&mut call.limits, &mut stores, clock::now_us(), None)
}

/// Runs one `RL.RELEASE` call.
pub fn run_release(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<Released, ErrorReply> {
    let mut slots = [MaybeUninit::uninit(); 1];
    let (name, args) = key_and_args(argv, &mut slots, release::ARITY_ERROR)?;
    let id = release::parse(args)?;
    let mut store = RedisKey::open(ctx, name)?;
    zset::release(&mut store, id, clock::now_us()).map(Released)
}

/// `RL.RELEASE`'s reply: 1 when a live lease was released. INFO counts a release as admitted,
/// a call that found no live lease as denied.
pub struct Released(bool);

impl Answer for Released {
    fn decision(&self) -> Option<bool> {
        Some(self.0)
    }
    fn is_limit(&self) -> bool {
        false
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        api::reply_integer(ctx, i64::from(self.0))
    }
}

/// Runs one `CL.THROTTLE` call.
pub fn run_throttle(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
) -> Result<ThrottleReply, ErrorReply> {
    let mut slots = [MaybeUninit::uninit(); 4];
    let (name, args) = key_and_args(argv, &mut slots, throttle::ARITY_ERROR)?;
    let args = throttle::parse(args)?;
    let mut store = RedisKey::open(ctx, name)?;
    throttle::apply(&mut store, &args, clock::now_us())
}

/// `[limited, limit, remaining, retry_after_s, reset_after_s]`, redis-cell's reply.
impl Answer for ThrottleReply {
    fn decision(&self) -> Option<bool> {
        Some(!self.limited)
    }
    fn send(&self, ctx: *mut RedisModuleCtx) -> c_int {
        api::reply_integers(ctx, &self.to_array())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_described_command_is_registered_once_in_order() {
        let registered: Vec<&str> = all_commands()
            .map(|c| c.descriptor.name.to_str().unwrap())
            .collect();
        let described: Vec<&str> = crate::command::registry::DESCRIPTORS
            .iter()
            .map(|d| d.name.to_str().unwrap())
            .collect();
        assert_eq!(registered, described);
    }
}
