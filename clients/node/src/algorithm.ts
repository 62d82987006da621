/**
 * The algorithms of the module and their parameters, as the `RL.*` commands take them.
 */

/** `RL.TOKENBUCKET key capacity refill_per_sec`: bursts up to `capacity`, refilled continuously. */
export interface TokenBucket {
  readonly kind: 'token_bucket';
  readonly capacity: number;
  readonly refillPerSec: number;
}

/** `RL.LEAKYBUCKET key capacity leak_per_sec`: a queue of `capacity` draining at a steady rate. */
export interface LeakyBucket {
  readonly kind: 'leaky_bucket';
  readonly capacity: number;
  readonly leakPerSec: number;
}

/** `RL.FIXEDWINDOW key limit window_sec`: `limit` per window, opened by the first call. */
export interface FixedWindow {
  readonly kind: 'fixed_window';
  readonly limit: number;
  readonly windowSec: number;
}

/** `RL.SLIDINGWINDOW key limit window_sec`: `limit` per rolling window, weighted from the previous one. */
export interface SlidingWindow {
  readonly kind: 'sliding_window';
  readonly limit: number;
  readonly windowSec: number;
}

/** `RL.SLIDINGLOG key limit window_sec`: exactly `limit` in any window (one entry per unit). */
export interface SlidingLog {
  readonly kind: 'sliding_log';
  readonly limit: number;
  readonly windowSec: number;
}

/** `RL.GCRA key max_burst count_per_period period_sec`: evenly spaced, `maxBurst + 1` at once. */
export interface Gcra {
  readonly kind: 'gcra';
  readonly maxBurst: number;
  readonly countPerPeriod: number;
  readonly periodSec: number;
}

/**
 * `RL.ACQUIRE key limit lease_sec lease_id`: at most `limit` leases held at once on a key, each
 * for `leaseSec` seconds unless renewed or released first (`CONCURRENCY limit lease_sec` inside
 * `RL.ALL`, where it takes one slot whatever the cost).
 */
export interface Concurrency {
  readonly kind: 'concurrency';
  readonly limit: number;
  readonly leaseSec: number;
}

export type Algorithm =
  | TokenBucket
  | LeakyBucket
  | FixedWindow
  | SlidingWindow
  | SlidingLog
  | Gcra
  | Concurrency;

/** A limit of a call over several limits: its key and its algorithm. */
export type Limit = readonly [key: string, algorithm: Algorithm];

export function tokenBucket(capacity: number, refillPerSec: number): TokenBucket {
  return Object.freeze({ kind: 'token_bucket', capacity, refillPerSec });
}

export function leakyBucket(capacity: number, leakPerSec: number): LeakyBucket {
  return Object.freeze({ kind: 'leaky_bucket', capacity, leakPerSec });
}

export function fixedWindow(limit: number, windowSec: number): FixedWindow {
  return Object.freeze({ kind: 'fixed_window', limit, windowSec });
}

export function slidingWindow(limit: number, windowSec: number): SlidingWindow {
  return Object.freeze({ kind: 'sliding_window', limit, windowSec });
}

export function slidingLog(limit: number, windowSec: number): SlidingLog {
  return Object.freeze({ kind: 'sliding_log', limit, windowSec });
}

export function gcra(maxBurst: number, countPerPeriod: number, periodSec: number): Gcra {
  return Object.freeze({ kind: 'gcra', maxBurst, countPerPeriod, periodSec });
}

export function concurrency(limit: number, leaseSec: number): Concurrency {
  return Object.freeze({ kind: 'concurrency', limit, leaseSec });
}

/**
 * A number in plain decimal notation, as the module reads it: the shortest digits that give
 * back the same double (JavaScript's own), with the exponent written out (`1e-7` is
 * `0.0000001`, `1e21` is `1000000000000000000000`).
 */
export function plainNumber(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  const negative = v < 0;
  const s = String(Math.abs(v));
  const e = s.indexOf('e');
  if (e < 0) return (negative ? '-' : '') + s;
  const mantissa = s.slice(0, e);
  const exponent = Number(s.slice(e + 1));
  const dot = mantissa.indexOf('.');
  const digits = dot < 0 ? mantissa : mantissa.slice(0, dot) + mantissa.slice(dot + 1);
  const point = (dot < 0 ? mantissa.length : dot) + exponent;
  let out: string;
  if (point <= 0) out = '0.' + '0'.repeat(-point) + digits;
  else if (point >= digits.length) out = digits + '0'.repeat(point - digits.length);
  else out = digits.slice(0, point) + '.' + digits.slice(point);
  return (negative ? '-' : '') + out;
}

const COMMANDS: Record<Algorithm['kind'], string> = {
  token_bucket: 'RL.TOKENBUCKET',
  leaky_bucket: 'RL.LEAKYBUCKET',
  fixed_window: 'RL.FIXEDWINDOW',
  sliding_window: 'RL.SLIDINGWINDOW',
  sliding_log: 'RL.SLIDINGLOG',
  gcra: 'RL.GCRA',
  concurrency: 'RL.ACQUIRE',
};

/** The command name (`RL.TOKENBUCKET`; `RL.ACQUIRE` for a concurrency limit). */
export function commandOf(a: Algorithm): string {
  return COMMANDS[a.kind];
}

/** The keyword inside `RL.ALL` and `RL.SETTLE` (`TOKENBUCKET`, `CONCURRENCY`). */
export function keywordOf(a: Algorithm): string {
  return a.kind === 'concurrency' ? 'CONCURRENCY' : COMMANDS[a.kind].slice(3);
}

/** The parameters of the algorithms made by this module's functions (frozen), formatted once. */
const PARAMS = new WeakMap<Algorithm, readonly string[]>();

/**
 * The parameters after the key, formatted once for an algorithm made by {@link tokenBucket} and
 * the others (they cannot change); each time for any other object.
 */
export function preparedParams(a: Algorithm): readonly string[] {
  let p = PARAMS.get(a);
  if (p === undefined) {
    p = paramsOf(a);
    if (Object.isFrozen(a)) PARAMS.set(a, p);
  }
  return p;
}

/** The parameters after the key, without the cost (or the lease id). */
export function paramsOf(a: Algorithm): string[] {
  switch (a.kind) {
    case 'token_bucket':
      return [plainNumber(a.capacity), plainNumber(a.refillPerSec)];
    case 'leaky_bucket':
      return [plainNumber(a.capacity), plainNumber(a.leakPerSec)];
    case 'fixed_window':
    case 'sliding_window':
    case 'sliding_log':
      return [plainNumber(a.limit), plainNumber(a.windowSec)];
    case 'gcra':
      return [plainNumber(a.maxBurst), plainNumber(a.countPerPeriod), plainNumber(a.periodSec)];
    case 'concurrency':
      return [plainNumber(a.limit), plainNumber(a.leaseSec)];
  }
}

/** The limit the commands report (field 5): `maxBurst + 1` for GCRA. */
export function limitOf(a: Algorithm): number {
  switch (a.kind) {
    case 'token_bucket':
    case 'leaky_bucket':
      return a.capacity;
    case 'gcra':
      return a.maxBurst + 1;
    default:
      return a.limit;
  }
}

/** The sustained rate in units per second (a concurrency limit: every slot once per lease). */
export function ratePerSec(a: Algorithm): number {
  switch (a.kind) {
    case 'token_bucket':
      return a.refillPerSec;
    case 'leaky_bucket':
      return a.leakPerSec;
    case 'gcra':
      return a.countPerPeriod / a.periodSec;
    case 'concurrency':
      return a.limit / a.leaseSec;
    default:
      return a.limit / a.windowSec;
  }
}

/**
 * The policy's window in whole seconds (rounded up, at least 1): the window of the window
 * algorithms, the lease of a concurrency limit, the time from empty to full for the others.
 */
export function windowSecs(a: Algorithm): number {
  let w: number;
  switch (a.kind) {
    case 'fixed_window':
    case 'sliding_window':
    case 'sliding_log':
      w = a.windowSec;
      break;
    case 'concurrency':
      w = a.leaseSec;
      break;
    default:
      w = limitOf(a) / ratePerSec(a);
  }
  return Math.max(Math.ceil(w), 1);
}

/**
 * The identity of a call's limits, in their order: each key, the algorithm's keyword and its
 * parameters. The entries of the deny cache and of the batches are keyed by it.
 */
export function signature(limits: readonly Limit[]): string {
  let s = '';
  for (const [k, a] of limits) s += `${k.length}:${k} ${keywordOf(a)} ${paramsOf(a).join(' ')}\n`;
  return s;
}
