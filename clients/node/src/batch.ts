/**
 * Leased batches for hot keys: one partial grant (`UPTO n`) takes several units of a key (or of
 * every limit of an `RL.ALL` plan) at once, the process admits its requests from them without
 * calling Redis, and what it did not use goes back with `RL.SETTLE ... DELTA -n` when the
 * batch's lease ends, when the client is flushed or closed, or when the batch leaves the bounded
 * table.
 *
 * Every request admitted from a batch spent a unit that Redis granted: a process never admits
 * more than it was granted. What a batch holds is not available to other processes until it is
 * used or given back; that is the most they can be refused beyond the exact answer
 * (docs/clients.md states the bound).
 */

import { performance } from 'node:perf_hooks';

import { type Limit, limitOf, ratePerSec } from './algorithm.js';
import type { DenyCache } from './deny.js';
import { Lru } from './lru.js';
import type { Decision, Mode, MultiOutcome, Settlement } from './types.js';

/**
 * What the batches need of Redis: the client (its own batches and deny cache left out) is one,
 * so this file does not know the client that holds it.
 */
export interface BatchServer {
  /** The time a call may take (what a returned batch keeps as a margin before it ends). */
  readonly timeoutMs: number;
  /** A partial grant of at most `n` units: undefined when Redis cannot answer. */
  tryGrant(limits: readonly Limit[], n: number): Promise<MultiOutcome | undefined>;
  /** `RL.SETTLE` of `delta` units on every limit. */
  settle(limits: readonly Limit[], delta: number): Promise<Settlement>;
  /** What the failure policy answers for a request of `cost` units. */
  degradedFor(limits: readonly Limit[], cost: number): MultiOutcome;
}

/**
 * When and how a client takes batches ({@link Client.withBatching}). A key (or a plan of several
 * limits checked together) is batched when one of its keys is declared hot (`hotKeys`,
 * `hotKeysWhere`), or when this process checks it at least `detectPerSec` times in a second.
 */
export interface Batching {
  /** Keys batched from their first call (a plan of several limits when any of its keys is). */
  hotKeys?: readonly string[];
  /** Batches the keys for which this is true from their first call. */
  hotKeysWhere?: (key: string) => boolean;
  /**
   * A key is batched once this process checks it at least this many times within one second
   * (counted in whole seconds from its first call, the previous second's count included); 0: only
   * declared keys (default 100).
   */
  detectPerSec?: number;
  /** How long a batch lives, in ms (default 200); a fixed window's batch ends with its window if that comes first. */
  leaseMs?: number;
  /** The first batch size (default 8). */
  initial?: number;
  /** The largest batch (default 1,024). */
  maxBatch?: number;
  /** A batch asks for at most `1/remainingShare` of what Redis last said remains (default 8). */
  remainingShare?: number;
  /** Keys (or plans) tracked at once, the least recently used forgotten first, its batch given back (default 1,024). */
  maxKeys?: number;
}

/** What the batches of a client did since it was made (units, and requests answered). */
export interface BatchStats {
  /** Partial grants sent to take a batch. */
  refills: number;
  /** Units those grants took. */
  granted: number;
  /** Units spent by admitted requests: the requests that took a batch and those answered from one. */
  used: number;
  /** Requests admitted from a batch without a call to Redis. */
  answered: number;
  /** Units given back to Redis (`RL.SETTLE ... DELTA -n`). */
  returned: number;
  /** Units neither used nor given back (a sliding window's or log's, a window's that ended, a bucket's that refilled meanwhile, a return Redis did not answer). */
  lapsed: number;
  /** Units held in batches now. */
  held: number;
}

interface Config {
  hotKeys: ReadonlySet<string>;
  hotKeysWhere: ((key: string) => boolean) | undefined;
  detectPerSec: number;
  leaseMs: number;
  initial: number;
  maxBatch: number;
  remainingShare: number;
  maxKeys: number;
}

function config(b: Batching): Config {
  const atLeast1 = (v: number | undefined, d: number): number => Math.max(Math.trunc(v ?? d), 1);
  return {
    hotKeys: new Set(b.hotKeys ?? []),
    hotKeysWhere: b.hotKeysWhere,
    detectPerSec: Math.max(Math.trunc(b.detectPerSec ?? 100), 0),
    leaseMs: Math.max(b.leaseMs ?? 200, 0),
    initial: atLeast1(b.initial, 8),
    maxBatch: atLeast1(b.maxBatch, 1024),
    remainingShare: atLeast1(b.remainingShare, 8),
    maxKeys: atLeast1(b.maxKeys, 1024),
  };
}

/** The units of one grant still held. */
interface Batch {
  /** When the grant was sent (`performance.now()`): its decisions were made at this moment or after. */
  sent: number;
  ends: number;
  granted: number;
  held: number;
  /** The grant's reply, one per limit. */
  decisions: readonly Decision[];
  mode: Mode | undefined;
}

/** What goes back to Redis from one batch. */
interface Return {
  limits: readonly Limit[];
  batch: Batch;
}

/** One caller at a time: the turn to refill an entry. */
class Gate {
  private tail: Promise<void> = Promise.resolve();
  /** Resolves with the function that ends the turn, once the callers before have ended theirs. */
  acquire(): Promise<() => void> {
    let release: () => void = () => undefined;
    const mine = new Promise<void>((r) => (release = r));
    const before = this.tail;
    this.tail = before.then(() => mine);
    return before.then(() => release);
  }
}

/** At most what one partial grant can take of these limits: 10^15, and 1,000 sliding-log entries in all. */
function uptoMax(limits: readonly Limit[]): number {
  const logs = limits.filter(([, a]) => a.kind === 'sliding_log').length;
  return logs === 0 ? 1_000_000_000_000_000 : Math.floor(1000 / logs);
}

class Entry {
  /** Calls counted per whole second since `second`, and in the second before. */
  second: number;
  calls = 0;
  previous = 0;
  /** The next batch size (B). */
  size: number;
  /** The fewest units Redis said remain, with the latest answer (before any: the smallest limit). */
  remaining: number;
  batch: Batch | undefined;
  /** The latest batch was used up before its lease ended. */
  usedUp = false;
  /** Incremented by every grant and every batch given back. */
  generation: number;
  /** The latest grant took less than it asked (or nothing, or Redis did not answer). */
  short = false;
  /** Units of the callers waiting for a refill. */
  waiting = 0;
  readonly gate = new Gate();

  constructor(
    readonly limits: readonly Limit[],
    readonly declared: boolean,
    cfg: Config,
    now: number,
    generation: number,
  ) {
    this.second = now;
    this.size = Math.min(cfg.initial, cfg.maxBatch);
    this.remaining = Math.min(...limits.map(([, a]) => limitOf(a)));
    this.generation = generation;
  }

  countCall(now: number): void {
    const gone = now - this.second;
    if (gone >= 2000) [this.previous, this.calls, this.second] = [0, 0, now];
    else if (gone >= 1000) {
      this.previous = this.calls;
      this.calls = 0;
      this.second += 1000;
    }
    this.calls += 1;
  }

  hot(cfg: Config): boolean {
    return this.declared || (cfg.detectPerSec > 0 && Math.max(this.calls, this.previous) >= cfg.detectPerSec);
  }

  /** Whether a batch for `cost` would hold more than the cost: `1/remainingShare` of what Redis last said remains is above it. */
  worthABatch(cost: number, cfg: Config): boolean {
    return Math.floor(this.remaining / cfg.remainingShare) > cost;
  }

  /** Ends the batch if its lease is over: what it holds goes into `returns`, and B halves. */
  expire(now: number, returns: Return[]): void {
    if (this.batch !== undefined && now >= this.batch.ends) this.giveBack(returns);
  }

  /** Gives back what the batch holds now. */
  giveBack(returns: Return[]): void {
    const b = this.batch;
    if (b === undefined) return;
    this.batch = undefined;
    this.generation += 1;
    if (b.held > 0) {
      this.size = Math.max(Math.floor(this.size / 2), 1);
      this.usedUp = false;
      returns.push({ limits: this.limits, batch: b });
    }
  }

  /** Admits `cost` from the batch if it holds that much and its lease is not over. */
  take(cost: number, now: number): MultiOutcome | undefined {
    const b = this.batch;
    if (b === undefined || now >= b.ends || b.held < cost) return undefined;
    b.held -= cost;
    if (b.held === 0) this.usedUp = true;
    return answer(b, cost, now, true);
  }

  /**
   * The size of the next grant: B (doubled if the last batch was used up), or what the callers
   * waiting need if more, at most `maxBatch` and `1/remainingShare` of what Redis last said
   * remains, at least the cost.
   */
  ask(cost: number, cfg: Config, most: number): number {
    if (this.usedUp) {
      this.size = Math.min(this.size * 2, cfg.maxBatch);
      this.usedUp = false;
    }
    const want = Math.max(this.size, cost + this.waiting);
    const share = Math.floor(this.remaining / cfg.remainingShare);
    return Math.max(Math.min(want, cfg.maxBatch, share, most), cost);
  }
}

/**
 * The answer to a request admitted with `cost` units of batch `b`, which now holds `b.held`: each
 * limit's remaining is what Redis said with the grant plus what the batch still holds (what Redis
 * had before the grant, less what this process admitted from it since); the resets count down
 * from the grant.
 */
function answer(b: Batch, cost: number, now: number, local: boolean): MultiOutcome {
  const gone = Math.max(Math.floor(now - b.sent), 0);
  return {
    allowed: true,
    deniedBy: 0,
    decisions: b.decisions.map((d) => ({
      allowed: true,
      remaining: d.remaining + b.held,
      retryAfterMs: 0,
      resetAfterMs: Math.max(d.resetAfterMs - gone, 0),
      limit: d.limit,
    })),
    degraded: undefined,
    mode: b.mode,
    granted: cost,
    answeredLocally: local ? 'batch' : undefined,
  };
}

/**
 * The units of a batch that can go back to one limit at `now` without leaving it with more than
 * it would have had if they had never been taken: none for a sliding window or log; for a fixed
 * window all while the grant's window is surely still the current one, else none; for a bucket
 * and GCRA all, less what it may have refilled beyond its capacity meanwhile.
 */
function returnable(a: Limit[1], d: Decision, b: Batch, now: number, marginMs: number): number {
  switch (a.kind) {
    case 'sliding_window':
    case 'sliding_log':
    case 'concurrency':
      return 0;
    case 'fixed_window':
      return now + marginMs < b.sent + d.resetAfterMs ? b.held : 0;
    case 'token_bucket':
    case 'leaky_bucket':
    case 'gcra': {
      const age = Math.max(now + marginMs - b.sent, 0) / 1000;
      const refilled = ratePerSec(a) * age;
      // What the limit held before the grant is below remaining + 1 + granted.
      const room = d.limit - d.remaining - b.granted - 1;
      const excess = Math.ceil(Math.max(refilled - Math.max(room, 0), 0));
      return excess >= b.held ? 0 : b.held - excess;
    }
  }
}

/** The batches of a client: a bounded table of keys (or plans), each with its detection counts and at most one batch. */
export class Batches {
  private readonly cfg: Config;
  private readonly table: Lru<Entry>;
  private closed = false;
  /** Where the next entry's generations start (2^32 apart). */
  private generations = 0;
  private readonly stats = { refills: 0, granted: 0, used: 0, answered: 0, returned: 0, lapsed: 0 };
  /** Returns on their way, so that `flush` can wait for them too. */
  private readonly sending = new Set<Promise<number>>();

  constructor(
    private readonly server: BatchServer,
    batching: Batching,
  ) {
    this.cfg = config(batching);
    this.table = new Lru(this.cfg.maxKeys);
  }

  private declared(limits: readonly Limit[]): boolean {
    return limits.some(([k]) => this.cfg.hotKeys.has(k) || (this.cfg.hotKeysWhere?.(k) ?? false));
  }

  batchStats(): BatchStats {
    let held = 0;
    for (const [, e] of this.table.all()) held += e.batch?.held ?? 0;
    return { ...this.stats, held };
  }

  /** The size the next batch of `sig` would start from (B), if it is tracked. */
  size(sig: string): number | undefined {
    return this.table.peek(sig)?.size;
  }

  /** Counts the call, and answers it from the batch when it can: an answer, `'refill'` or `'plain'`. */
  tryLocal(sig: string, limits: readonly Limit[], cost: number): MultiOutcome | 'refill' | 'plain' {
    if (this.closed || cost > uptoMax(limits)) return 'plain';
    const now = performance.now();
    const returns: Return[] = [];
    let e = this.table.get(sig);
    if (e === undefined) {
      e = new Entry(limits, this.declared(limits), this.cfg, now, this.generations);
      this.generations += 2 ** 32;
      const evicted = this.table.set(sig, e);
      evicted?.[1].giveBack(returns);
    }
    e.countCall(now);
    e.expire(now, returns);
    const o = e.take(cost, now);
    let step: MultiOutcome | 'refill' | 'plain';
    if (o !== undefined) {
      this.stats.used += cost;
      this.stats.answered += 1;
      step = o;
    } else step = e.hot(this.cfg) && e.worthABatch(cost, this.cfg) ? 'refill' : 'plain';
    this.send(returns);
    return step;
  }

  /**
   * Takes a new batch for `sig`, one refill at a time: callers that come while one is in flight
   * wait for it and are served from it when it covers them. Undefined: decide this request with
   * a call of its own (the key is running low, Redis granted less than the cost, or the key left
   * the table).
   */
  async refill(sig: string, limits: readonly Limit[], cost: number, denies: DenyCache | undefined): Promise<MultiOutcome | undefined> {
    const first = this.table.get(sig);
    if (first === undefined) return undefined;
    first.waiting += cost;
    const seen = first.generation;
    const release = await first.gate.acquire();
    first.waiting = Math.max(first.waiting - cost, 0);
    try {
      const now = performance.now();
      const returns: Return[] = [];
      const e = this.table.get(sig);
      if (e === undefined || e !== first) return undefined;
      e.expire(now, returns);
      const o = e.take(cost, now);
      if (o !== undefined) {
        this.stats.used += cost;
        this.stats.answered += 1;
        this.send(returns);
        return o;
      }
      if ((e.generation !== seen && e.short) || !e.worthABatch(cost, this.cfg) || this.closed) {
        this.send(returns);
        return undefined;
      }
      // Too little left for this cost: it goes back before the new grant.
      e.giveBack(returns);
      const ask = e.ask(cost, this.cfg, uptoMax(limits));
      this.send(returns);
      const cached = denies?.lookup(sig, cost);
      if (cached !== undefined) return cached;
      return await this.grant(sig, e, limits, cost, ask, denies);
    } finally {
      release();
    }
  }

  /** Takes a batch of at most `ask` units for `sig` (its turn held): the answer for the request that asked, or undefined. */
  private async grant(
    sig: string,
    e: Entry,
    limits: readonly Limit[],
    cost: number,
    ask: number,
    denies: DenyCache | undefined,
  ): Promise<MultiOutcome | undefined> {
    this.stats.refills += 1;
    const sent = performance.now();
    let reply: MultiOutcome | undefined;
    try {
      reply = await this.server.tryGrant(limits, ask);
    } catch (err) {
      e.generation += 1;
      e.short = true;
      throw err;
    }
    if (reply === undefined) {
      e.generation += 1;
      e.short = true;
      // Redis could not answer: the failure policy answers this request.
      return this.server.degradedFor(limits, cost);
    }
    const g = reply.granted;
    this.stats.granted += g;
    const admitted = g >= cost;
    const batch: Batch = {
      sent,
      ends: sent + this.cfg.leaseMs,
      granted: g,
      held: admitted ? g - cost : g,
      decisions: reply.decisions,
      mode: reply.mode,
    };
    limits.forEach(([, a], i) => {
      if (a.kind === 'fixed_window') batch.ends = Math.min(batch.ends, sent + reply.decisions[i]!.resetAfterMs);
    });
    // Redis's own answer for this request: the grant's, less the units left in the batch.
    const out = admitted ? answer(batch, cost, batch.sent, false) : undefined;
    const returns: Return[] = [];
    if (this.table.peek(sig) === e && !this.closed) {
      e.generation += 1;
      e.short = g < ask;
      e.usedUp = false;
      e.remaining = Math.min(...reply.decisions.map((d) => d.remaining));
      e.size = Math.max(Math.min(e.size, Math.floor(e.remaining / this.cfg.remainingShare)), 1);
      // Whatever another grant left (none while turns are kept) goes back.
      e.giveBack(returns);
      if (batch.held > 0) {
        this.expireAt(sig, e, e.generation, batch.ends);
        e.batch = batch;
      } else if (admitted) e.usedUp = true;
    } else if (batch.held > 0) returns.push({ limits, batch });
    this.send(returns);
    if (admitted) {
      this.stats.used += cost;
      return out;
    }
    if (g === 0 && cost === 1) {
      // Nothing left: the denial of one unit, exactly what a call with cost 1 answers.
      denies?.record(sig, cost, reply, sent);
      return reply;
    }
    return undefined;
  }

  /** What Redis answered a call of `sig` made without a batch: what remains, for the next batch's size. */
  observe(sig: string, o: MultiOutcome): void {
    if (o.degraded !== undefined || o.answeredLocally !== undefined || o.decisions.length === 0) return;
    const e = this.table.peek(sig);
    if (e !== undefined) e.remaining = Math.min(...o.decisions.map((d) => d.remaining));
  }

  /** Gives back the batch of `e` when its lease ends, unless another grant replaced it. */
  private expireAt(sig: string, e: Entry, generation: number, at: number): void {
    const timer = setTimeout(() => {
      if (this.table.peek(sig) !== e || e.generation !== generation) return;
      const returns: Return[] = [];
      e.giveBack(returns);
      this.send(returns);
    }, Math.max(at - performance.now(), 0));
    timer.unref();
  }

  /** Sends what `r` can give back, one `RL.SETTLE` per distinct number of units; the units given back to every limit (the fewest). */
  private async giveBack(r: Return): Promise<number> {
    const now = performance.now();
    const deltas = r.limits.map(([, a], i) => returnable(a, r.batch.decisions[i]!, r.batch, now, this.server.timeoutMs));
    const back = deltas.map(() => 0);
    const groups = [...new Set(deltas.filter((n) => n > 0))].sort((a, b) => a - b);
    for (const n of groups) {
      const idx = deltas.flatMap((d, i) => (d === n ? [i] : []));
      try {
        const s = await this.server.settle(
          idx.map((i) => r.limits[i]!),
          -n,
        );
        if (s.degraded === undefined) for (const i of idx) back[i] = n;
      } catch {
        // Refused: the units lapse.
      }
    }
    const returned = back.length === 0 ? 0 : Math.min(...back);
    this.stats.returned += returned;
    this.stats.lapsed += r.batch.held - returned;
    return returned;
  }

  private send(returns: Return[]): void {
    for (const r of returns) {
      const p = this.giveBack(r);
      this.sending.add(p);
      void p.finally(() => this.sending.delete(p));
    }
  }

  /** Gives back what every batch holds now, and waits for the answers: the units given back. */
  async flush(): Promise<number> {
    const returns: Return[] = [];
    for (const [, e] of this.table.all()) e.giveBack(returns);
    let n = 0;
    for (const r of returns) n += await this.giveBack(r);
    await Promise.allSettled([...this.sending]);
    return n;
  }

  /** Stops taking batches (every call goes to Redis one by one from now on) and gives back what they hold. */
  close(): Promise<number> {
    this.closed = true;
    return this.flush();
  }
}
