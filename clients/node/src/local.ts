/**
 * The in-process fallback of the `'local'` failure policy, used while Redis cannot answer: a
 * token bucket per key with the limit and rate divided by the expected number of instances
 * (settled reservations give tokens back or take more, into debt down to one capacity), and for
 * concurrency limits a counting semaphore per key (the limit divided alike) whose leases expire
 * as on Redis.
 */

import { performance } from 'node:perf_hooks';

import { type Algorithm, type Concurrency, limitOf, ratePerSec } from './algorithm.js';
import type { Decision } from './types.js';

const MAX_KEYS = 100_000;

/** Capacity and rate of the local share of `a` for `instances` instances. */
export function share(a: Algorithm, instances: number): [number, number] {
  const n = Math.max(Math.trunc(instances), 1);
  return [Math.max(Math.floor(limitOf(a) / n), 1), ratePerSec(a) / n];
}

interface Bucket {
  tokens: number;
  at: number;
}

export class LocalLimiter {
  private readonly buckets = new Map<string, Bucket>();

  check(key: string, a: Algorithm, instances: number, cost: number): Decision {
    const [capacity, rate] = share(a, instances);
    const now = performance.now();
    if (this.buckets.size >= MAX_KEYS && !this.buckets.has(key)) {
      for (const [k, b] of this.buckets) {
        if (b.tokens + ((now - b.at) / 1000) * rate >= capacity) this.buckets.delete(k);
      }
    }
    let entry = this.buckets.get(key);
    if (!entry) {
      entry = { tokens: capacity, at: now };
      this.buckets.set(key, entry);
    }
    const tokens = Math.min(entry.tokens + ((now - entry.at) / 1000) * rate, capacity);
    const allowed = cost <= tokens;
    let left = tokens;
    if (allowed && cost > 0) {
      left = tokens - cost;
      entry.tokens = left;
      entry.at = now;
    }
    let retryAfterMs = 0;
    if (!allowed) retryAfterMs = cost > capacity ? -1 : Math.ceil(((cost - tokens) * 1000) / rate);
    return {
      allowed,
      remaining: Math.max(Math.floor(left), 0),
      retryAfterMs,
      resetAfterMs: Math.ceil(((capacity - left) * 1000) / rate),
      limit: capacity,
    };
  }

  /**
   * A partial grant from the in-process bucket: what it has left (whole units), at most `n`;
   * nothing left is the denial of one unit. The decision and the units granted.
   */
  grant(key: string, a: Algorithm, instances: number, n: number): [Decision, number] {
    const left = this.check(key, a, instances, 0).remaining;
    const g = Math.max(Math.min(left, n), 1);
    const d = this.check(key, a, instances, g);
    return [d, d.allowed ? g : 0];
  }

  /**
   * Gives back `-delta` tokens (never above the capacity) or takes `delta` more, below zero if
   * need be, down to minus the capacity: a bucket in debt denies until it has refilled past it.
   */
  adjust(key: string, a: Algorithm, instances: number, delta: number): Decision {
    const [capacity, rate] = share(a, instances);
    const now = performance.now();
    let entry = this.buckets.get(key);
    if (!entry) {
      entry = { tokens: capacity, at: now };
      this.buckets.set(key, entry);
    }
    const tokens = Math.min(entry.tokens + ((now - entry.at) / 1000) * rate, capacity);
    const left = Math.min(Math.max(tokens - delta, -capacity), capacity);
    if (delta !== 0) {
      entry.tokens = left;
      entry.at = now;
    }
    return {
      allowed: true,
      remaining: Math.floor(Math.max(left, 0)),
      retryAfterMs: 0,
      resetAfterMs: Math.ceil(((capacity - left) * 1000) / rate),
      limit: capacity,
    };
  }
}

/** Whole milliseconds from `now` to `t` (rounded up, 0 if past). */
function msUntil(t: number, now: number): number {
  return t > now ? Math.ceil(Math.floor((t - now) * 1000) / 1000) : 0;
}

/** Live leases per key: lease id -> expiry. */
export class LocalLeases {
  private readonly keys = new Map<string, Map<string, number>>();

  /** The local share of `limit` for `instances` instances. */
  static share(limit: Concurrency, instances: number): number {
    return Math.max(Math.floor(limit.limit / Math.max(Math.trunc(instances), 1)), 1);
  }

  /** Takes (or renews) a slot of `key` for `id`; with `take` false only says whether it would. */
  acquire(key: string, id: string, limit: Concurrency, instances: number, take: boolean): Decision {
    const slots = LocalLeases.share(limit, instances);
    const now = performance.now();
    if (this.keys.size >= MAX_KEYS && !this.keys.has(key)) {
      for (const [k, leases] of this.keys) {
        if (![...leases.values()].some((t) => t > now)) this.keys.delete(k);
      }
    }
    let leases = this.keys.get(key);
    if (!leases) {
      leases = new Map();
      this.keys.set(key, leases);
    }
    for (const [lid, t] of leases) if (t <= now) leases.delete(lid);
    const held = leases.has(id);
    const allowed = held || leases.size < slots;
    if (allowed && take) leases.set(id, now + Math.max(limit.leaseSec, 0) * 1000);
    const expiries = [...leases.values()].sort((x, y) => x - y);
    const live = expiries.length;
    let retryAfterMs = 0;
    if (!allowed) {
      // The slot frees when live - slots + 1 leases have expired.
      const t = expiries[live - slots];
      retryAfterMs = t === undefined ? 0 : msUntil(t, now);
    }
    const last = expiries[live - 1];
    const decision: Decision = {
      allowed,
      remaining: Math.max(slots - live, 0),
      retryAfterMs,
      resetAfterMs: last === undefined ? 0 : msUntil(last, now),
      limit: slots,
    };
    if (leases.size === 0) this.keys.delete(key);
    return decision;
  }

  /** Frees `id`'s slot of `key`; whether it held a live one. */
  release(key: string, id: string): boolean {
    const now = performance.now();
    const leases = this.keys.get(key);
    if (!leases) return false;
    const t = leases.get(id);
    leases.delete(id);
    for (const [lid, e] of leases) if (e <= now) leases.delete(lid);
    if (leases.size === 0) this.keys.delete(key);
    return t !== undefined && t > now;
  }
}
