/**
 * Reserve, then settle: an estimate is checked and consumed up front, and the difference with
 * the true cost is charged or refunded once the work is done (`RL.SETTLE`).
 */

import type { Limit } from './algorithm.js';
import type { CallOptions, Degraded, Settlement } from './types.js';

/**
 * @internal What a reservation needs of the client that made it (the client is one): the
 * settlement sent where the estimate was charged.
 */
export interface SettlementTarget {
  settleCharged(limits: readonly Limit[], delta: number, charged: Degraded | undefined, call?: CallOptions): Promise<Settlement>;
}

/**
 * An estimate consumed from one or several limits, to be settled with the true cost. Left
 * unsettled, the estimate stays charged (nothing is sent).
 */
export class Reservation {
  /** @internal */
  constructor(
    private readonly client: SettlementTarget,
    /** The limits it covers, in the order of the settlement's decisions. */
    readonly limits: readonly Limit[],
    /** The units consumed when the reservation was made. */
    readonly estimate: number,
    /**
     * Undefined when the estimate was consumed on Redis; `'local'` in the in-process buckets of
     * the `'local'` policy; `'fail-open'` when nothing was consumed anywhere.
     */
    readonly degraded: Degraded | undefined,
  ) {}

  /**
   * Settles with the true cost: `actual - estimate` is refunded (below 0) or charged (above 0,
   * with no admission check: a limit may go into debt) on every limit, in one `RL.SETTLE ...
   * DELTA actual-estimate`; `actual === estimate` sends `DELTA 0`, which only reports. A
   * reservation of the `'local'` policy is settled in its in-process buckets (even once Redis is
   * back); one admitted by `'fail-open'` sends nothing. When Redis cannot answer the settlement
   * is lost (the estimate stands) and the decisions are the failure policy's for a cost of 0.
   */
  settle(actual: number, call?: CallOptions): Promise<Settlement> {
    if (!Number.isSafeInteger(actual) || actual < 0) {
      return Promise.reject(new RangeError(`actual must be an integer from 0 to 2^53-1, not ${actual}`));
    }
    return this.client.settleCharged(this.limits, actual - this.estimate, this.degraded, call);
  }
}
