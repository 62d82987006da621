/**
 * What every part of the client shares: decisions and outcomes, modes, options, failure
 * policies and errors.
 */

declare global {
  /**
   * The platform's `AbortSignal`, which Node's types and the DOM's declare. Named here, empty, so
   * that the declarations also compile in a program that loads neither (this adds nothing to
   * theirs).
   */
  interface AbortSignal {}
}

/** One limit's answer: the five fields every `RL.*` command replies. */
export interface Decision {
  readonly allowed: boolean;
  /** Whole units left (0 while in debt). */
  readonly remaining: number;
  /** 0 when allowed; -1 when the cost can never be admitted. */
  readonly retryAfterMs: number;
  readonly resetAfterMs: number;
  readonly limit: number;
}

/**
 * How decisions are made on the server: the module's `RL.*` commands, `FCALL` of the
 * `ratelimit` Functions library, or `EVALSHA` of the `lua-reference/` scripts.
 */
export type Mode = 'module' | 'function' | 'script';

/** Set on an answer that did not come from Redis: which failure policy gave it. */
export type Degraded = 'fail-open' | 'fail-closed' | 'local';

/**
 * What to answer when Redis cannot (timeout, connection error, breaker open, `LOADING`,
 * `CLUSTERDOWN`...): admit everything, deny everything, or decide in process with the limit and
 * rate divided by `instances` (a token bucket per key; a counting semaphore per key for a
 * concurrency limit).
 */
export type FailurePolicy = 'fail-open' | 'fail-closed' | 'local';

export interface BreakerOptions {
  /** Consecutive failures that open the breaker (default 3, at least 1). */
  failures?: number;
  /** How long calls skip Redis once it is open (default 1000 ms). */
  cooldownMs?: number;
}

export interface ClientOptions {
  /**
   * Budget of one call: how long Redis may leave it unanswered before the failure policy answers
   * (default 100 ms). The client's start-up (the connection being made, the mode's detection, a
   * script's load) is not counted in it: it has deadlines of its own, 10 times this budget.
   */
  timeoutMs?: number;
  /** Default `'fail-open'`. */
  policy?: FailurePolicy;
  /** Instances sharing the limits, for the `'local'` policy (default 1). */
  instances?: number;
  breaker?: BreakerOptions;
  /** `'auto'` (default): the module, else the Functions library, else the scripts. */
  mode?: 'auto' | Mode;
  /** `retryAfterMs` of the `'fail-closed'` policy's denials (default 1000). */
  failClosedRetryMs?: number;
  /**
   * The most calls of the client with a command on its way to Redis at once (default: no bound;
   * at least 1); the others wait for a place, in order, outside their deadlines.
   */
  maxInFlight?: number;
}

/** What a durable client does with an admission fewer replicas acknowledged than it asked. */
export type ShortAck =
  /** Deny it (the units stay spent on the master: under-admission, never over). */
  | 'deny'
  /** Admit it, and count it in `durabilityStats().short`. */
  | 'admit'
  /** Answer it with the failure policy, as if Redis had not answered. */
  | 'failure-policy';

/**
 * A durable client's admissions ({@link Client.withDurability}): each admitting write is
 * acknowledged by `replicas` replicas (`WAIT replicas timeout` on a connection of its own, after
 * the call) before it admits.
 */
export interface Durability {
  /** Replicas that must acknowledge the write (at least 1). */
  replicas: number;
  /** How long `WAIT` waits for them, in ms (below the client's own timeout, which bounds the call and the `WAIT` together). */
  timeoutMs: number;
  /** What an admission that fewer replicas acknowledged becomes (default `'deny'`). */
  short?: ShortAck;
  /**
   * Whether the replicas must have the write in their append-only file too (`WAITAOF 0 replicas
   * timeout`: fsynced, so a replica that restarts keeps it). Replicas without `appendonly yes`
   * never acknowledge it. A server without `WAITAOF` (before Redis 7.2) gets `WAIT`.
   */
  aof?: boolean;
  /**
   * Opens one more connection of the durable lane, ready, to the same server as the client's
   * (a node-redis client or cluster, an ioredis `Redis` or `Cluster`, or any `Connection`):
   * `WAIT` holds the connection it is sent on, so each durable call takes one of its own.
   */
  connect: () => Promise<unknown>;
  /** Closes a connection of the lane that is no longer kept (one that failed, one too many, or all of them on `close`). */
  close?: (connection: unknown) => void | Promise<void>;
}

/** What a durable client's admissions met so far. */
export interface DurabilityStats {
  /** Admissions acknowledged by enough replicas. */
  acknowledged: number;
  /** Admissions fewer replicas acknowledged in time (then answered as `short` says). */
  short: number;
}

/** Per-call options. */
export interface CallOptions {
  /**
   * Gives up the call when aborted: the promise rejects with the signal's reason, and no
   * failure policy answers (the caller no longer wants one).
   */
  signal?: AbortSignal;
  /** This call's budget instead of the client's `timeoutMs`. */
  timeoutMs?: number;
}

/**
 * How the client answered without calling Redis: from units a partial grant took earlier for
 * the key (a leased batch), or by repeating an earlier denial within its `retryAfterMs` (the deny
 * cache). Also the metrics' outcome label.
 */
export type LocalAnswer = 'batch' | 'deny_cache';

/** The answer for one limit. */
export interface Outcome {
  readonly decision: Decision;
  /** Set when Redis was not asked or did not answer in time. */
  readonly degraded: Degraded | undefined;
  /**
   * The mode that answered (undefined when degraded; for a local answer, the mode of the call it
   * comes from).
   */
  readonly mode: Mode | undefined;
  /**
   * The units taken: the cost when admitted and 0 when denied; for a partial grant
   * ({@link Client.checkUpto}) the units granted, 1 to `n`. An answer of `'fail-open'` grants
   * what was asked (nothing is taken anywhere).
   */
  readonly granted: number;
  /** Set when the client answered from a batch or its deny cache, without calling Redis. */
  readonly answeredLocally?: LocalAnswer | undefined;
}

/** The answer for several limits checked at once (`RL.ALL`). */
export interface MultiOutcome {
  readonly allowed: boolean;
  /** 1-based position of the first limit that denied, 0 when allowed. */
  readonly deniedBy: number;
  readonly decisions: readonly Decision[];
  readonly degraded: Degraded | undefined;
  readonly mode: Mode | undefined;
  /** The units taken from every limit (see {@link Outcome.granted}). */
  readonly granted: number;
  /** Set when the client answered from a batch or its deny cache, without calling Redis. */
  readonly answeredLocally?: LocalAnswer | undefined;
}

/** The state of every limit after a settlement (`RL.SETTLE`), in the order of the limits. */
export interface Settlement {
  /** One per limit: `allowed` true, `retryAfterMs` 0, `remaining` 0 while in debt. */
  readonly decisions: readonly Decision[];
  /** Set when Redis was not asked or did not answer: the decisions are the failure policy's. */
  readonly degraded: Degraded | undefined;
  readonly mode: Mode | undefined;
}

/** One of the keys with the most denials on a server (`RL.TOP`), as the module counts them. */
export interface TopEntry {
  readonly key: string;
  /** Denials counted: at least `denied - error`, at most `denied`. */
  readonly denied: number;
  /** The most by which `denied` may overcount. */
  readonly error: number;
  /** The command of the latest denial (`RL.TOKENBUCKET`, `RL.ALL`). */
  readonly command: string;
  /** When the key's slot was taken, and its latest denial (Unix ms, by the module's clock). */
  readonly firstDeniedMs: number;
  readonly lastDeniedMs: number;
}

/** Every error of this package. */
export class RateLimitError extends Error {
  override name = 'RateLimitError';
}

/**
 * Redis answered with an error about the call itself (bad parameters, `WRONGTYPE`,
 * `CROSSSLOT`), or a refusal that asking again cannot fix and that failing open would hide:
 * `NOPERM`, `NOAUTH`, `WRONGPASS`, `OOM`, `READONLY`. Never answered by a failure policy.
 */
export class RejectedError extends RateLimitError {
  override name = 'RejectedError';
  /** Redis's error as it came (`ERR capacity must be between 1 and 1000000000000000`). */
  readonly reply: string;
  /** Its first word (`ERR`, `NOPERM`, `OOM`). */
  readonly code: string;
  constructor(reply: string) {
    super(`rejected by redis: ${reply}`);
    this.reply = reply;
    this.code = reply.split(' ', 1)[0] ?? '';
  }
}

/** The call cannot be made: the combination cannot be checked in one call, or the mode cannot answer it. */
export class UnsupportedError extends RateLimitError {
  override name = 'UnsupportedError';
  constructor(what: string) {
    super(`unsupported: ${what}`);
  }
}

/** Redis did not answer, for a call that no failure policy answers (`Client.top`). */
export class UnavailableError extends RateLimitError {
  override name = 'UnavailableError';
  constructor(cause?: unknown) {
    super('redis did not answer', cause === undefined ? undefined : { cause });
  }
}
