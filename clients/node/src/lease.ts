/// <reference lib="esnext.disposable" preserve="true" />
/**
 * Concurrency leases: the handle that holds a slot, renews it and gives it back.
 */

import type { Concurrency } from './algorithm.js';
import type { CallOptions, Degraded, Outcome } from './types.js';

/**
 * @internal What a lease needs of the client that made it (the client is one): a concurrency
 * decision under the lease's id, and the slot given back on Redis or in process.
 */
export interface LeaseHolder {
  decideOne(key: string, limit: Concurrency, cost: number, lease: string, call?: CallOptions): Promise<Outcome>;
  releaseLocal(key: string, id: string): boolean;
  release(key: string, id: string, call?: CallOptions): Promise<boolean>;
}

/**
 * A slot held on one key (or one on each concurrency limit of `Client.acquireAll`) under one
 * lease id, until the lease expires or is given back: `release()`, or the end of an
 * `await using` block (`Symbol.asyncDispose`). Where `await using` is not available,
 * `Client.withLease` runs a function and releases in `finally`.
 */
export class Lease implements AsyncDisposable {
  private redis: boolean;
  private local: boolean;
  private released = false;
  private renewal: Outcome | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** The renewals on their way (`renew()`, a keep-alive tick): a release waits for them. */
  private readonly renewing = new Set<Promise<Outcome>>();

  /** @internal */
  constructor(
    private readonly client: LeaseHolder,
    /** The lease id (the sorted set's member). */
    readonly id: string,
    /** The keys and limits it holds a slot of. */
    readonly limits: ReadonlyArray<readonly [string, Concurrency]>,
    degraded: Degraded | undefined,
  ) {
    this.redis = degraded === undefined;
    this.local = degraded === 'local';
  }

  /** The key the slot is held on (the first, for a lease over several keys). */
  get key(): string {
    return this.limits[0]![0];
  }

  /**
   * Whether a slot is held anywhere (false for a lease admitted by `'fail-open'` and not renewed
   * on Redis since, and once released).
   */
  get holdsSlot(): boolean {
    return (this.redis || this.local) && !this.released;
  }

  /** The outcome of the latest renewal (`renew()` or `keepAlive()`). */
  get lastRenewal(): Outcome | undefined {
    return this.renewal;
  }

  /**
   * Extends the lease to now + `leaseSec` by sending `RL.ACQUIRE` again with the same id. A
   * lease that had expired takes a slot again if one is free; denied means the slot is lost.
   * Over several keys: the first denial, else the key with the fewest free slots. The failure
   * policy answers as for `Client.acquire`.
   */
  renew(call?: CallOptions): Promise<Outcome> {
    const p = this.renewOnce(call);
    this.renewing.add(p);
    const done = (): void => {
      this.renewing.delete(p);
    };
    p.then(done, done);
    return p;
  }

  private async renewOnce(call?: CallOptions): Promise<Outcome> {
    let answer: Outcome | undefined;
    for (const [key, limit] of this.limits) {
      const o = await this.client.decideOne(key, limit, 1, this.id, call);
      if (o.decision.allowed) {
        if (o.degraded === undefined) this.redis = true;
        else if (o.degraded === 'local') this.local = true;
      }
      if (
        answer === undefined ||
        (answer.decision.allowed && (!o.decision.allowed || o.decision.remaining < answer.decision.remaining))
      ) {
        answer = o;
      }
    }
    this.renewal = answer!;
    return answer!;
  }

  /**
   * Renews every `everyMs` until the lease is released (choose it well below `leaseSec`);
   * calling it again replaces the timer. The timer does not keep the process alive.
   */
  keepAlive(everyMs: number): void {
    this.stopKeepAlive();
    if (this.released) return;
    this.timer = setInterval(() => {
      if (!this.released) this.renew().catch(() => undefined);
    }, everyMs);
    this.timer.unref();
  }

  private stopKeepAlive(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }

  /**
   * Gives the slot back now: whether a live lease was released (false if it had expired, was
   * admitted by `'fail-open'`, was released already, or Redis could not answer: it then expires
   * by itself). A refusal of Redis is thrown (`RejectedError`). The keep-alive stops first, and
   * the release is sent once every renewal already on its way has been answered (or given up):
   * once it returns, no renewal of this lease lands after it and takes the slot again.
   */
  async release(call?: CallOptions): Promise<boolean> {
    this.stopKeepAlive();
    const wasReleased = this.released;
    this.released = true;
    if (this.renewing.size > 0) await Promise.allSettled([...this.renewing]);
    const [redis, local] = [this.redis && !wasReleased, this.local && !wasReleased];
    let freed = false;
    if (local) for (const [key] of this.limits) freed = this.client.releaseLocal(key, this.id) || freed;
    if (redis) {
      let error: unknown;
      for (const [key] of this.limits) {
        try {
          freed = (await this.client.release(key, this.id, call)) || freed;
        } catch (e) {
          error ??= e;
        }
      }
      if (error !== undefined) throw error;
    }
    return freed;
  }

  /** `await using lease = ...`: released when the block ends (a refusal is not thrown there). */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release().catch(() => false);
  }
}
