//! The decision pipeline of limiters whose state is one sorted set (the sliding log), over the
//! same storage trait as `pipeline`: the Redis binding implements it over the module key API, the
//! differential tests over an in-memory store. No Redis types here.
//!
//! read a few counts and entries (O(log n) each) -> decide -> one `Effect::Append` (a sliding
//! log) or one `Effect::Lease` (concurrency leases).

use crate::command::PerCall;
use crate::command::acquire::{self, AcquireRequest, check_expiry, check_lease};
use crate::command::sliding_log::{self, SlidingLogRequest, check_entry};
use crate::core::concurrency::{self, Leases, Seen};
use crate::core::sliding_log::{
    self as sliding_log_core, Log, Outcome, SettleOutcome, Settlement, View, Write, decide, view,
};
use crate::core::{Operation, Reply};
use crate::error::{ErrorReply, WRONGTYPE};
use crate::pipeline::{Effect, Entries, Limit, OpenStore, Slot, Store};

/// A stored sorted set seen as a sliding log: every entry it returns is checked.
struct StoredLog<'a, S: Store + ?Sized>(&'a S);

impl<S: Store + ?Sized> Log for StoredLog<'_, S> {
    type Error = ErrorReply;

    fn entries(&self) -> Result<i64, ErrorReply> {
        self.0.zset_len()
    }

    fn count_above(&self, score: f64) -> Result<i64, ErrorReply> {
        self.0.zset_count(score, false, f64::INFINITY)
    }

    fn count_at(&self, score: f64) -> Result<i64, ErrorReply> {
        self.0.zset_count(score, true, score)
    }

    fn score_from_newest(&self, rank: i64) -> Result<Option<f64>, ErrorReply> {
        let mut found = None;
        self.0.zset_from_last(rank, &mut |member, score| {
            check_entry(member, score)?;
            found = Some(score);
            Ok(())
        })?;
        Ok(found)
    }
}

/// What a call knows of its key before deciding: WRONGTYPE for a key that is not a sorted set.
fn load<S: Store + ?Sized>(
    store: &S,
    request: &SlidingLogRequest,
    now_us: i64,
) -> Result<View, ErrorReply> {
    match store.read()? {
        Slot::Empty => Ok(View::default()),
        Slot::Zset => view(&request.params, now_us, &StoredLog(store)),
        Slot::Value(_) | Slot::Hash | Slot::WrongType => Err(WRONGTYPE),
    }
}

fn commit<S: Store + ?Sized>(store: &mut S, out: &Outcome) -> Result<(), ErrorReply> {
    match &out.write {
        Some(w) => append(store, w),
        None => Ok(()),
    }
}

fn append<S: Store + ?Sized>(store: &mut S, w: &Write) -> Result<(), ErrorReply> {
    store.apply(&Effect::Append {
        entries: Entries {
            trim_up_to: w.trim_up_to_us,
            score: w.score_us,
            first_index: w.first_index,
            count: w.count,
        },
        expire_at_ms: w.expire_at_ms,
    })
}

/// Reads, decides and stores for one `RL.SLIDINGLOG` call whose arguments are already parsed.
pub fn apply<S: Store + ?Sized>(
    store: &mut S,
    request: &SlidingLogRequest,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let seen = load(store, request, now_us)?;
    let out = decide(
        &request.params,
        request.op,
        now_us,
        &seen,
        &StoredLog(&*store),
    )?;
    commit(store, &out)?;
    Ok(out.reply)
}

/// One `RL.SLIDINGLOG` call: the arguments after the key, then its key.
pub fn run(args: &[&[u8]], key: &mut dyn OpenStore, now_us: i64) -> Result<Reply, ErrorReply> {
    let request = sliding_log::parse(args)?;
    apply(key.open()?, &request, now_us)
}

/// A sliding log inside `RL.ALL`.
pub struct LogLimit {
    request: SlidingLogRequest,
    seen: View,
    out: Option<Outcome>,
}

impl LogLimit {
    /// `params` are the limit's arguments without the cost.
    pub fn parse(params: &[&[u8]], cost: &[u8]) -> Result<Self, ErrorReply> {
        let [limit, window] = params else {
            return Err(sliding_log::ARITY_ERROR);
        };
        Ok(Self {
            request: sliding_log::parse(&[*limit, *window, cost])?,
            seen: View::default(),
            out: None,
        })
    }
}

impl Limit for LogLimit {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        self.seen = load(store, &self.request, now_us)?;
        let out = decide(
            &self.request.params,
            self.request.op,
            now_us,
            &self.seen,
            &StoredLog(store),
        )?;
        self.out = Some(out);
        Ok(out.reply)
    }

    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        // Only a limit that admitted is asked: its entries fit, so a peek reads nothing more.
        let out = decide(
            &self.request.params,
            Operation::Peek,
            now_us,
            &self.seen,
            &StoredLog(store),
        )?;
        Ok(out.reply)
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match &self.out {
            Some(out) => commit(store, out),
            None => Ok(()),
        }
    }
}

/// A sliding log inside `RL.SETTLE`.
pub struct LogSettle {
    request: SlidingLogRequest,
    delta: i64,
    out: Option<SettleOutcome>,
}

impl Limit for LogSettle {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        let seen = load(store, &self.request, now_us)?;
        let out = sliding_log_core::settle(
            &self.request.params,
            self.delta,
            now_us,
            &seen,
            &StoredLog(store),
        )?;
        self.out = Some(out);
        Ok(out.reply)
    }

    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        // A settlement always admits; no denial asks for a peek.
        match &self.out {
            Some(out) => Ok(out.reply),
            None => {
                let seen = load(store, &self.request, now_us)?;
                Ok(sliding_log_core::settle(
                    &self.request.params,
                    0,
                    now_us,
                    &seen,
                    &StoredLog(store),
                )?
                .reply)
            }
        }
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match self.out.and_then(|o| o.write) {
            Some(Settlement::Add(w)) => append(store, &w),
            Some(Settlement::Drop {
                trim_up_to_us,
                count,
                expire_at_ms,
            }) => store.apply(&Effect::Pop {
                trim_up_to: trim_up_to_us,
                count,
                expire_at_ms,
            }),
            None => Ok(()),
        }
    }
}

/// `RL.SETTLE`'s sliding-log limit, as `command::Runner` builds one.
pub fn build_settle(params: &[&[u8]], delta: f64) -> Result<Box<dyn Limit>, ErrorReply> {
    let [limit, window] = params else {
        return Err(sliding_log::ARITY_ERROR);
    };
    Ok(Box::new(LogSettle {
        request: sliding_log::parse(&[*limit, *window, b"0"])?,
        delta: crate::core::lua_integer(delta),
        out: None,
    }))
}

/// `RL.ALL`'s sliding-log limit, as `command::Runner` builds one.
pub fn build_limit(params: &[&[u8]], call: &PerCall<'_>) -> Result<Box<dyn Limit>, ErrorReply> {
    Ok(Box::new(LogLimit::parse(params, call.cost)?))
}

/// A stored sorted set seen as the leases of one lease id: every entry it returns is checked.
struct StoredLeases<'a, S: Store + ?Sized> {
    store: &'a S,
    id: &'a [u8],
}

impl<S: Store + ?Sized> Leases for StoredLeases<'_, S> {
    type Error = ErrorReply;

    fn entries(&self) -> Result<i64, ErrorReply> {
        self.store.zset_len()
    }

    fn live(&self, now: f64) -> Result<i64, ErrorReply> {
        self.store.zset_count(now, false, f64::INFINITY)
    }

    fn own_expiry(&self) -> Result<Option<f64>, ErrorReply> {
        let score = self.store.zset_score(self.id)?;
        if let Some(s) = score {
            check_expiry(s)?;
        }
        Ok(score)
    }

    fn back_from_newest(&self, rank: i64) -> Result<Option<Seen>, ErrorReply> {
        let mut found = None;
        self.store.zset_from_last(rank, &mut |member, score| {
            check_lease(member, score)?;
            found = Some(Seen {
                expiry: score,
                own: member == self.id,
            });
            Ok(())
        })?;
        Ok(found)
    }
}

/// What a lease call knows of its key before deciding: WRONGTYPE for a key that is not a
/// sorted set.
fn load_leases<S: Store + ?Sized>(
    store: &S,
    id: &[u8],
    now_us: i64,
) -> Result<concurrency::View, ErrorReply> {
    match store.read()? {
        Slot::Empty => Ok(concurrency::View::default()),
        Slot::Zset => concurrency::view(now_us, &StoredLeases { store, id }),
        Slot::Value(_) | Slot::Hash | Slot::WrongType => Err(WRONGTYPE),
    }
}

fn commit_lease<S: Store + ?Sized>(
    store: &mut S,
    id: &[u8],
    out: &concurrency::Outcome,
) -> Result<(), ErrorReply> {
    match out.write {
        Some(w) => store.apply(&Effect::Lease {
            trim_up_to: w.trim_up_to_us,
            id,
            expiry: Some(w.expiry_us),
            expire_at_ms: Some(w.expire_at_ms),
        }),
        None => Ok(()),
    }
}

/// Reads, decides and stores for one `RL.ACQUIRE` call whose arguments are already parsed.
pub fn acquire<S: Store + ?Sized>(
    store: &mut S,
    request: &AcquireRequest<'_>,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let seen = load_leases(store, request.id, now_us)?;
    let leases = StoredLeases {
        store: &*store,
        id: request.id,
    };
    let out = concurrency::decide(&request.params, request.op, now_us, &seen, &leases)?;
    commit_lease(store, request.id, &out)?;
    Ok(out.reply)
}

/// One `RL.ACQUIRE` call: the arguments after the key, then its key.
pub fn run_acquire(
    args: &[&[u8]],
    key: &mut dyn OpenStore,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let request = acquire::parse(args)?;
    acquire(key.open()?, &request, now_us)
}

/// One `RL.RELEASE` call whose lease id is already parsed: whether a live lease was released.
pub fn release<S: Store + ?Sized>(
    store: &mut S,
    id: &[u8],
    now_us: i64,
) -> Result<bool, ErrorReply> {
    let seen = load_leases(store, id, now_us)?;
    let (released, write) = concurrency::release(now_us, &seen);
    if let Some(w) = write {
        store.apply(&Effect::Lease {
            trim_up_to: w.trim_up_to_us,
            id,
            expiry: None,
            expire_at_ms: w.expire_at_ms,
        })?;
    }
    Ok(released)
}

/// A concurrency limit inside `RL.ALL`: `CONCURRENCY limit lease_sec`, for the call's `LEASE id`.
pub struct LeaseLimit {
    params: concurrency::Params,
    op: Operation,
    id: Vec<u8>,
    seen: concurrency::View,
    out: Option<concurrency::Outcome>,
}

impl Limit for LeaseLimit {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        self.seen = load_leases(store, &self.id, now_us)?;
        let leases = StoredLeases {
            store,
            id: &self.id,
        };
        let out = concurrency::decide(&self.params, self.op, now_us, &self.seen, &leases)?;
        self.out = Some(out);
        Ok(out.reply)
    }

    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        // Only a limit that admitted is asked, so a peek reads nothing more.
        let leases = StoredLeases {
            store,
            id: &self.id,
        };
        let out = concurrency::decide(&self.params, Operation::Peek, now_us, &self.seen, &leases)?;
        Ok(out.reply)
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match &self.out {
            Some(out) => commit_lease(store, &self.id, out),
            None => Ok(()),
        }
    }
}

/// `RL.ALL`'s concurrency limit, as `command::Runner` builds one: one lease whatever the cost
/// (`COST 0` is a peek), for the call's `LEASE id`.
pub fn build_lease_limit(
    params: &[&[u8]],
    call: &PerCall<'_>,
) -> Result<Box<dyn Limit>, ErrorReply> {
    let [limit, lease] = params else {
        return Err(acquire::ARITY_ERROR);
    };
    let params = acquire::parse_params(limit, lease)?;
    let cost = crate::args::COST.parse(call.cost)?;
    let id = acquire::lease_id(call.lease.ok_or(acquire::NO_LEASE)?)?;
    Ok(Box::new(LeaseLimit {
        params,
        op: Operation::from_cost(cost),
        id: id.to_vec(),
        seen: concurrency::View::default(),
        out: None,
    }))
}
