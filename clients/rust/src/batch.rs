//! Leased batches for hot keys: one partial grant (`UPTO n`) takes several units of a key (or of
//! every limit of an `RL.ALL` plan) at once, the process admits its requests from them without
//! calling Redis, and what it did not use goes back with `RL.SETTLE ... DELTA -n` when the
//! batch's lease ends, when the client is flushed, closed or dropped, or when the batch leaves
//! the bounded table.
//!
//! Every request admitted from a batch spent a unit that Redis granted: a process never admits
//! more than it was granted. What a batch holds is not available to other processes until it is
//! used or given back; that is the most they can be refused beyond the exact answer
//! (docs/clients.md states the bound).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::Algorithm;
use crate::deny::DenyCache;
use crate::lru::Lru;
use crate::types::{Decision, Error, LocalAnswer, Mode, MultiOutcome, Settlement};

type Predicate = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What the batches need from Redis: the client (without batches of its own) implements it, so
/// this file does not know the client that holds it.
pub(crate) trait Server: Clone + Send + Sync + 'static {
    /// The time a call may take (what a returned batch keeps as a margin before it ends).
    fn timeout(&self) -> Duration;
    /// A partial grant of at most `n` units: `None` when Redis cannot answer.
    fn try_grant(
        &self,
        limits: &[(String, Algorithm)],
        n: u64,
    ) -> impl Future<Output = Result<Option<MultiOutcome>, Error>> + Send;
    /// `RL.SETTLE` of `delta` units on every limit.
    fn settle(
        &self,
        limits: &[(String, Algorithm)],
        delta: i64,
    ) -> impl Future<Output = Result<Settlement, Error>> + Send;
    /// What the failure policy answers for a request of `cost` units.
    fn degraded_for(&self, limits: &[(String, Algorithm)], cost: u64) -> MultiOutcome;
}

/// When and how a client takes batches (see [`Client::with_batching`](crate::Client::with_batching)).
///
/// A key (or a plan of several limits checked together) is batched when one of its keys is
/// declared hot ([`Batching::hot_key`], [`Batching::hot_keys_where`]), or when this process
/// checks it at least [`detect_per_sec`](Batching::detect_per_sec) times in a second.
#[derive(Clone)]
pub struct Batching {
    hot_keys: Vec<String>,
    hot_where: Option<Predicate>,
    detect_per_sec: u32,
    lease: Duration,
    initial: u64,
    max_batch: u64,
    remaining_share: u64,
    max_keys: usize,
}

impl std::fmt::Debug for Batching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batching")
            .field("hot_keys", &self.hot_keys)
            .field("hot_where", &self.hot_where.is_some())
            .field("detect_per_sec", &self.detect_per_sec)
            .field("lease", &self.lease)
            .field("initial", &self.initial)
            .field("max_batch", &self.max_batch)
            .field("remaining_share", &self.remaining_share)
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

impl Default for Batching {
    /// Detection at 100 calls per second, leases of 200 ms, batches from 8 up to 1,024 units
    /// and at most 1/8 of what Redis said remains, 1,024 keys tracked.
    fn default() -> Self {
        Batching {
            hot_keys: Vec::new(),
            hot_where: None,
            detect_per_sec: 100,
            lease: Duration::from_millis(200),
            initial: 8,
            max_batch: 1024,
            remaining_share: 8,
            max_keys: 1024,
        }
    }
}

impl Batching {
    /// The defaults (see [`Batching::default`]).
    pub fn new() -> Self {
        Batching::default()
    }

    /// Batches `key` from its first call (a plan of several limits when any of its keys is).
    pub fn hot_key(mut self, key: impl Into<String>) -> Self {
        self.hot_keys.push(key.into());
        self
    }

    /// Batches the keys for which `f` is true from their first call.
    pub fn hot_keys_where(mut self, f: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.hot_where = Some(Arc::new(f));
        self
    }

    /// Batches a key once this process checks it at least `calls` times within one second
    /// (counted in whole seconds from its first call, the previous second's count included);
    /// 0: only declared keys (default 100).
    pub fn detect_per_sec(mut self, calls: u32) -> Self {
        self.detect_per_sec = calls;
        self
    }

    /// How long a batch lives: what it has not used by then goes back (default 200 ms). A
    /// fixed window's batch ends with the window it was granted in, if that comes first.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The first batch size (default 8).
    pub fn initial(mut self, units: u64) -> Self {
        self.initial = units.max(1);
        self
    }

    /// The largest batch (default 1,024).
    pub fn max_batch(mut self, units: u64) -> Self {
        self.max_batch = units.max(1);
        self
    }

    /// A batch asks for at most `1/divisor` of what Redis last said remains (default 8), so a
    /// nearly exhausted key is decided one call per request.
    pub fn remaining_share(mut self, divisor: u64) -> Self {
        self.remaining_share = divisor.max(1);
        self
    }

    /// Keys (or plans) tracked at once, the least recently used forgotten first, its batch
    /// given back (default 1,024).
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n.max(1);
        self
    }

    fn declared(&self, limits: &[(String, Algorithm)]) -> bool {
        limits.iter().any(|(k, _)| {
            self.hot_keys.iter().any(|h| h == k) || self.hot_where.as_ref().is_some_and(|f| f(k))
        })
    }
}

/// What the batches of a client did since it was made (units, and requests answered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Partial grants sent to take a batch.
    pub refills: u64,
    /// Units those grants took.
    pub granted: u64,
    /// Units spent by admitted requests: the requests that took a batch and those answered from
    /// one.
    pub used: u64,
    /// Requests admitted from a batch without a call to Redis.
    pub answered: u64,
    /// Units given back to Redis (`RL.SETTLE ... DELTA -n`).
    pub returned: u64,
    /// Units neither used nor given back: a sliding window's or log's, a window's that ended,
    /// a bucket's that refilled meanwhile, or a return Redis did not answer.
    pub lapsed: u64,
    /// Units held in batches now.
    pub held: u64,
}

#[derive(Debug, Default)]
struct Counters {
    refills: AtomicU64,
    granted: AtomicU64,
    used: AtomicU64,
    answered: AtomicU64,
    returned: AtomicU64,
    lapsed: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The units of one grant still held.
#[derive(Clone, Debug)]
struct Batch {
    /// When the grant was sent: its decisions were made at this moment or after.
    sent: Instant,
    ends: Instant,
    granted: u64,
    held: u64,
    /// The grant's reply, one per limit.
    decisions: Vec<Decision>,
    mode: Option<Mode>,
}

/// What goes back to Redis from one batch.
struct Return {
    limits: Vec<(String, Algorithm)>,
    batch: Batch,
}

struct Entry {
    limits: Vec<(String, Algorithm)>,
    declared: bool,
    /// Calls counted per whole second since `second`, and in the second before.
    second: Instant,
    calls: u32,
    previous: u32,
    /// The next batch size (B).
    size: u64,
    /// The fewest units Redis said remain, with the latest grant (before any: the limit).
    remaining: u64,
    batch: Option<Batch>,
    /// The latest batch was used up before its lease ended.
    used_up: bool,
    /// Incremented by every grant and every batch given back.
    generation: u64,
    /// The latest grant took less than it asked (or nothing, or Redis did not answer).
    short: bool,
    /// Units of the callers waiting for a refill.
    waiting: u64,
    gate: Arc<tokio::sync::Mutex<()>>,
}

/// At most what one partial grant can take of these limits: 10^15, and 1,000 sliding-log
/// entries in all.
fn upto_max(limits: &[(String, Algorithm)]) -> u64 {
    let logs = limits
        .iter()
        .filter(|(_, a)| matches!(a, Algorithm::SlidingLog { .. }))
        .count() as u64;
    1000u64.checked_div(logs).unwrap_or(1_000_000_000_000_000)
}

impl Entry {
    /// A new entry; `generation` is where its generations start (apart from every other
    /// entry's, so that a timer of an entry that was evicted never matches its successor).
    fn new(
        limits: &[(String, Algorithm)],
        declared: bool,
        cfg: &Batching,
        now: Instant,
        generation: u64,
    ) -> Self {
        Entry {
            limits: limits.to_vec(),
            declared,
            second: now,
            calls: 0,
            previous: 0,
            size: cfg.initial.min(cfg.max_batch),
            remaining: limits.iter().map(|(_, a)| a.limit()).min().unwrap_or(0),
            batch: None,
            used_up: false,
            generation,
            short: false,
            waiting: 0,
            gate: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    fn count_call(&mut self, now: Instant) {
        let gone = now.saturating_duration_since(self.second);
        if gone >= Duration::from_secs(2) {
            (self.previous, self.calls, self.second) = (0, 0, now);
        } else if gone >= Duration::from_secs(1) {
            self.previous = self.calls;
            self.calls = 0;
            self.second += Duration::from_secs(1);
        }
        self.calls = self.calls.saturating_add(1);
    }

    fn hot(&self, cfg: &Batching) -> bool {
        self.declared
            || (cfg.detect_per_sec > 0 && self.calls.max(self.previous) >= cfg.detect_per_sec)
    }

    /// Whether a batch for `cost` would hold more than the cost: `1/remaining_share` of what
    /// Redis last said remains is above it. Otherwise the key is decided one call per request.
    fn worth_a_batch(&self, cost: u64, cfg: &Batching) -> bool {
        self.remaining / cfg.remaining_share > cost
    }

    /// Ends the batch if its lease is over: what it holds goes into `returns`, and B halves.
    fn expire(&mut self, now: Instant, returns: &mut Vec<Return>) {
        if self.batch.as_ref().is_some_and(|b| now >= b.ends) {
            self.give_back(returns);
        }
    }

    /// Gives back what the batch holds now.
    fn give_back(&mut self, returns: &mut Vec<Return>) {
        let Some(b) = self.batch.take() else {
            return;
        };
        self.generation += 1;
        if b.held > 0 {
            self.size = (self.size / 2).max(1);
            self.used_up = false;
            returns.push(Return {
                limits: self.limits.clone(),
                batch: b,
            });
        }
    }

    /// Admits `cost` from the batch if it holds that much and its lease is not over.
    fn take(&mut self, cost: u64, now: Instant) -> Option<MultiOutcome> {
        let b = self.batch.as_mut()?;
        if now >= b.ends || b.held < cost {
            return None;
        }
        b.held -= cost;
        if b.held == 0 {
            self.used_up = true;
        }
        Some(answer(b, cost, now, Some(LocalAnswer::Batch)))
    }

    /// The size of the next grant: B (doubled if the last batch was used up), or what the
    /// callers waiting need if more, at most `max_batch` and `1/remaining_share` of what Redis
    /// last said remains, at least the cost.
    fn ask(&mut self, cost: u64, cfg: &Batching, most: u64) -> u64 {
        if self.used_up {
            self.size = self.size.saturating_mul(2).min(cfg.max_batch);
            self.used_up = false;
        }
        let want = self.size.max(cost.saturating_add(self.waiting));
        let share = self.remaining / cfg.remaining_share;
        want.min(cfg.max_batch).min(share).min(most).max(cost)
    }
}

/// The answer to a request admitted with `cost` units of batch `b`, which now holds `b.held`:
/// each limit's remaining is what Redis said with the grant plus what the batch still holds
/// (what Redis had before the grant, less what this process admitted from it since); the
/// resets count down from the grant.
fn answer(b: &Batch, cost: u64, now: Instant, local: Option<LocalAnswer>) -> MultiOutcome {
    let gone = u64::try_from(now.saturating_duration_since(b.sent).as_millis()).unwrap_or(0);
    MultiOutcome {
        allowed: true,
        denied_by: 0,
        decisions: b
            .decisions
            .iter()
            .map(|d| Decision {
                allowed: true,
                remaining: d.remaining.saturating_add(b.held),
                retry_after_ms: 0,
                reset_after_ms: d.reset_after_ms.saturating_sub(gone),
                limit: d.limit,
            })
            .collect(),
        degraded: None,
        mode: b.mode,
        granted: cost,
        answered_locally: local,
    }
}

/// The units of a batch that can go back to one limit at `now` without leaving it with more
/// than it would have had if they had never been taken:
///
/// - a sliding window or log: none (a refund lowers the current window's count or removes the
///   newest entries, which may not be the batch's);
/// - a fixed window: all, while the window the grant was made in is surely still the current
///   one (`now + margin` before the grant's send time plus its `reset_after_ms`), else none;
/// - a token or leaky bucket and GCRA: all, less what the bucket may have refilled beyond its
///   capacity meanwhile (its rate times the time since the grant was sent plus `margin`, less
///   the room the grant left below the capacity), which a refund would count twice.
fn returnable(algo: &Algorithm, d: &Decision, b: &Batch, now: Instant, margin: Duration) -> u64 {
    match algo {
        Algorithm::SlidingWindow { .. } | Algorithm::SlidingLog { .. } => 0,
        Algorithm::Concurrency(_) => 0,
        Algorithm::FixedWindow { .. } => {
            if now + margin < b.sent + Duration::from_millis(d.reset_after_ms) {
                b.held
            } else {
                0
            }
        }
        Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } | Algorithm::Gcra { .. } => {
            let age = (now + margin)
                .saturating_duration_since(b.sent)
                .as_secs_f64();
            let refilled = algo.rate_per_sec() * age;
            // What the limit held before the grant is below remaining + 1 + granted.
            let room = d.limit as f64 - d.remaining as f64 - b.granted as f64 - 1.0;
            let excess = (refilled - room.max(0.0)).max(0.0).ceil();
            if excess >= b.held as f64 {
                0
            } else {
                b.held - excess as u64
            }
        }
    }
}

/// Sends what `r` can give back, one `RL.SETTLE` per distinct number of units (usually one for
/// every limit); the units given back to every limit (the fewest, for a plan).
async fn give_back<S: Server>(client: &S, counters: &Counters, r: Return) -> u64 {
    let now = Instant::now();
    let margin = client.timeout();
    let deltas: Vec<u64> = r
        .limits
        .iter()
        .zip(&r.batch.decisions)
        .map(|((_, a), d)| returnable(a, d, &r.batch, now, margin))
        .collect();
    let mut back = vec![0u64; deltas.len()];
    let mut groups: Vec<u64> = deltas.iter().copied().filter(|&n| n > 0).collect();
    groups.sort_unstable();
    groups.dedup();
    for n in groups {
        let idx: Vec<usize> = (0..deltas.len()).filter(|&i| deltas[i] == n).collect();
        let subset: Vec<(String, Algorithm)> = idx.iter().map(|&i| r.limits[i].clone()).collect();
        let Ok(delta) = i64::try_from(n) else {
            continue;
        };
        if let Ok(s) = client.settle(&subset, -delta).await
            && s.degraded.is_none()
        {
            for &i in &idx {
                back[i] = n;
            }
        }
    }
    let returned = back.iter().copied().min().unwrap_or(0);
    add(&counters.returned, returned);
    add(&counters.lapsed, r.batch.held - returned);
    returned
}

/// The batches of a client and its clones: a bounded table of keys (or plans), each with its
/// detection counts and at most one batch.
pub(crate) struct Batches<S> {
    cfg: Batching,
    /// The client without batches nor deny cache, for the grants and returns.
    client: S,
    table: Mutex<Lru<Entry>>,
    counters: Arc<Counters>,
    closed: AtomicBool,
    /// Where the next entry's generations start (2^32 apart).
    generations: AtomicU64,
    me: Weak<Batches<S>>,
    /// Sends returns from a task of the current runtime (outside one they lapse).
    sender: Box<dyn Fn(Vec<Return>) + Send + Sync>,
}

/// A caller waiting for its turn to refill, counted in the entry's `waiting` until it has it
/// or goes away.
struct Waiting<'a, S> {
    batches: &'a Batches<S>,
    sig: &'a str,
    cost: u64,
}

impl<S> Drop for Waiting<'_, S> {
    fn drop(&mut self) {
        if let Some(e) = self.batches.table().get_mut(self.sig) {
            e.waiting = e.waiting.saturating_sub(self.cost);
        }
    }
}

/// What a request on a batched key does next.
pub(crate) enum Step {
    /// Answered from the batch.
    Answer(MultiOutcome),
    /// The key is hot and its batch cannot cover the cost: take a new one.
    Refill,
    /// Not hot (or not batchable): ask Redis as usual.
    Plain,
}

impl<S: Server> Batches<S> {
    pub(crate) fn new(client: S, cfg: Batching) -> Arc<Self> {
        let counters = Arc::new(Counters::default());
        let (c, n) = (client.clone(), counters.clone());
        let sender = Box::new(move |returns: Vec<Return>| {
            if returns.is_empty() {
                return;
            }
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let (client, counters) = (c.clone(), n.clone());
                    rt.spawn(async move {
                        for r in returns {
                            give_back(&client, &counters, r).await;
                        }
                    });
                }
                Err(_) => {
                    for r in returns {
                        add(&n.lapsed, r.batch.held);
                    }
                }
            }
        });
        Arc::new_cyclic(|me| Batches {
            table: Mutex::new(Lru::new(cfg.max_keys)),
            cfg,
            client,
            counters,
            closed: AtomicBool::new(false),
            generations: AtomicU64::new(0),
            me: me.clone(),
            sender,
        })
    }

    pub(crate) fn stats(&self) -> BatchStats {
        let c = &self.counters;
        let held = self
            .table()
            .values_mut()
            .filter_map(|(_, e)| e.batch.as_ref().map(|b| b.held))
            .sum();
        BatchStats {
            refills: c.refills.load(Ordering::Relaxed),
            granted: c.granted.load(Ordering::Relaxed),
            used: c.used.load(Ordering::Relaxed),
            answered: c.answered.load(Ordering::Relaxed),
            returned: c.returned.load(Ordering::Relaxed),
            lapsed: c.lapsed.load(Ordering::Relaxed),
            held,
        }
    }

    /// The size the next batch of `sig` would start from (B), if it is tracked.
    pub(crate) fn size(&self, sig: &str) -> Option<u64> {
        self.table().get_mut(sig).map(|e| e.size)
    }

    /// Counts the call, and answers it from the batch when it can.
    pub(crate) fn try_local(&self, sig: &str, limits: &[(String, Algorithm)], cost: u64) -> Step {
        if self.closed.load(Ordering::Relaxed) || cost > upto_max(limits) {
            return Step::Plain;
        }
        let now = Instant::now();
        let mut returns = Vec::new();
        let step = {
            let mut t = self.table();
            if t.get_mut(sig).is_none() {
                let first = self.generations.fetch_add(1 << 32, Ordering::Relaxed);
                let e = Entry::new(limits, self.cfg.declared(limits), &self.cfg, now, first);
                if let Some((_, mut evicted)) = t.insert(sig, e) {
                    evicted.give_back(&mut returns);
                }
            }
            match t.get_mut(sig) {
                None => Step::Plain,
                Some(e) => {
                    e.count_call(now);
                    e.expire(now, &mut returns);
                    match e.take(cost, now) {
                        Some(o) => Step::Answer(o),
                        None if e.hot(&self.cfg) && e.worth_a_batch(cost, &self.cfg) => {
                            Step::Refill
                        }
                        None => Step::Plain,
                    }
                }
            }
        };
        if let Step::Answer(_) = step {
            add(&self.counters.used, cost);
            add(&self.counters.answered, 1);
        }
        self.send(returns);
        step
    }

    /// Takes a new batch for `sig`, one refill at a time: callers that come while one is in
    /// flight wait for it and are served from it when it covers them. `None`: decide this
    /// request with a call of its own (the key is running low, Redis granted less than the
    /// cost, or the key left the table).
    pub(crate) async fn refill(
        &self,
        sig: &str,
        limits: &[(String, Algorithm)],
        cost: u64,
        denies: Option<&Arc<DenyCache>>,
    ) -> Result<Option<MultiOutcome>, Error> {
        let Some(me) = self.me.upgrade() else {
            return Ok(None);
        };
        let (gate, seen) = {
            let mut t = self.table();
            let Some(e) = t.get_mut(sig) else {
                return Ok(None);
            };
            e.waiting = e.waiting.saturating_add(cost);
            (e.gate.clone(), e.generation)
        };
        // Counted among the callers waiting until it has its turn, even if it goes away.
        let waiting = Waiting {
            batches: self,
            sig,
            cost,
        };
        let turn = gate.lock_owned().await;
        drop(waiting);
        let now = Instant::now();
        let mut returns = Vec::new();
        let ask = {
            let mut t = self.table();
            let Some(e) = t.get_mut(sig) else {
                return Ok(None);
            };
            e.expire(now, &mut returns);
            if let Some(o) = e.take(cost, now) {
                drop(t);
                add(&self.counters.used, cost);
                add(&self.counters.answered, 1);
                self.send(returns);
                return Ok(Some(o));
            }
            if (e.generation != seen && e.short)
                || !e.worth_a_batch(cost, &self.cfg)
                || self.closed.load(Ordering::Relaxed)
            {
                drop(t);
                self.send(returns);
                return Ok(None);
            }
            // Too little left for this cost: it goes back before the new grant.
            e.give_back(&mut returns);
            e.ask(cost, &self.cfg, upto_max(limits))
        };
        self.send(returns);
        if let Some(o) = denies.and_then(|d| d.lookup(sig, cost)) {
            return Ok(Some(o));
        }
        // The grant and its batch are made by a task of their own, holding the turn: a caller
        // that goes away meanwhile (a cancelled request) neither loses the units nor lets a
        // second refill start; the units it would have used go back.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (sig, limits, denies) = (sig.to_string(), limits.to_vec(), denies.cloned());
        tokio::spawn(async move {
            let got = me.grant(&sig, &limits, cost, ask, denies.as_deref()).await;
            drop(turn);
            if let Err(Ok((Some(_), Some(unused)))) = tx.send(got) {
                me.counters.used.fetch_sub(cost, Ordering::Relaxed);
                me.send(vec![Return {
                    limits,
                    batch: unused,
                }]);
            }
        });
        match rx.await {
            Ok(got) => got.map(|(answer, _)| answer),
            Err(_) => Ok(None),
        }
    }

    /// Takes a batch of at most `ask` units for `sig` (its turn held by the caller): the
    /// answer for the request that asked (`None`: decide it with a call of its own), and, when
    /// it was admitted from this grant, its units as a batch to give back should it be gone.
    async fn grant(
        &self,
        sig: &str,
        limits: &[(String, Algorithm)],
        cost: u64,
        ask: u64,
        denies: Option<&DenyCache>,
    ) -> Result<(Option<MultiOutcome>, Option<Batch>), Error> {
        add(&self.counters.refills, 1);
        let sent = Instant::now();
        let got = self.client.try_grant(limits, ask).await;
        let mut returns = Vec::new();
        let reply = match got {
            Ok(Some(o)) => o,
            other => {
                if let Some(e) = self.table().get_mut(sig) {
                    e.generation += 1;
                    e.short = true;
                }
                // Redis could not answer: the failure policy answers this request.
                return other.map(|_| (Some(self.client.degraded_for(limits, cost)), None));
            }
        };
        let g = reply.granted;
        add(&self.counters.granted, g);
        let admitted = g >= cost;
        let mut batch = Batch {
            sent,
            ends: sent + self.cfg.lease,
            granted: g,
            held: if admitted { g - cost } else { g },
            decisions: reply.decisions.clone(),
            mode: reply.mode,
        };
        for ((_, a), d) in limits.iter().zip(&reply.decisions) {
            if let Algorithm::FixedWindow { .. } = a {
                batch.ends = batch
                    .ends
                    .min(sent + Duration::from_millis(d.reset_after_ms));
            }
        }
        // Redis's own answer for this request: the grant's, less the units left in the batch.
        let answer = admitted.then(|| answer(&batch, cost, batch.sent, None));
        let own = admitted.then(|| Batch {
            held: cost,
            ..batch.clone()
        });
        {
            let mut t = self.table();
            match t.get_mut(sig) {
                Some(e) if !self.closed.load(Ordering::Relaxed) => {
                    e.generation += 1;
                    e.short = g < ask;
                    e.used_up = false;
                    e.remaining = reply
                        .decisions
                        .iter()
                        .map(|d| d.remaining)
                        .min()
                        .unwrap_or(0);
                    e.size = e.size.min(e.remaining / self.cfg.remaining_share).max(1);
                    // Whatever another grant left (none while turns are kept) goes back.
                    e.give_back(&mut returns);
                    if batch.held > 0 {
                        self.expire_at(sig, e.generation, batch.ends);
                        e.batch = Some(batch);
                    } else if admitted {
                        e.used_up = true;
                    }
                }
                _ => {
                    if batch.held > 0 {
                        returns.push(Return {
                            limits: limits.to_vec(),
                            batch,
                        });
                    }
                }
            }
        }
        self.send(returns);
        if admitted {
            add(&self.counters.used, cost);
            return Ok((answer, own));
        }
        if g == 0 && cost == 1 {
            // Nothing left: the denial of one unit, exactly what a call with cost 1 answers.
            if let Some(d) = denies {
                d.record(sig, cost, &reply, sent);
            }
            return Ok((Some(reply), None));
        }
        Ok((None, None))
    }

    /// What Redis answered a call of `sig` made without a batch: what remains, for the next
    /// batch's size.
    pub(crate) fn observe(&self, sig: &str, o: &MultiOutcome) {
        if o.degraded.is_some() || o.answered_locally.is_some() {
            return;
        }
        if let Some(e) = self.table().get_mut(sig)
            && let Some(r) = o.decisions.iter().map(|d| d.remaining).min()
        {
            e.remaining = r;
        }
    }

    /// Gives back the batch of `sig` when its lease ends, unless another grant replaced it.
    fn expire_at(&self, sig: &str, generation: u64, at: Instant) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (me, sig) = (self.me.clone(), sig.to_string());
        rt.spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(b) = me.upgrade() else {
                return;
            };
            let mut returns = Vec::new();
            if let Some(e) = b.table().get_mut(&sig)
                && e.generation == generation
            {
                e.give_back(&mut returns);
            }
            for r in returns {
                give_back(&b.client, &b.counters, r).await;
            }
        });
    }

    fn send(&self, returns: Vec<Return>) {
        (self.sender)(returns);
    }

    /// Gives back what every batch holds now; the units given back.
    pub(crate) async fn flush(&self) -> u64 {
        let mut n = 0;
        for r in self.drain() {
            n += give_back(&self.client, &self.counters, r).await;
        }
        n
    }

    /// Stops taking batches (every clone's calls go to Redis one by one from now on) and
    /// gives back what they hold.
    pub(crate) async fn close(&self) -> u64 {
        self.closed.store(true, Ordering::Relaxed);
        self.flush().await
    }
}

impl<S> Batches<S> {
    fn table(&self) -> std::sync::MutexGuard<'_, Lru<Entry>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every batch, taken out of the table.
    fn drain(&self) -> Vec<Return> {
        let mut returns = Vec::new();
        for (_, e) in self.table().values_mut() {
            e.give_back(&mut returns);
        }
        returns
    }
}

impl<S> Drop for Batches<S> {
    /// The last clone of the client is gone: what the batches hold goes back from a task of the
    /// current runtime (best effort: outside one, or if the process ends first, it lapses).
    fn drop(&mut self) {
        let returns = self.drain();
        (self.sender)(returns);
    }
}

/// The key of a table entry: the keys, algorithms and parameters of the limits, in order.
pub(crate) fn signature(limits: &[(String, Algorithm)]) -> String {
    let mut s = String::with_capacity(limits.iter().map(|(k, _)| k.len() + 64).sum());
    for (k, a) in limits {
        crate::text::push_u64(&mut s, k.len() as u64);
        s.push(':');
        s.push_str(k);
        s.push(' ');
        s.push_str(a.keyword());
        a.write_identity(&mut s);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(granted: u64, held: u64, remaining: u64, limit: u64, reset: u64) -> Batch {
        Batch {
            sent: Instant::now(),
            ends: Instant::now(),
            granted,
            held,
            decisions: vec![Decision {
                allowed: true,
                remaining,
                retry_after_ms: 0,
                reset_after_ms: reset,
                limit,
            }],
            mode: None,
        }
    }

    #[test]
    fn what_can_go_back() {
        let now = Instant::now();
        let m = Duration::from_millis(100);
        let fw = Algorithm::FixedWindow {
            limit: 100,
            window_sec: 60.0,
        };
        let b = batch(10, 7, 50, 100, 60_000);
        assert_eq!(returnable(&fw, &b.decisions[0], &b, now, m), 7);
        // The window ends before the return surely arrives.
        let b = batch(10, 7, 50, 100, 50);
        assert_eq!(returnable(&fw, &b.decisions[0], &b, now, m), 0);
        let sw = Algorithm::SlidingWindow {
            limit: 100,
            window_sec: 60.0,
        };
        assert_eq!(returnable(&sw, &b.decisions[0], &b, now, m), 0);
        // A bucket of 100 refilling 10/s, 50 left after a grant of 10: 39 of room; 0.1 s of
        // margin refills 1, well within it.
        let tb = Algorithm::TokenBucket {
            capacity: 100,
            refill_per_sec: 10.0,
        };
        let b = batch(10, 7, 50, 100, 5000);
        assert_eq!(returnable(&tb, &b.decisions[0], &b, now, m), 7);
        // A full bucket before the grant: what refilled since would be counted twice.
        let b = batch(10, 7, 90, 100, 1000);
        assert_eq!(returnable(&tb, &b.decisions[0], &b, now, m), 6);
        assert_eq!(
            returnable(&tb, &b.decisions[0], &b, now, Duration::from_secs(2)),
            0
        );
    }

    #[test]
    fn batch_sizes_double_halve_and_follow_what_remains() {
        let cfg = Batching::new().initial(2).max_batch(16).remaining_share(4);
        let fw = Algorithm::FixedWindow {
            limit: 1000,
            window_sec: 60.0,
        };
        let mut e = Entry::new(&[("k".into(), fw)], true, &cfg, Instant::now(), 0);
        assert_eq!(e.ask(1, &cfg, 1000), 2);
        e.used_up = true;
        assert_eq!(e.ask(1, &cfg, 1000), 4);
        e.used_up = true;
        e.waiting = 9;
        assert_eq!(e.ask(1, &cfg, 1000), 10, "the callers waiting");
        e.waiting = 0;
        for _ in 0..4 {
            e.used_up = true;
            e.ask(1, &cfg, 1000);
        }
        assert_eq!(e.ask(1, &cfg, 1000), 16, "at most max_batch");
        e.remaining = 20;
        assert_eq!(e.ask(1, &cfg, 1000), 5, "a quarter of what remains");
        e.remaining = 3;
        assert_eq!(e.ask(1, &cfg, 1000), 1, "one by one near the end");
        assert_eq!(e.ask(4, &cfg, 1000), 4, "at least the cost");
        assert_eq!(e.ask(1, &cfg, 2), 1);
        e.remaining = 1000;
        assert_eq!(e.ask(1, &cfg, 5), 5, "a sliding log's largest grant");
    }
}
