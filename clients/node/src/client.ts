/**
 * The client: mode detection (module, Functions library, scripts), the Lua fallback reloaded on
 * `NOSCRIPT`, per-call timeouts and abort signals, the failure policy and the circuit breaker.
 */

import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';

import {
  type Algorithm,
  type Concurrency,
  type Limit,
  commandOf,
  keywordOf,
  limitOf,
  plainNumber,
  preparedParams,
  signature,
} from './algorithm.js';
import { type BatchServer, type BatchStats, Batches, type Batching } from './batch.js';
import { Breaker } from './breaker.js';
import { type Connection, type ConnectionSource, RedisReplyError, type Reply, keySlot, toConnection } from './connection.js';
import { Attempt, Sweep, afterNextPoll } from './deadline.js';
import { DenyCache } from './deny.js';
import { Lane } from './durable.js';
import { Lease } from './lease.js';
import { LocalLeases, LocalLimiter } from './local.js';
import { Reservation } from './reservation.js';
import {
  ALL_SCRIPT,
  LIBRARY,
  LIBRARY_NAME,
  RELEASE_SCRIPT,
  SETTLE_SCRIPT,
  type Script,
  functionName,
  scriptFor,
} from './scripts.js';
import {
  type CallOptions,
  type ClientOptions,
  type Decision,
  type Degraded,
  type Durability,
  type DurabilityStats,
  type FailurePolicy,
  type Mode,
  type MultiOutcome,
  type Outcome,
  RejectedError,
  type Settlement,
  type TopEntry,
  UnavailableError,
  UnsupportedError,
} from './types.js';

export type { Limit } from './algorithm.js';

/** The answer to {@link Client.acquire}: the outcome, and the lease when admitted. */
export interface LeaseOutcome {
  readonly outcome: Outcome;
  /** Set exactly when admitted. */
  readonly lease: Lease | undefined;
}

/** The answer to {@link Client.acquireAll}. */
export interface MultiLeaseOutcome {
  readonly outcome: MultiOutcome;
  /** Set when admitted with a cost above 0 and at least one concurrency limit. */
  readonly lease: Lease | undefined;
}

/** The answer to {@link Client.reserve}: the outcome, and the reservation when admitted. */
export interface ReservationOutcome {
  readonly outcome: Outcome;
  /** Set exactly when admitted. */
  readonly reservation: Reservation | undefined;
}

/** The answer to {@link Client.reserveAll}. */
export interface MultiReservationOutcome {
  readonly outcome: MultiOutcome;
  readonly reservation: Reservation | undefined;
}

/**
 * Refusals returned to the caller as they are: an error about the call itself, or one that
 * asking again cannot fix and that failing open would hide (the user may not run the command,
 * is not authenticated, the server is full, the address is a replica). Any other error
 * (`LOADING`, `CLUSTERDOWN`, `MASTERDOWN`, `TRYAGAIN`, `BUSY`...) means Redis could not decide.
 */
const REJECTED = new Set(['ERR', 'WRONGTYPE', 'CROSSSLOT', 'NOPERM', 'NOAUTH', 'WRONGPASS', 'OOM', 'READONLY']);

const LEASE_PREFIX = randomBytes(8).toString('hex');
let leaseCounter = 0;

/** A lease id unique to this call: a random per-process prefix, the process id, a counter. */
export function newLeaseId(): string {
  leaseCounter += 1;
  return `${LEASE_PREFIX}-${process.pid.toString(16)}-${leaseCounter.toString(16)}`;
}

class UnexpectedReply extends Error {
  override name = 'UnexpectedReply';
  constructor(reply: Reply) {
    super(`unexpected reply: ${JSON.stringify(reply)}`);
  }
}

function int(v: Reply): number {
  if (typeof v === 'number' && Number.isInteger(v)) return v;
  throw new UnexpectedReply(v);
}

/**
 * What a call takes: a cost (`upto` false), or a partial grant of at most `n` units (`UPTO n`).
 * @internal
 */
export interface Take {
  readonly upto: boolean;
  readonly n: number;
}

/** @internal A cost of `n` units. */
export function costOf(n: number): Take {
  return { upto: false, n };
}

const COST_ONE: Take = Object.freeze({ upto: false, n: 1 });

/**
 * A limiter's reply: five integers, and a sixth (`granted`) for a partial grant. For a cost the
 * units taken are the cost when admitted, else 0.
 */
function decisionTaken(v: Reply, take: Take): [Decision, number] {
  if (!Array.isArray(v) || v.length !== (take.upto ? 6 : 5)) throw new UnexpectedReply(v);
  const d = decision(take.upto ? v.slice(0, 5) : v);
  if (!take.upto) return [d, d.allowed ? take.n : 0];
  const granted = int(v[5]);
  if (granted < 0) throw new UnexpectedReply(v);
  return [d, granted];
}

/** Whether a limiter's reply (five or six integers) admits. */
function isAllowed(v: Reply): boolean {
  return Array.isArray(v) && v[0] === 1;
}

function decision(v: Reply): Decision {
  if (!Array.isArray(v) || v.length !== 5) throw new UnexpectedReply(v);
  const allowed = int(v[0]);
  const remaining = int(v[1]);
  const retryAfterMs = int(v[2]);
  const resetAfterMs = int(v[3]);
  const limit = int(v[4]);
  if (remaining < 0 || resetAfterMs < 0 || limit < 0) throw new UnexpectedReply(v);
  return { allowed: allowed === 1, remaining, retryAfterMs, resetAfterMs, limit };
}

/** A limit's command for a cost of 1, key at index 1, made once per algorithm of the module's functions: a copy each call. */
const COMMAND_ONE = new WeakMap<Algorithm, readonly string[]>();

function commandOne(a: Algorithm): string[] {
  let c = COMMAND_ONE.get(a);
  if (c === undefined) {
    c = [commandOf(a), '', ...preparedParams(a), '1'];
    if (Object.isFrozen(a)) COMMAND_ONE.set(a, c);
  }
  return c.slice();
}

function decisions(v: Reply, n: number): Decision[] {
  if (!Array.isArray(v) || v.length !== n) throw new UnexpectedReply(v);
  return v.map(decision);
}

/** `RL.ALL`'s reply: allowed, denied_by, one reply per limit; the units granted (the same in each inner reply of a partial grant). */
function multi(v: Reply, n: number, take: Take): [boolean, number, Decision[], number] {
  if (!Array.isArray(v) || v.length !== n + 2) throw new UnexpectedReply(v);
  const deniedBy = int(v[1]);
  if (deniedBy < 0) throw new UnexpectedReply(v);
  const allowed = int(v[0]) === 1;
  const replies = v.slice(2).map((r: Reply) => decisionTaken(r, take));
  const granted = take.upto ? (replies[0]?.[1] ?? 0) : allowed ? take.n : 0;
  return [allowed, deniedBy, replies.map((r) => r[0]), granted];
}

function text(v: Reply): string {
  if (typeof v === 'string') return v;
  if (Buffer.isBuffer(v)) return v.toString('utf8');
  throw new UnexpectedReply(v);
}

function topEntries(v: Reply): TopEntry[] {
  if (!Array.isArray(v)) throw new UnexpectedReply(v);
  return v.map((e: Reply) => {
    if (!Array.isArray(e) || e.length !== 6) throw new UnexpectedReply(v);
    return {
      key: text(e[0]),
      denied: int(e[1]),
      error: int(e[2]),
      command: text(e[3]),
      firstDeniedMs: int(e[4]),
      lastDeniedMs: int(e[5]),
    };
  });
}

function checkCount(what: string, n: number): void {
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`${what} must be an integer from 0 to 2^53-1, not ${n}`);
}

/** A call waiting for a place among the calls on their way to Redis. */
interface Waiter {
  readonly at: Attempt;
  readonly resolve: () => void;
  readonly reject: (e: unknown) => void;
}

type Guarded<T> = { ok: true; value: T } | { ok: false; cause: unknown };

const USER_ABORT = Symbol('aborted by the caller');

/** A call that waited for a place while the breaker opened: skipped, as the breaker skips. */
const SKIPPED = Symbol('skipped: circuit breaker open');

/** `work` under a deadline of its own: rejected, and its signal aborted, after `budgetMs`. */
function underDeadline<T>(budgetMs: number, what: string, work: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      // An answer that has arrived but is not read yet is read first.
      afterNextPoll(() => {
        const e = new Error(`${what}: no answer within ${budgetMs} ms`);
        controller.abort(e);
        reject(e);
      });
    }, budgetMs);
  });
  return Promise.race([work(controller.signal), expired]).finally(() => clearTimeout(timer));
}

/**
 * The most calls of one client with a command on its way to Redis at once, by default: no bound.
 * The calls share one connection, so a bound only splits what would be one pipelined write.
 */
const IN_FLIGHT = Number.POSITIVE_INFINITY;

/**
 * The deadline of each step of the client's start-up (a connection attempt under way, the mode's
 * detection, a script's load), in budgets of the call that began it: a loaded machine may take
 * more than one call's budget to make a connection, and the start-up is no call's to fail.
 */
const START_UP_FACTOR = 10;

function isNoScript(e: unknown): boolean {
  return e instanceof RedisReplyError && e.reply.startsWith('NOSCRIPT');
}

/** The answer made when Redis could not: the policy's decision and which policy it was. */
type Fallback = [Decision, Degraded];

/** @internal The answer for one limit, from an answer for exactly one. */
export function single(o: MultiOutcome): Outcome {
  return {
    decision: o.decisions[0] ?? { allowed: o.allowed, remaining: 0, retryAfterMs: 0, resetAfterMs: 0, limit: 0 },
    degraded: o.degraded,
    mode: o.mode,
    granted: o.granted,
    answeredLocally: o.answeredLocally,
  };
}

/** @internal The answer for one limit as an answer for several. */
export function multiOf(o: Outcome): MultiOutcome {
  return {
    allowed: o.decision.allowed,
    deniedBy: o.decision.allowed ? 0 : 1,
    decisions: [o.decision],
    degraded: o.degraded,
    mode: o.mode,
    granted: o.granted,
    answeredLocally: o.answeredLocally,
  };
}

/**
 * A connection to Redis (or Redis Cluster) that decides with the module, the Functions library
 * or the scripts. Several keys in one call (`checkAll`, `settle`...) need a common hash tag on a
 * cluster (`{user42}:minute`, `{user42}:hour`).
 */
export class Client {
  private readonly conn: Connection;
  private readonly breaker: Breaker;
  private readonly local = new LocalLimiter();
  private readonly leases = new LocalLeases();
  private modeValue: Mode | undefined;
  /** Calls whose command is on its way to Redis, and the calls waiting for a place among them. */
  private inFlight = 0;
  private readonly waiting: Waiter[] = [];
  /** When Redis last answered a call of this client (`performance.now()`). */
  private answeredAt = Number.NEGATIVE_INFINITY;
  /** The deadlines of the calls on their way to Redis. */
  private readonly sweep = new Sweep(() => this.answeredAt);
  /** The connection was ready once: from then on a call is sent as it comes. */
  private connected = false;
  private connecting: Promise<void> | undefined;
  /** The cluster's slots being read again, after a call got no answer: calls meanwhile fail at once. */
  private rediscovering: Promise<void> | undefined;
  private detecting: Promise<Mode> | undefined;
  /** Each script's `SCRIPT LOAD` in flight, by SHA-1 (and, loaded again on another node, by slot). */
  private readonly loading = new Map<string, Promise<void>>();
  /** How many loads of each script have ended: an `EVALSHA` sent before the latest needs none. */
  private readonly loads = new Map<string, number>();
  /** The deny cache, when on ({@link Client.withDenyCache}). */
  private denies: DenyCache | undefined;
  /** The leased batches, when on ({@link Client.withBatching}). */
  private batches: Batches | undefined;
  /** The durable lane, when on ({@link Client.withDurability}). */
  private durable: Lane | undefined;
  readonly timeoutMs: number;
  readonly policy: FailurePolicy;
  readonly instances: number;
  readonly failClosedRetryMs: number;
  /** The most calls with a command on their way to Redis at once. */
  readonly maxInFlight: number;

  /**
   * `connection`: a node-redis client or cluster, an ioredis `Redis` or `Cluster`, or any
   * {@link Connection}. The client sends its commands through it and never connects, closes or
   * configures it (see docs/node.md for the settings that let a call fail fast while Redis is
   * down).
   */
  constructor(connection: ConnectionSource, options: ClientOptions = {}) {
    this.conn = toConnection(connection);
    this.timeoutMs = options.timeoutMs ?? 100;
    this.policy = options.policy ?? 'fail-open';
    this.instances = Math.max(Math.trunc(options.instances ?? 1), 1);
    this.failClosedRetryMs = options.failClosedRetryMs ?? 1000;
    this.maxInFlight = Math.max(Math.trunc(options.maxInFlight ?? IN_FLIGHT), 1);
    this.breaker = new Breaker(options.breaker);
    this.modeValue = options.mode === undefined || options.mode === 'auto' ? undefined : options.mode;
  }

  /** A client whose mode is detected at once (within the timeout; later if Redis is down now). */
  static async open(connection: ConnectionSource, options: ClientOptions = {}): Promise<Client> {
    const c = new Client(connection, options);
    await c.detect();
    return c;
  }

  /** The mode in use, once known (after the first call that reached Redis in `'auto'`). */
  get mode(): Mode | undefined {
    return this.modeValue;
  }

  /**
   * Turns the deny cache on, with at most `entries` entries, the least recently used evicted
   * first: after Redis denies a check with `retryAfterMs` R, the same check (same keys,
   * algorithms, parameters and cost) is denied without calling Redis until R has passed on the
   * process's monotonic clock ({@link Outcome.answeredLocally} `'deny_cache'`, the waits counted
   * down). When R has passed, one check asks Redis again while the others are still denied from
   * the entry, for at most the client's timeout. It may deny for up to R (and that timeout) what
   * Redis would admit sooner (another process's refund, a raised limit), never admit what Redis
   * would deny. Off by default. Returns this client.
   */
  withDenyCache(entries: number): this {
    this.denies = new DenyCache(entries, this.timeoutMs);
    return this;
  }

  /** Turns the deny cache off. Returns this client. */
  withoutDenyCache(): this {
    this.denies = undefined;
    return this;
  }

  /** The deny cache's number of entries at most, when it is on. */
  get denyCacheCapacity(): number | undefined {
    return this.denies?.capacity;
  }

  /** Entries in the deny cache now. */
  get denyCacheLen(): number {
    return this.denies?.size ?? 0;
  }

  /** When the deny cache's entry for these limits at this cost expires (`performance.now()` time), if it has one. */
  deniedUntil(limits: readonly Limit[], cost: number): number | undefined {
    return this.denies?.until(signature(limits), cost);
  }

  /**
   * Turns leased batches on: a hot key's units are taken several at a time with one partial
   * grant (`UPTO n`) and its requests admitted from them in the process
   * ({@link Outcome.answeredLocally} `'batch'`), what is not used going back with `RL.SETTLE ...
   * DELTA -n` when the batch's lease ends, on {@link Client.flush} and {@link Client.close}, and
   * when its entry leaves the bounded table. A check of a cost above 0 on one limit, or on several
   * without a concurrency limit, is batched when one of its keys is declared hot or this process
   * checks it `detectPerSec` times a second. Returns this client.
   */
  withBatching(batching: Batching = {}): this {
    const server: BatchServer = {
      timeoutMs: this.timeoutMs,
      tryGrant: (limits, n) => this.tryGrant(limits, n),
      settle: (limits, delta) => this.settle(limits, delta),
      degradedFor: (limits, cost) => this.degradedFor(limits, cost),
    };
    this.batches = new Batches(server, batching);
    return this;
  }

  /** Turns batches off (what they hold is not given back: {@link Client.flush} first). Returns this client. */
  withoutBatching(): this {
    this.batches = undefined;
    return this;
  }

  /** What the batches did so far (all zero without batches). */
  batchStats(): BatchStats {
    return this.batches?.batchStats() ?? { refills: 0, granted: 0, used: 0, answered: 0, returned: 0, lapsed: 0, held: 0 };
  }

  /** The size the next batch of these limits starts from (B), while they are tracked. */
  batchSize(limits: readonly Limit[]): number | undefined {
    return this.batches?.size(signature(limits));
  }

  /**
   * Gives back at once what every batch holds (`RL.SETTLE ... DELTA -n`), and waits for the
   * answers: the units given back. The keys are batched again on their next calls.
   */
  flush(): Promise<number> {
    return this.batches?.flush() ?? Promise.resolve(0);
  }

  /**
   * Stops the batches (checks go to Redis one by one from now on) and gives back what they hold:
   * the units given back; closes the durable lane's idle connections. Call it before the process
   * ends.
   */
  async close(): Promise<number> {
    const returned = (await this.batches?.close()) ?? 0;
    await this.durable?.closeAll();
    return returned;
  }

  /**
   * Admits only what `durability.replicas` replicas acknowledged: every call that may write (a
   * cost above 0, a partial grant, a lease; `RL.ALL` too) runs on a connection of the durable lane
   * (opened by `durability.connect`), followed by `WAIT replicas timeout` (`WAITAOF 0 replicas
   * timeout` with `aof`, and `WAIT` on a server without it) on that same connection, so the
   * client's shared connection never waits. An admission acknowledged by fewer replicas in time
   * becomes what `durability.short` says (default `'deny'`: the units stay spent on the master,
   * `retryAfterMs` the fail-closed wait). Denials are answered at once. `durability.timeoutMs`
   * must be below the client's timeout, which bounds the call and its `WAIT` together
   * ({@link UnsupportedError} otherwise, or for 0 replicas). Returns this client.
   */
  withDurability(durability: Durability): this {
    if (!Number.isSafeInteger(durability.replicas) || durability.replicas < 1) throw new UnsupportedError('durable admissions need at least 1 replica');
    if (!(durability.timeoutMs < this.timeoutMs)) throw new UnsupportedError("the WAIT timeout must be below the client's timeout");
    this.durable = new Lane(durability);
    return this;
  }

  /** What the durable admissions met so far (all zero without durability). */
  durabilityStats(): DurabilityStats {
    return this.durable?.durabilityStats() ?? { acknowledged: 0, short: 0 };
  }

  /** Whether the circuit breaker is open (or half open). */
  get breakerOpen(): boolean {
    return this.breaker.isOpen();
  }

  /** Detects the mode now if not known yet; undefined if Redis did not answer in time. */
  async detect(call?: CallOptions): Promise<Mode | undefined> {
    const g = await this.guarded((at) => Promise.resolve(this.resolveMode(at)), call, false);
    return g.ok ? g.value : undefined;
  }

  /**
   * Loads (or replaces) the Functions library on the server: `FUNCTION LOAD REPLACE`. On a
   * cluster, load it on every master (through a client of each). Throws {@link RejectedError}
   * for a refusal, {@link UnavailableError} when Redis does not answer.
   */
  async loadLibrary(call?: CallOptions): Promise<void> {
    const g = await this.guarded(async (at) => {
      await this.connection(at);
      return this.conn.send(['FUNCTION', 'LOAD', 'REPLACE', LIBRARY], undefined, this.signalFor(at, this.conn));
    }, call);
    if (!g.ok) throw new UnavailableError(g.cause);
  }

  /**
   * Waits, outside the call's deadline, for the connection while the client library is making it
   * (once: until it has been ready). One wait however many callers come.
   */
  private connection(at: Attempt): Promise<void> | undefined {
    if (this.connected) return undefined;
    if (!this.connecting) {
      const controller = new AbortController();
      const waiting = this.conn.ready?.(controller.signal);
      if (waiting === undefined) {
        this.connected = true;
        return undefined;
      }
      waiting.catch(() => undefined);
      this.connecting = underDeadline(at.budgetMs * START_UP_FACTOR, 'the connection', (signal) => {
        signal.addEventListener('abort', () => controller.abort(signal.reason), { once: true });
        return waiting;
      })
        .then(() => {
          this.connected = true;
        })
        .finally(() => {
          this.connecting = undefined;
        });
    }
    return at.outside(this.connecting);
  }

  /**
   * On a cluster, after a call got no answer in time (a master that froze sends no redirection):
   * the slots read from the nodes again, once however many calls meet it, under a deadline of
   * its own; the calls that come meanwhile are answered by the failure policy at once.
   */
  private rediscover(budgetMs: number): void {
    const conn = this.conn;
    if (conn.rediscover === undefined || this.rediscovering !== undefined) return;
    this.rediscovering = underDeadline(budgetMs * START_UP_FACTOR, "the cluster's slots", () => conn.rediscover!())
      .catch(() => undefined)
      .finally(() => {
        this.rediscovering = undefined;
      });
  }

  /**
   * The mode, known or detected now: the client's start-up (the connection, then `COMMAND
   * INFO`, then `FUNCTION LIST`), one for every caller that comes meanwhile, outside their
   * deadlines and under its own.
   */
  private resolveMode(at: Attempt): Mode | Promise<Mode> {
    if (this.modeValue !== undefined && this.connected) return this.modeValue;
    return this.startUp(at);
  }

  private async startUp(at: Attempt): Promise<Mode> {
    await this.connection(at);
    if (this.modeValue !== undefined) return this.modeValue;
    this.detecting ??= underDeadline(at.budgetMs * START_UP_FACTOR, 'the mode\'s detection', async (signal) => {
      const info = await this.conn.send(['COMMAND', 'INFO', 'rl.all'], undefined, signal);
      if (!Array.isArray(info)) throw new UnexpectedReply(info);
      const loaded = info.length > 0 && info[0] !== null && info[0] !== undefined;
      const mode: Mode = loaded ? 'module' : (await this.hasLibrary(signal)) ? 'function' : 'script';
      this.modeValue = mode;
      this.answeredAt = performance.now();
      return mode;
    }).finally(() => {
      this.detecting = undefined;
    });
    return at.outside(this.detecting);
  }

  /**
   * Whether the `ratelimit` Functions library is loaded. A server that refuses to say (an error
   * reply, such as `NOPERM` for `FUNCTION`) is taken to have none: the scripts decide alike.
   */
  private async hasLibrary(signal: AbortSignal): Promise<boolean> {
    try {
      const listed = await this.conn.send(['FUNCTION', 'LIST', 'LIBRARYNAME', LIBRARY_NAME], undefined, signal);
      if (!Array.isArray(listed)) throw new UnexpectedReply(listed);
      return listed.length > 0;
    } catch (e) {
      if (e instanceof RedisReplyError) return false;
      throw e;
    }
  }

  /**
   * `EVALSHA` of a script; on `NOSCRIPT`, one `SCRIPT LOAD` (on the keys' node) for every caller
   * that meets it meanwhile, then again. A caller whose `EVALSHA` went before a load ended only
   * sends it again. Still `NOSCRIPT` (the key is on another node of a cluster, or the scripts were
   * flushed again): loaded there, once per slot, and sent a last time.
   */
  private async evalsha(script: Script, keys: readonly string[], args: readonly string[], at: Attempt, conn: Connection = this.conn): Promise<Reply> {
    const cmd = ['EVALSHA', script.sha, String(keys.length), ...keys, ...args];
    for (const scope of [script.sha, `${script.sha}:${keySlot(keys[0] ?? '')}`]) {
      const before = this.loads.get(scope) ?? 0;
      try {
        return await conn.send(cmd, keys[0], this.signalFor(at, conn));
      } catch (e) {
        if (!isNoScript(e)) throw e;
        this.answeredAt = performance.now();
      }
      await this.loadScript(script, keys[0], scope, before, at);
      // A call given up (its deadline, the caller's abort) sends nothing more.
      at.throwIfGivenUp();
    }
    return conn.send(cmd, keys[0], this.signalFor(at, conn));
  }

  /** The one `SCRIPT LOAD` of `scope` that a caller who met `NOSCRIPT` waits for. */
  private loadScript(script: Script, key: string | undefined, scope: string, before: number, at: Attempt): Promise<void> | undefined {
    if ((this.loads.get(scope) ?? 0) !== before) return undefined;
    let load = this.loading.get(scope);
    if (load === undefined) {
      load = underDeadline(at.budgetMs * START_UP_FACTOR, 'SCRIPT LOAD', (signal) => this.conn.send(['SCRIPT', 'LOAD', script.source], key, signal))
        .then(() => {
          this.loads.set(scope, before + 1);
          this.answeredAt = performance.now();
        })
        .finally(() => {
          this.loading.delete(scope);
        });
      this.loading.set(scope, load);
    }
    return at.outside(load);
  }

  /** A command in the mode in use: the module's, its function in the library, or its script. */
  private async command(
    mode: Mode,
    command: string,
    script: Script,
    keys: readonly string[],
    args: readonly string[],
    at: Attempt,
    numkeys: boolean,
    conn: Connection = this.conn,
  ): Promise<Reply> {
    const waiting = this.turn(at);
    if (waiting !== undefined) {
      await waiting;
      at.throwIfGivenUp();
    }
    // The place is given back when the command is answered, or when the call is given up
    // (guarded), whichever comes first.
    try {
      return await this.dispatch(mode, command, script, keys, args, at, numkeys, conn);
    } finally {
      this.endTurn(at);
    }
  }

  /** Sends the command of `mode` (a call holding a place). */
  private dispatch(
    mode: Mode,
    command: string,
    script: Script,
    keys: readonly string[],
    args: readonly string[],
    at: Attempt,
    numkeys: boolean,
    conn: Connection,
  ): Promise<Reply> {
    switch (mode) {
      case 'module': {
        const full = [command];
        if (numkeys) full.push(String(keys.length));
        for (const k of keys) full.push(k);
        for (const x of args) full.push(x);
        return conn.send(full, keys[0], this.signalFor(at, conn));
      }
      case 'function':
        return conn.send(['FCALL', functionName(command), String(keys.length), ...keys, ...args], keys[0], this.signalFor(at, conn));
      case 'script':
        return this.evalsha(script, keys, args, at, conn);
    }
  }

  /** Gives back the place of `at`, if it holds one. */
  private endTurn(at: Attempt): void {
    if (!at.turn) return;
    at.turn = false;
    this.nextTurn();
  }

  /**
   * The signal `conn.send` gets for `at`: the deadline's, made only when a command may wait in
   * the library's queue (or on a connection of the durable lane, closed when its call is given
   * up); else the caller's own, if any.
   */
  private signalFor(at: Attempt, conn: Connection): AbortSignal | undefined {
    if (conn !== this.conn || conn.queues === undefined || conn.queues()) return at.signal();
    return at.user;
  }

  /**
   * A place among the calls on their way to Redis for `at`: at once while fewer than maxInFlight
   * hold one (undefined), else a promise of the next free place, in the order the calls came.
   * Waiting for a place is the client's queue, not Redis failing to answer: the deadline is
   * stopped meanwhile, and counted anew in full when the place comes.
   */
  private turn(at: Attempt): Promise<void> | undefined {
    if (this.inFlight < this.maxInFlight) {
      this.inFlight += 1;
      at.turn = true;
      return undefined;
    }
    at.stop();
    return new Promise((resolve, reject) => this.waiting.push({ at, resolve, reject }));
  }

  /**
   * The place of a call that is done goes to the call that has waited longest. One given up
   * meanwhile (the caller's abort) sends nothing, nor does one whose place comes while the
   * breaker is open (the calls ahead got no answer): it is skipped, and the place goes on.
   */
  private nextTurn(): void {
    for (;;) {
      const next = this.waiting.shift();
      if (next === undefined) {
        this.inFlight -= 1;
        return;
      }
      const at = next.at;
      if (at.done) {
        next.reject(at.reason);
        continue;
      }
      if (this.breaker.isOpen()) {
        next.reject(SKIPPED);
        continue;
      }
      at.turn = true;
      at.restart();
      next.resolve();
      return;
    }
  }

  /**
   * One limit's command: the parameters, then the cost, or for a concurrency limit the lease id
   * (`RL.ACQUIRE` takes no cost).
   */
  private async callOne(key: string, a: Algorithm, take: Take, lease: string | undefined, at: Attempt): Promise<[Decision, number, Mode]> {
    const known = this.resolveMode(at);
    const mode = typeof known === 'string' ? known : await known;
    const args = [...preparedParams(a)];
    if (a.kind === 'concurrency' && lease !== undefined) args.push(lease);
    else if (take.upto) args.push('UPTO', plainNumber(take.n));
    else args.push(take.n === 1 ? '1' : plainNumber(take.n));
    const lane = this.laneFor(take, lease);
    const c = lane === undefined ? undefined : await lane.take();
    let reply: Reply;
    let acknowledged = true;
    try {
      // As command(), without a promise of its own in between.
      const waiting = this.turn(at);
      if (waiting !== undefined) {
        await waiting;
        at.throwIfGivenUp();
      }
      try {
        reply = await this.dispatch(mode, commandOf(a), scriptFor(a), [key], args, at, false, c?.connection ?? this.conn);
      } finally {
        this.endTurn(at);
      }
      if (lane !== undefined && c !== undefined && isAllowed(reply)) {
        at.throwIfGivenUp();
        acknowledged = await lane.acknowledged(c, key, at.signal());
      }
    } catch (e) {
      if (lane !== undefined && c !== undefined) lane.drop(c);
      throw e;
    }
    if (lane !== undefined && c !== undefined) lane.put(c);
    let [d, granted] = a.kind === 'concurrency' ? [decision(reply), 0] : decisionTaken(reply, take);
    if (a.kind === 'concurrency') granted = d.allowed ? 1 : 0;
    if (!acknowledged && this.shortAckDenies(lane!)) [d, granted] = [this.refuse(d), 0];
    return [d, granted, mode];
  }

  /** The durable lane, for a call that may write (a cost above 0, a partial grant, a lease). */
  private laneFor(take: Take, lease: string | undefined): Lane | undefined {
    return take.upto || take.n > 0 || lease !== undefined ? this.durable : undefined;
  }

  /**
   * Whether an admission fewer replicas acknowledged is denied (`'deny'`) rather than admitted
   * (`'admit'`); for `'failure-policy'` it throws, and the failure policy answers.
   */
  private shortAckDenies(lane: Lane): boolean {
    switch (lane.durability.short ?? 'deny') {
      case 'admit':
        return false;
      case 'deny':
        return true;
      case 'failure-policy':
        throw new Error('fewer replicas acknowledged the write than asked');
    }
  }

  /** `d` turned into the refusal of an admission the replicas did not acknowledge. */
  private refuse(d: Decision): Decision {
    return { ...d, allowed: false, retryAfterMs: this.failClosedRetryMs };
  }

  private async callRelease(key: string, id: string, at: Attempt): Promise<number> {
    const mode = await this.resolveMode(at);
    return int(await this.command(mode, 'RL.RELEASE', RELEASE_SCRIPT, [key], [id], at, false));
  }

  private static limitArgs(limits: readonly Limit[]): string[] {
    const args: string[] = [];
    for (const [, a] of limits) args.push(keywordOf(a), ...preparedParams(a));
    return args;
  }

  private async callAll(limits: readonly Limit[], take: Take, lease: string | undefined, at: Attempt): Promise<[[boolean, number, Decision[], number], Mode]> {
    const mode = await this.resolveMode(at);
    const args = Client.limitArgs(limits);
    if (lease !== undefined) args.push('LEASE', lease);
    if (take.upto) args.push('UPTO', plainNumber(take.n));
    else args.push('COST', plainNumber(take.n));
    const keys = limits.map(([k]) => k);
    const lane = this.laneFor(take, lease);
    const c = lane === undefined ? undefined : await lane.take();
    let reply: Reply;
    let acknowledged = true;
    try {
      reply = await this.command(mode, 'RL.ALL', ALL_SCRIPT, keys, args, at, true, c?.connection);
      if (lane !== undefined && c !== undefined && Array.isArray(reply) && reply[0] === 1) {
        at.throwIfGivenUp();
        acknowledged = await lane.acknowledged(c, keys[0] ?? '', at.signal());
      }
    } catch (e) {
      if (lane !== undefined && c !== undefined) lane.drop(c);
      throw e;
    }
    if (lane !== undefined && c !== undefined) lane.put(c);
    const m = multi(reply, limits.length, take);
    if (!acknowledged && this.shortAckDenies(lane!)) {
      // Denied as by the first limit, every limit answering the same refusal.
      return [[false, 1, m[2].map((d) => this.refuse(d)), 0], mode];
    }
    return [m, mode];
  }

  private async callSettle(limits: readonly Limit[], delta: number, at: Attempt): Promise<[Decision[], Mode]> {
    const mode = await this.resolveMode(at);
    const args = Client.limitArgs(limits);
    args.push('DELTA', plainNumber(delta));
    const keys = limits.map(([k]) => k);
    const reply = await this.command(mode, 'RL.SETTLE', SETTLE_SCRIPT, keys, args, at, true);
    return [decisions(reply, limits.length), mode];
  }

  /**
   * Runs `fn` under the timeout, the caller's signal and the breaker. A Redis refusal is thrown
   * as {@link RejectedError}; no answer in time (or an error that means Redis could not decide)
   * is `{ ok: false }`; the caller's abort rejects with the signal's reason. The timeout is
   * stopped while the call waits for the client's start-up ({@link Attempt.outside}).
   */
  private async guarded<T>(fn: (at: Attempt) => Promise<T>, call: CallOptions | undefined, breaker = true): Promise<Guarded<T>> {
    const user = call?.signal;
    user?.throwIfAborted();
    if (this.rediscovering !== undefined) return { ok: false, cause: new Error("the cluster's slots are being read again") };
    if (breaker && !this.breaker.permit()) return { ok: false, cause: new Error('circuit breaker open') };
    // The deadline: `budgetMs` without an answer from Redis, kept by the client's sweep (one
    // timer for every call). At its end, an answer that has arrived but is not read yet is read
    // first; and while Redis answers the client's other calls (this one's command waits behind
    // theirs on the connection), the call waits on, up to WAIT_FACTOR times its budget.
    const at = new Attempt(this.sweep, call?.timeoutMs ?? this.timeoutMs, user);
    try {
      const value = await at.run(fn, USER_ABORT);
      this.answeredAt = performance.now();
      if (breaker) this.breaker.success();
      return { ok: true, value };
    } catch (e) {
      if (e === USER_ABORT) {
        if (breaker) this.breaker.abandon();
        throw user?.reason;
      }
      if (e === SKIPPED) return { ok: false, cause: new Error('circuit breaker open') };
      const rejected = this.unanswered(at, e, breaker);
      if (rejected === undefined) return { ok: false, cause: e };
      if (rejected.reply.startsWith('READONLY')) await this.conn.reconnect?.();
      throw rejected;
    } finally {
      this.endTurn(at);
    }
  }

  /**
   * What a call's error `e` says: a rejection of the call (Redis answered it: noted as an
   * answer, and for the breaker when `breaker`), or undefined for a failure of Redis, which the
   * breaker counts only if Redis has answered none of the client's calls since this one began (a
   * call that waited behind others that were answered is late, on a server that is there; it
   * still gets the policy's answer), and after which an expired call has the slots read again.
   */
  private unanswered(at: Attempt, e: unknown, breaker: boolean): RejectedError | undefined {
    if (e instanceof RedisReplyError && REJECTED.has(e.reply.split(' ', 1)[0] ?? '')) {
      this.answeredAt = performance.now();
      if (breaker) this.breaker.success();
      return new RejectedError(e.reply);
    }
    if (breaker && !(this.answeredAt > at.began)) this.breaker.failure();
    if (at.expired) this.rediscover(at.budgetMs);
    return undefined;
  }

  private fallback(key: string, a: Algorithm, cost: number, lease: string | undefined): Fallback {
    const [d, , g] = this.fallbackTake(key, a, costOf(cost), lease);
    return [d, g];
  }

  /** The failure policy's answer for one limit, with the units it grants. */
  private fallbackTake(key: string, a: Algorithm, take: Take, lease: string | undefined): [Decision, number, Degraded] {
    switch (this.policy) {
      case 'fail-open':
        return [{ allowed: true, remaining: limitOf(a), retryAfterMs: 0, resetAfterMs: 0, limit: limitOf(a) }, take.n, 'fail-open'];
      case 'fail-closed':
        return [
          {
            allowed: false,
            remaining: 0,
            retryAfterMs: this.failClosedRetryMs,
            resetAfterMs: this.failClosedRetryMs,
            limit: limitOf(a),
          },
          0,
          'fail-closed',
        ];
      case 'local': {
        if (a.kind === 'concurrency') {
          const d = this.leases.acquire(key, lease ?? '', a, this.instances, take.n > 0);
          return [d, d.allowed ? 1 : 0, 'local'];
        }
        if (take.upto) {
          const [d, g] = this.local.grant(key, a, this.instances, take.n);
          return [d, g, 'local'];
        }
        const d = this.local.check(key, a, this.instances, take.n);
        return [d, d.allowed ? take.n : 0, 'local'];
      }
    }
  }

  /**
   * Checks (and on admission consumes) `cost` units of `algorithm` on `key`. A concurrency limit
   * is only peeked at here (cost 0, through `RL.ALL`); its slots are taken with
   * {@link Client.acquire} ({@link UnsupportedError} for a cost above 0).
   */
  check(key: string, algorithm: Algorithm, cost = 1, call?: CallOptions): Promise<Outcome> {
    if (algorithm.kind !== 'concurrency' && !(cost > 0 && (this.batches !== undefined || this.denies !== undefined))) {
      // The plain check, without a promise of its own in between.
      try {
        checkCount('cost', cost);
      } catch (e) {
        return Promise.reject(e);
      }
      if (cost === 1 && call === undefined && this.modeValue === 'module' && this.connected && this.durable === undefined) {
        const fast = this.checkOne(key, algorithm);
        if (fast !== undefined) return fast;
      }
      return this.decideTake(key, algorithm, cost === 1 ? COST_ONE : costOf(cost), undefined, call);
    }
    return this.checkHot(key, algorithm, cost, call);
  }

  /**
   * {@link Client.decideTake} of a cost of 1 in the module's mode, for a caller without options,
   * when a place among the calls on their way is free: the same steps (the breaker, the deadline,
   * the place, the command, the answer or the failure policy) with one promise of the call's own
   * and the command's arguments copied from the algorithm's, made once. Undefined (nothing done)
   * when the call must take the general path.
   */
  private checkOne(key: string, a: Algorithm): Promise<Outcome> | undefined {
    if (this.rediscovering !== undefined || this.inFlight >= this.maxInFlight) return undefined;
    if (!this.breaker.permit()) return Promise.resolve(this.degradedOne(key, a));
    const at = new Attempt(this.sweep, this.timeoutMs, undefined);
    this.inFlight += 1;
    at.turn = true;
    const conn = this.conn;
    const args = commandOne(a);
    args[1] = key;
    let sent: Promise<Reply>;
    try {
      sent = conn.send(args, key, this.signalFor(at, conn));
    } catch (e) {
      sent = Promise.reject(e);
    }
    return at.watch(sent).then(
      (reply) => this.answeredOne(at, key, a, reply),
      (e: unknown) => this.failedOne(at, key, a, e),
    );
  }

  /** The answer of {@link Client.checkOne}'s command. */
  private answeredOne(at: Attempt, key: string, a: Algorithm, reply: Reply): Outcome | Promise<Outcome> {
    this.endTurn(at);
    let d: Decision;
    try {
      d = decision(reply);
    } catch (e) {
      return this.failedOne(at, key, a, e);
    }
    this.answeredAt = performance.now();
    this.breaker.success();
    return { decision: d, degraded: undefined, mode: 'module', granted: d.allowed ? 1 : 0 };
  }

  /** {@link Client.checkOne}'s call without an answer (or with an error): as guarded()'s. */
  private failedOne(at: Attempt, key: string, a: Algorithm, e: unknown): Outcome | Promise<Outcome> {
    // The command's own end gives the place back first; a call given up, after the breaker counts it.
    if (at.reason === undefined) this.endTurn(at);
    const rejected = this.unanswered(at, e, true);
    this.endTurn(at);
    if (rejected === undefined) return this.degradedOne(key, a);
    if (rejected.reply.startsWith('READONLY')) return Promise.resolve(this.conn.reconnect?.()).then(() => Promise.reject(rejected));
    return Promise.reject(rejected);
  }

  /** The failure policy's outcome for a cost of 1. */
  private degradedOne(key: string, a: Algorithm): Outcome {
    const [d, granted, degraded] = this.fallbackTake(key, a, COST_ONE, undefined);
    return { decision: d, degraded, mode: undefined, granted };
  }

  private async checkHot(key: string, algorithm: Algorithm, cost: number, call?: CallOptions): Promise<Outcome> {
    checkCount('cost', cost);
    if (algorithm.kind !== 'concurrency') return single(await this.decideHot([[key, algorithm]], cost, this.denies, call));
    const o = await this.checkAll([[key, algorithm]], cost, call);
    return single(o);
  }

  /**
   * A partial grant (`UPTO n`): as many units of `algorithm` on `key` as are left now, at least 1
   * and at most `n`, taken in one call; {@link Outcome.granted} says how many (0 when denied:
   * nothing was left, and the decision is the denial of one unit). Give back what goes unused
   * with {@link Client.settle} (a negative delta). `n` from 1 to 10^15 (1,000 for a sliding log);
   * not for a concurrency limit ({@link UnsupportedError}). Batches and the deny cache are not
   * used. When Redis cannot answer: `'fail-open'` grants `n` (nothing taken), `'fail-closed'`
   * denies, `'local'` grants what its in-process bucket has, at most `n`.
   */
  async checkUpto(key: string, algorithm: Algorithm, n: number, call?: CallOptions): Promise<Outcome> {
    checkCount('n', n);
    if (algorithm.kind === 'concurrency') throw new UnsupportedError('a concurrency limit is not granted in part (a lease is one slot)');
    if (n === 0) throw new UnsupportedError('UPTO n takes n of at least 1');
    return this.decideTake(key, algorithm, { upto: true, n }, undefined, call);
  }

  /**
   * A partial grant of several limits at once (`RL.ALL ... UPTO n`): every limit is granted the
   * same units, the fewest any of them has left, at most `n` ({@link MultiOutcome.granted}; 0
   * when denied, as a cost of 1 would be). One limit alone uses its own command. Concurrency
   * limits are refused ({@link UnsupportedError}).
   */
  async checkAllUpto(limits: readonly Limit[], n: number, call?: CallOptions): Promise<MultiOutcome> {
    checkCount('n', n);
    if (limits.some(([, a]) => a.kind === 'concurrency')) {
      throw new UnsupportedError('a concurrency limit is not granted in part (a lease is one slot)');
    }
    if (n === 0) throw new UnsupportedError('UPTO n takes n of at least 1');
    return this.decideAllTake(limits, { upto: true, n }, undefined, call);
  }

  /** @internal One limit: Redis, or the failure policy when Redis cannot answer. */
  decideOne(key: string, a: Algorithm, cost: number, lease: string | undefined, call?: CallOptions): Promise<Outcome> {
    return this.decideTake(key, a, costOf(cost), lease, call);
  }

  /** @internal One limit, a cost or a partial grant. */
  async decideTake(key: string, a: Algorithm, take: Take, lease: string | undefined, call?: CallOptions): Promise<Outcome> {
    const g = await this.guarded((at) => this.callOne(key, a, take, lease, at), call);
    if (g.ok) return { decision: g.value[0], degraded: undefined, mode: g.value[2], granted: g.value[1] };
    const [d, granted, degraded] = this.fallbackTake(key, a, take, lease);
    return { decision: d, degraded, mode: undefined, granted };
  }

  /**
   * Checks several limits at once: admitted only if every limit admits, and then `cost` is
   * consumed from all of them (`RL.ALL`, or `all.lua`); one limit alone goes through its own
   * command. Concurrency limits are only peeked at here (cost 0); their slots are taken with
   * {@link Client.acquireAll}.
   */
  async checkAll(limits: readonly Limit[], cost = 1, call?: CallOptions): Promise<MultiOutcome> {
    return this.checkAllWith(limits, cost, this.denies, call);
  }

  /** @internal {@link Client.checkAll} with the deny cache `denies` (the middleware's own, or none). */
  async checkAllWith(limits: readonly Limit[], cost: number, denies: DenyCache | undefined, call?: CallOptions): Promise<MultiOutcome> {
    checkCount('cost', cost);
    if (!limits.some(([, a]) => a.kind === 'concurrency')) {
      if (cost > 0 && limits.length >= 1 && limits.length <= 16 && (this.batches !== undefined || denies !== undefined)) {
        return this.decideHot(limits, cost, denies, call);
      }
      return this.decideAll(limits, cost, undefined, call);
    }
    if (cost > 0) throw new UnsupportedError('concurrency limits take a lease: Client.acquireAll');
    return this.decideAll(limits, 0, newLeaseId(), call);
  }

  /**
   * A check of a cost above 0 that a batch or the deny cache may answer: a batch holding the
   * units admits first (they are granted), then an unexpired denial of the same call is
   * repeated, then a hot key takes a new batch, else Redis decides (its denial remembered, what
   * remains noted for the next batch's size).
   */
  private async decideHot(limits: readonly Limit[], cost: number, denies: DenyCache | undefined, call?: CallOptions): Promise<MultiOutcome> {
    const sig = signature(limits);
    const batches = this.batches;
    let refill = false;
    if (batches !== undefined) {
      const step = batches.tryLocal(sig, limits, cost);
      if (typeof step === 'object') return step;
      refill = step === 'refill';
    }
    const cached = denies?.lookup(sig, cost);
    if (cached !== undefined) return cached;
    if (refill && batches !== undefined) {
      const o = await batches.refill(sig, limits, cost, denies);
      if (o !== undefined) return o;
      // The refill that came first may have been denied meanwhile.
      const again = denies?.lookup(sig, cost);
      if (again !== undefined) return again;
    }
    const sent = performance.now();
    const o = await this.decideAll(limits, cost, undefined, call);
    denies?.record(sig, cost, o, sent);
    batches?.observe(sig, o);
    return o;
  }

  /** A partial grant for a batch: undefined when Redis cannot answer. */
  private async tryGrant(limits: readonly Limit[], n: number): Promise<MultiOutcome | undefined> {
    const take: Take = { upto: true, n };
    const only = limits.length === 1 ? limits[0] : undefined;
    if (only !== undefined) {
      const g = await this.guarded((at) => this.callOne(only[0], only[1], take, undefined, at), undefined);
      if (!g.ok) return undefined;
      const [d, granted, mode] = g.value;
      return { allowed: d.allowed, deniedBy: d.allowed ? 0 : 1, decisions: [d], degraded: undefined, mode, granted };
    }
    const g = await this.guarded((at) => this.callAll(limits, take, undefined, at), undefined);
    if (!g.ok) return undefined;
    const [[allowed, deniedBy, ds, granted], mode] = g.value;
    return { allowed, deniedBy, decisions: ds, degraded: undefined, mode, granted };
  }

  /** The failure policy's answer for a cost, as a call to Redis that failed would get it. */
  private degradedFor(limits: readonly Limit[], cost: number): MultiOutcome {
    const only = limits.length === 1 ? limits[0] : undefined;
    if (only !== undefined) {
      const [d, granted, degraded] = this.fallbackTake(only[0], only[1], costOf(cost), undefined);
      return multiOf({ decision: d, degraded, mode: undefined, granted });
    }
    return this.degradedAll(limits, costOf(cost), undefined);
  }

  /** @internal Several limits in one call (one alone with its own command, but a concurrency peek). */
  decideAll(limits: readonly Limit[], cost: number, lease: string | undefined, call?: CallOptions): Promise<MultiOutcome> {
    return this.decideAllTake(limits, costOf(cost), lease, call);
  }

  /** @internal Several limits, a cost or a partial grant. */
  async decideAllTake(limits: readonly Limit[], take: Take, lease: string | undefined, call?: CallOptions): Promise<MultiOutcome> {
    const only = limits.length === 1 ? limits[0] : undefined;
    if (only && (take.n > 0 || only[1].kind !== 'concurrency')) {
      return multiOf(await this.decideTake(only[0], only[1], take, lease, call));
    }
    if (limits.length === 0 || limits.length > 16) throw new UnsupportedError('between 1 and 16 limits per call');
    const g = await this.guarded((at) => this.callAll(limits, take, lease, at), call);
    if (g.ok) {
      const [[allowed, deniedBy, ds, granted], mode] = g.value;
      return { allowed, deniedBy, decisions: ds, degraded: undefined, mode, granted };
    }
    return this.degradedAll(limits, take, lease);
  }

  /** @internal The failure policy's answer for several limits. */
  degradedAll(limits: readonly Limit[], take: Take, lease: string | undefined): MultiOutcome {
    let degraded = 'fail-open' as Degraded;
    // Peek first so that a denial consumes from none of the limits.
    const peeks = limits.map(([k, a]) => {
      const [d, g] = this.fallback(k, a, 0, lease);
      degraded = g;
      return d;
    });
    // A partial grant takes what the fewest left allow, at most n (as RL.ALL ... UPTO n).
    let cost = take.n;
    if (take.upto && degraded === 'local') cost = Math.max(Math.min(Math.min(...peeks.map((d) => d.remaining)), take.n), 1);
    const denier = peeks.findIndex((d, i) => {
      if (degraded === 'fail-closed') return true;
      // One slot whatever the cost; none taken by a peek.
      if (limits[i]![1].kind === 'concurrency') return cost > 0 && !d.allowed;
      return d.remaining < cost;
    });
    let ds: Decision[];
    if (denier >= 0) {
      ds = peeks;
      const [k, a] = limits[denier]!;
      ds[denier] = this.fallback(k, a, cost, lease)[0];
    } else {
      ds = limits.map(([k, a]) => this.fallback(k, a, cost, lease)[0]);
    }
    return { allowed: denier < 0, deniedBy: denier + 1, decisions: ds, degraded, mode: undefined, granted: denier < 0 ? cost : 0 };
  }

  /**
   * Gives back `id`'s slot of `key` (`RL.RELEASE`): whether a live lease was released; false too
   * when Redis cannot answer (the lease then expires by itself). Idempotent.
   */
  async release(key: string, id: string, call?: CallOptions): Promise<boolean> {
    const g = await this.guarded((at) => this.callRelease(key, id, at), call);
    return g.ok && g.value === 1;
  }

  /** @internal Frees `id`'s slot of `key` in the in-process semaphore of the `'local'` policy. */
  releaseLocal(key: string, id: string): boolean {
    return this.leases.release(key, id);
  }

  /**
   * Takes one of `limit.limit` slots of `key` for a new lease (`RL.ACQUIRE` with a fresh lease
   * id). Admitted: the outcome and the {@link Lease}, given back with `release()`, or at the end
   * of an `await using` block. Denied: the outcome alone, `retryAfterMs` until a lease expires.
   * When Redis cannot answer: `'fail-open'` admits with a lease that holds nothing,
   * `'fail-closed'` denies, `'local'` takes a slot of an in-process semaphore.
   */
  acquire(key: string, limit: Concurrency, call?: CallOptions): Promise<LeaseOutcome> {
    return this.acquireAs(key, limit, newLeaseId(), call);
  }

  /**
   * {@link Client.acquire} with the caller's lease id (1 to 128 bytes, unique to the holder, such
   * as a job id): a live lease of that id is renewed instead of taking a second slot.
   */
  async acquireAs(key: string, limit: Concurrency, id: string, call?: CallOptions): Promise<LeaseOutcome> {
    const outcome = await this.decideOne(key, limit, 1, id, call);
    const lease = outcome.decision.allowed ? new Lease(this, id, [[key, limit]], outcome.degraded) : undefined;
    return { outcome, lease };
  }

  /**
   * Several limits at once, concurrency limits among them (`RL.ALL ... LEASE id COST cost`):
   * admitted only if every limit admits; then `cost` is consumed from the others and one slot of
   * each concurrency limit is held by the returned lease. Cost 0 peeks and takes no slot.
   */
  async acquireAll(limits: readonly Limit[], cost = 1, call?: CallOptions): Promise<MultiLeaseOutcome> {
    checkCount('cost', cost);
    const held = limits.filter((l): l is readonly [string, Concurrency] => l[1].kind === 'concurrency');
    if (held.length === 0) return { outcome: await this.decideAll(limits, cost, undefined, call), lease: undefined };
    const id = newLeaseId();
    const outcome = await this.decideAll(limits, cost, id, call);
    const lease = outcome.allowed && cost > 0 ? new Lease(this, id, held, outcome.degraded) : undefined;
    return { outcome, lease };
  }

  /**
   * Runs `fn` while holding a slot of `key`, and gives it back when `fn` settles (`try/finally`,
   * where `await using` is not available). Denied: `fn` does not run and `result` is undefined.
   */
  async withLease<T>(key: string, limit: Concurrency, fn: (lease: Lease) => T | Promise<T>, call?: CallOptions): Promise<{ outcome: Outcome; result: T | undefined }> {
    const { outcome, lease } = await this.acquire(key, limit, call);
    if (!lease) return { outcome, result: undefined };
    try {
      return { outcome, result: await fn(lease) };
    } finally {
      await lease.release().catch(() => false);
    }
  }

  /**
   * Checks and on admission consumes `estimate` units, for work whose true cost is known only
   * afterwards. Admitted: the outcome and the {@link Reservation}, whose `settle(actual)`
   * refunds or charges the difference; left unsettled, the estimate stays charged.
   */
  async reserve(key: string, algorithm: Algorithm, estimate: number, call?: CallOptions): Promise<ReservationOutcome> {
    checkCount('estimate', estimate);
    if (algorithm.kind === 'concurrency') throw new UnsupportedError('concurrency limits are not settled: Client.acquire');
    const outcome = await this.decideOne(key, algorithm, estimate, undefined, call);
    const reservation = outcome.decision.allowed ? new Reservation(this, [[key, algorithm]], estimate, outcome.degraded) : undefined;
    return { outcome, reservation };
  }

  /** {@link Client.reserve} over several limits at once, settled together in one call. */
  async reserveAll(limits: readonly Limit[], estimate: number, call?: CallOptions): Promise<MultiReservationOutcome> {
    checkCount('estimate', estimate);
    if (limits.some(([, a]) => a.kind === 'concurrency')) {
      throw new UnsupportedError('concurrency limits are not settled: Client.acquireAll');
    }
    const outcome = await this.decideAll(limits, estimate, undefined, call);
    const reservation = outcome.allowed ? new Reservation(this, [...limits], estimate, outcome.degraded) : undefined;
    return { outcome, reservation };
  }

  /**
   * Adjusts what was consumed from every limit by `delta` units in one call (`RL.SETTLE ...
   * DELTA delta`): below 0 gives `-delta` back (never above the limit), above 0 takes `delta`
   * more without asking whether it is left (a limit may go into debt, and then denies until it is
   * paid back), 0 only reports. When Redis cannot answer nothing is adjusted, and the decisions
   * are the failure policy's for a cost of 0.
   */
  async settle(limits: readonly Limit[], delta: number, call?: CallOptions): Promise<Settlement> {
    if (!Number.isSafeInteger(delta)) throw new RangeError(`delta must be a safe integer, not ${delta}`);
    if (limits.some(([, a]) => a.kind === 'concurrency')) throw new UnsupportedError('concurrency limits are not settled');
    if (limits.length === 0 || limits.length > 16) throw new UnsupportedError('between 1 and 16 limits per call');
    const g = await this.guarded((at) => this.callSettle(limits, delta, at), call);
    if (g.ok) return { decisions: g.value[0], degraded: undefined, mode: g.value[1] };
    let degraded: Degraded = 'fail-open';
    const ds = limits.map(([k, a]) => {
      const [d, g2] = this.fallback(k, a, 0, undefined);
      degraded = g2;
      return d;
    });
    return { decisions: ds, degraded, mode: undefined };
  }

  /**
   * @internal Settles where a reservation was charged: Redis (undefined), the in-process buckets
   * of the `'local'` policy, or nowhere (admitted by `'fail-open'`: nothing is sent).
   */
  async settleCharged(limits: readonly Limit[], delta: number, charged: Degraded | undefined, call?: CallOptions): Promise<Settlement> {
    if (charged === undefined) return this.settle(limits, delta, call);
    if (charged === 'local' && this.policy === 'local') {
      return {
        decisions: limits.map(([k, a]) => this.local.adjust(k, a, this.instances, delta)),
        degraded: 'local',
        mode: undefined,
      };
    }
    return { decisions: limits.map(([k, a]) => this.fallback(k, a, 0, undefined)[0]), degraded: charged, mode: undefined };
  }

  /**
   * The `count` keys with the most denials on the server, most first (`RL.TOP count`, count from
   * 1 to 100,000), as the module counts them. Only the module keeps this list:
   * {@link UnsupportedError} in the other modes. An operator's call, outside the `ratelimit` ACL
   * category ({@link RejectedError} `NOPERM` for an application's user). No failure policy:
   * {@link UnavailableError} when Redis does not answer. Each server counts its own keys.
   */
  async top(count: number, call?: CallOptions): Promise<TopEntry[]> {
    return this.callTop(count, call);
  }

  /** Clears the list of {@link Client.top} (`RL.TOP RESET`). */
  async resetTop(call?: CallOptions): Promise<void> {
    await this.callTop(undefined, call);
  }

  private async callTop(count: number | undefined, call?: CallOptions): Promise<TopEntry[]> {
    const g = await this.guarded(async (at) => {
      const mode = await this.resolveMode(at);
      if (mode !== 'module') return undefined;
      const reply = await this.conn.send(['RL.TOP', count === undefined ? 'RESET' : plainNumber(count)], undefined, this.signalFor(at, this.conn));
      return count === undefined ? [] : topEntries(reply);
    }, call);
    if (!g.ok) throw new UnavailableError(g.cause);
    if (g.value === undefined) throw new UnsupportedError('the most-denied keys are counted by the module only (RL.TOP)');
    return g.value;
  }

  /**
   * @internal Any command, routed by `key` on a cluster, under the timeout and the breaker:
   * {@link RejectedError} for a refusal, {@link UnavailableError} when Redis does not answer.
   */
  async sendRaw(args: readonly string[], key: string | undefined, call?: CallOptions): Promise<Reply> {
    const g = await this.guarded(async (at) => {
      await this.connection(at);
      return this.conn.send(args, key, this.signalFor(at, this.conn));
    }, call);
    if (!g.ok) throw new UnavailableError(g.cause);
    return g.value;
  }

  /** A {@link Limiter}: this client bound to one algorithm. */
  limiter(algorithm: Algorithm): Limiter {
    return new Limiter(this, algorithm);
  }
}

/** A {@link Client} bound to one algorithm and its parameters. */
export class Limiter {
  constructor(
    readonly client: Client,
    readonly algorithm: Algorithm,
  ) {}

  /** One unit. */
  check(key: string, call?: CallOptions): Promise<Outcome> {
    return this.client.check(key, this.algorithm, 1, call);
  }

  checkCost(key: string, cost: number, call?: CallOptions): Promise<Outcome> {
    return this.client.check(key, this.algorithm, cost, call);
  }

  /** The current state, consuming nothing (cost 0). */
  peek(key: string, call?: CallOptions): Promise<Outcome> {
    return this.client.check(key, this.algorithm, 0, call);
  }

  /** A slot of the limiter's concurrency limit ({@link UnsupportedError} for the other algorithms). */
  acquire(key: string, call?: CallOptions): Promise<LeaseOutcome> {
    if (this.algorithm.kind !== 'concurrency') return Promise.reject(new UnsupportedError('acquire takes a concurrency limit'));
    return this.client.acquire(key, this.algorithm, call);
  }

  /** Reserves `estimate` units, settled later with the true cost (see {@link Client.reserve}). */
  reserve(key: string, estimate: number, call?: CallOptions): Promise<ReservationOutcome> {
    return this.client.reserve(key, this.algorithm, estimate, call);
  }
}
