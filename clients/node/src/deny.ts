/**
 * The deny cache: after Redis denied a check with `retryAfterMs` R, the same check (the same
 * limits, keys, parameters and cost) is denied in the process until R has passed on the
 * process's monotonic clock, without a call to Redis.
 *
 * It can only deny more than Redis would, never admit: what changes the key meanwhile (another
 * process refunding, a limit raised, a window ending sooner by the server's clock than by this
 * one) is seen at most R later. Entries are counted from the moment the denied call was sent, so
 * an entry never outlives the server's own R. When it expires, one check asks Redis (a probe)
 * while the others are still answered from it, for at most the client's timeout: a key denied
 * again costs one call per R, not one per caller waiting at that moment.
 */

import { performance } from 'node:perf_hooks';

import { Lru } from './lru.js';
import type { MultiOutcome } from './types.js';

interface Denied {
  /** A check is asking Redis since the entry expired, until `until` (moved on by the timeout). */
  probing: boolean;
  /** When the denied call was sent (`performance.now()`). */
  sent: number;
  until: number;
  outcome: MultiOutcome;
}

/** One entry per call: the limits' signature and the cost. */
function entryKey(sig: string, cost: number): string {
  return `${sig}cost ${cost}`;
}

/** A fixed number of denials, the least recently used evicted first. */
export class DenyCache {
  private readonly entries: Lru<Denied>;

  /** At most `capacity` entries; a probe may take `probeMs` (the client's timeout). */
  constructor(
    capacity: number,
    private readonly probeMs: number,
  ) {
    this.entries = new Lru(capacity);
  }

  get capacity(): number {
    return this.entries.capacity;
  }

  get size(): number {
    return this.entries.size;
  }

  /**
   * The denial standing for `sig` at `cost`, its waits counted down to now (at least 1 ms). The
   * first check after the entry expired gets undefined and asks Redis: the entry answers the
   * others until that answer is recorded or the probe's time is up (then it is dropped).
   */
  lookup(sig: string, cost: number): MultiOutcome | undefined {
    const now = performance.now();
    const key = entryKey(sig, cost);
    const d = this.entries.get(key);
    if (d === undefined) return undefined;
    if (now >= d.until) {
      if (d.probing) this.entries.delete(key);
      else {
        d.probing = true;
        d.until = now + this.probeMs;
      }
      return undefined;
    }
    // Whole milliseconds gone since the denial (rounded down): the waits are rounded up.
    const gone = Math.floor(now - d.sent);
    return {
      ...d.outcome,
      decisions: d.outcome.decisions.map((x) => ({
        ...x,
        retryAfterMs: x.retryAfterMs > 0 ? Math.max(x.retryAfterMs - gone, 1) : x.retryAfterMs,
        resetAfterMs: Math.max(x.resetAfterMs - gone, 0),
      })),
      granted: 0,
      answeredLocally: 'deny_cache',
    };
  }

  /**
   * Remembers a denial that Redis answered (not one of the failure policy, nor one answered
   * locally) whose wait is known and above 0; `sent` is when its call was sent. An admission by
   * Redis (a probe's answer) drops the entry if it leaves the cost; if it leaves less (the next
   * check would be denied, its wait unknown), the next check probes again, the others still
   * answered from the entry meanwhile.
   */
  record(sig: string, cost: number, o: MultiOutcome, sent: number): void {
    if (o.degraded !== undefined || o.answeredLocally !== undefined) return;
    const key = entryKey(sig, cost);
    if (o.allowed) {
      const left = o.decisions.length === 0 ? 0 : Math.min(...o.decisions.map((d) => d.remaining));
      if (left >= cost) this.entries.delete(key);
      else {
        const d = this.entries.peek(key);
        if (d !== undefined) {
          d.probing = false;
          d.until = performance.now();
        }
      }
      return;
    }
    const d = o.decisions[Math.max(o.deniedBy, 1) - 1];
    // -1: never admitted at this cost; not cached.
    if (d === undefined || d.retryAfterMs <= 0) return;
    this.entries.set(key, { probing: false, sent, until: sent + d.retryAfterMs, outcome: o });
  }

  /** When the entry of `sig` at `cost` expires (or its probe's time is up), if there is one (`performance.now()` time). */
  until(sig: string, cost: number): number | undefined {
    return this.entries.get(entryKey(sig, cost))?.until;
  }
}
