/**
 * A circuit breaker: after `failures` consecutive failures the breaker opens and calls skip
 * Redis for `cooldownMs`; then one trial call goes through (half open): success closes it,
 * failure opens it again.
 */

import { performance } from 'node:perf_hooks';

type State = { kind: 'closed'; failures: number } | { kind: 'open'; until: number } | { kind: 'half-open' };

/** The closed state without failures, shared: a success on a closed breaker makes nothing. */
const CLOSED: State = Object.freeze({ kind: 'closed', failures: 0 });

export class Breaker {
  private state: State = CLOSED;
  private readonly failures: number;
  private readonly cooldownMs: number;

  constructor(options: { failures?: number; cooldownMs?: number } = {}) {
    this.failures = Math.max(options.failures ?? 3, 1);
    this.cooldownMs = options.cooldownMs ?? 1000;
  }

  /** Whether this call may go to Redis. */
  permit(): boolean {
    const s = this.state;
    if (s.kind === 'closed') return true;
    if (s.kind === 'open' && performance.now() >= s.until) {
      this.state = { kind: 'half-open' };
      return true;
    }
    return false;
  }

  success(): void {
    this.state = CLOSED;
  }

  failure(): void {
    const s = this.state;
    this.state =
      s.kind === 'closed' && s.failures + 1 < this.failures
        ? { kind: 'closed', failures: s.failures + 1 }
        : { kind: 'open', until: performance.now() + this.cooldownMs };
  }

  /** A call given up by its caller: a trial call that did not finish lets the next one try. */
  abandon(): void {
    if (this.state.kind === 'half-open') this.state = { kind: 'open', until: performance.now() };
  }

  /** Whether the breaker is open (or half open). */
  isOpen(): boolean {
    return this.state.kind !== 'closed';
  }
}
