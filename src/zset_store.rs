//! The decision pipeline of limiters whose state is one sorted set (the sliding log), over the
//! same storage trait as `pipeline`: the Redis binding implements it over the module key API, the
//! differential tests over an in-memory store. No Redis types here.
//!
//! read a few counts and entries (O(log n) each) -> decide -> one `Effect::Append`.

use crate::command::sliding_log::{self, SlidingLogRequest, check_entry};
use crate::core::sliding_log::{Log, Outcome, View, decide, view};
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
    match out.write {
        Some(w) => store.apply(&Effect::Append {
            entries: Entries {
                trim_up_to: w.trim_up_to_us,
                score: w.score_us,
                first_index: w.first_index,
                count: w.count,
            },
            expire_at_ms: w.expire_at_ms,
        }),
        None => Ok(()),
    }
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

/// `RL.ALL`'s sliding-log limit, as `command::Runner` builds one.
pub fn build_limit(params: &[&[u8]], cost: &[u8]) -> Result<Box<dyn Limit>, ErrorReply> {
    Ok(Box::new(LogLimit::parse(params, cost)?))
}
