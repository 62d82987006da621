/**
 * A store for express-rate-limit (its `Store` interface) backed by the module's
 * `RL.FIXEDWINDOW` (or an algorithm of your choice), with the same options as rate-limit-redis:
 * replacing `new RedisStore({ sendCommand })` by `new RateLimitStore({ sendCommand })` is the
 * whole switch.
 */

import { type Algorithm, type Limit, fixedWindow, limitOf } from './algorithm.js';
import { Client } from './client.js';
import {
  type SendCommandClusterFn,
  type SendCommandFn,
  fromSendCommand,
  fromSendCommandCluster,
} from './connection.js';
import { type ClientOptions, UnsupportedError } from './types.js';

/** What the store reads of express-rate-limit's options (its `init(options)`). */
export interface StoreInitOptions {
  windowMs: number;
  limit: number | ((...args: never[]) => unknown);
  skipFailedRequests?: boolean;
  skipSuccessfulRequests?: boolean;
}

/** express-rate-limit's `ClientRateLimitInfo`. */
export interface ClientRateLimitInfo {
  totalHits: number;
  resetTime: Date | undefined;
}

export interface RateLimitStoreOptions {
  /** rate-limit-redis's option: `(...args) => client.sendCommand(args)` (node-redis) or `client.call(...args)` (ioredis). */
  sendCommand?: SendCommandFn;
  /** rate-limit-redis's option for a cluster: `({ key, isReadOnly, command }) => ...`. */
  sendCommandCluster?: SendCommandClusterFn;
  /** A client of this package instead (its failure policy, timeout and breaker apply). */
  client?: Client;
  /** Options of the client made from `sendCommand` (default: the client's defaults). */
  clientOptions?: ClientOptions;
  /** Prefix of the Redis keys (default `rl:store:`). */
  prefix?: string;
  /**
   * The algorithm of every key (default: `RL.FIXEDWINDOW` with express-rate-limit's `limit` and
   * `windowMs`): an algorithm, or a function of those two options. express-rate-limit compares
   * `totalHits` with its own `limit`: give it the algorithm's limit (`maxBurst + 1` for GCRA).
   */
  algorithm?: Algorithm | ((options: { limit: number; windowMs: number }) => Algorithm);
}

/** A limit the module never reaches: with a per-request `limit`, the store only counts. */
const COUNTER_LIMIT = 1e15;

/**
 * express-rate-limit's `Store` on the module. `increment` is one `RL.FIXEDWINDOW` call: an
 * admitted request reports `limit - remaining` hits, a denied one `limit + 1` (the module
 * writes nothing for a denial; when express-rate-limit may `decrement` it, that is with
 * `skipFailedRequests` or `skipSuccessfulRequests`, the denial is counted with `RL.SETTLE` so
 * that every decrement gives back a hit that was taken). With a `limit` that is a function of
 * the request, the store counts every hit (as rate-limit-redis does) and express-rate-limit
 * decides.
 */
export class RateLimitStore {
  /** Keys of one store are seen by every instance sharing the Redis: false. */
  readonly localKeys = false;
  readonly prefix: string;
  readonly client: Client;
  private readonly choice: RateLimitStoreOptions['algorithm'];
  private algorithm: Algorithm | undefined;
  private limit = 0;
  private countDenied = false;

  constructor(options: RateLimitStoreOptions) {
    const given = [options.sendCommand, options.sendCommandCluster, options.client].filter((x) => x !== undefined);
    if (given.length !== 1) throw new TypeError('RateLimitStore: give one of sendCommand, sendCommandCluster or client');
    if (options.client) this.client = options.client;
    else if (options.sendCommand) this.client = new Client(fromSendCommand(options.sendCommand), options.clientOptions);
    else this.client = new Client(fromSendCommandCluster(options.sendCommandCluster!), options.clientOptions);
    this.prefix = options.prefix ?? 'rl:store:';
    this.choice = options.algorithm;
  }

  /** Called by express-rate-limit with its options. */
  init(options: StoreInitOptions): void {
    const counting = typeof options.limit !== 'number';
    const limit = typeof options.limit === 'number' ? options.limit : COUNTER_LIMIT;
    const a =
      typeof this.choice === 'function'
        ? this.choice({ limit, windowMs: options.windowMs })
        : (this.choice ?? fixedWindow(limit, options.windowMs / 1000));
    if (a.kind === 'concurrency') throw new UnsupportedError('a concurrency limit counts leases, not hits');
    this.algorithm = a;
    this.limit = counting && this.choice === undefined ? COUNTER_LIMIT : limitOf(a);
    this.countDenied = Boolean(options.skipFailedRequests || options.skipSuccessfulRequests);
  }

  private limitFor(key: string): Limit {
    if (!this.algorithm) throw new Error('RateLimitStore: init was not called (pass the store to express-rate-limit)');
    return [this.prefix + key, this.algorithm];
  }

  /** Counts a hit: `totalHits` and when the key is back to zero. */
  async increment(key: string): Promise<ClientRateLimitInfo> {
    const limit = this.limitFor(key);
    const o = await this.client.check(limit[0], limit[1], 1);
    const d = o.decision;
    let totalHits: number;
    if (d.allowed) totalHits = Math.max(this.limit - d.remaining, 1);
    else {
      if (this.countDenied && o.degraded === undefined) await this.client.settle([limit], 1);
      totalHits = this.limit + 1;
    }
    return { totalHits, resetTime: new Date(Date.now() + d.resetAfterMs) };
  }

  /** Gives one hit back (`RL.SETTLE ... DELTA -1`). */
  async decrement(key: string): Promise<void> {
    await this.client.settle([this.limitFor(key)], -1);
  }

  /** The hits of a key without counting one (a peek); undefined when it has none. */
  async get(key: string): Promise<ClientRateLimitInfo | undefined> {
    const limit = this.limitFor(key);
    const d = (await this.client.check(limit[0], limit[1], 0)).decision;
    if (d.resetAfterMs === 0 && d.remaining >= this.limit) return undefined;
    return { totalHits: Math.max(this.limit - d.remaining, 0), resetTime: new Date(Date.now() + d.resetAfterMs) };
  }

  /** Forgets a key (`DEL`). */
  async resetKey(key: string): Promise<void> {
    const k = this.prefix + key;
    await this.client.sendRaw(['DEL', k], k);
  }
}
