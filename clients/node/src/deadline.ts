/**
 * The calls' deadlines: one timer per client, not one per call. Each call on its way to Redis is
 * an {@link Attempt} in the client's {@link Sweep}; the sweep's timer is set for the earliest
 * deadline among them and, when it fires, gives up the calls whose deadline has passed (their
 * promise rejects; their command is left to the client library, and its late reply is ignored)
 * and is set again for the next. A call answered in time only marks itself done: no timer, no
 * abort controller, no listener is made for it.
 */

import { performance } from 'node:perf_hooks';

/**
 * How long a call may wait, in budgets, while Redis keeps answering the client's other calls
 * (its own command queued behind theirs on the connection).
 */
export const WAIT_FACTOR = 10;

/**
 * Runs `fn` once the event loop has polled its sockets after now: a reply that came while the
 * loop was busy (a loaded machine runs the timers late, and the current poll may have begun
 * before the reply arrived) is read before `fn` decides that none came. An immediate set from
 * an immediate runs in the next turn of the loop, after its poll.
 */
export function afterNextPoll(fn: () => void): void {
  setImmediate(() => setImmediate(fn));
}

/**
 * One call on its way to Redis: its deadline, and `outside(p)`, which waits for the client's
 * start-up work that the call shares with every other caller (the connection being made, the
 * mode's detection, a script's load) with the deadline stopped meanwhile and counted again in
 * full once that work is done.
 */
export class Attempt {
  /** When the call is overdue (`performance.now()` ms); Infinity while its deadline is stopped. */
  deadline: number;
  /** The latest the call may wait while Redis answers other calls (WAIT_FACTOR budgets). */
  latest: number;
  /** Why the call was given up (its deadline, the caller's abort); undefined while it runs. */
  reason: unknown = undefined;
  /** Whether the call's promise is settled. */
  done = false;
  /** Whether the call was given up at its deadline (Redis answered nothing in time). */
  expired = false;
  /** Whether the call holds a place among the calls on their way to Redis. */
  turn = false;
  /** Made when a signal is asked for ({@link Attempt.signal}): aborted when the call is given up. */
  private controller: AbortController | undefined = undefined;
  private resolve: ((v: unknown) => void) | undefined = undefined;
  private reject: ((e: unknown) => void) | undefined = undefined;
  /** Removes the listener of the caller's signal. */
  private onEnd: (() => void) | undefined = undefined;

  /** When the call began (`performance.now()` ms). */
  readonly began: number;

  constructor(
    private readonly sweep: Sweep,
    readonly budgetMs: number,
    /** The caller's own signal, if any. */
    readonly user: AbortSignal | undefined,
  ) {
    const now = performance.now();
    this.began = now;
    this.deadline = now + budgetMs;
    this.latest = now + WAIT_FACTOR * budgetMs;
  }

  /**
   * The promise of `work`, or of its end: rejected with the deadline's error when it passes, or
   * with `userAbort` when the caller's signal aborts.
   */
  run<T>(work: (at: Attempt) => Promise<T>, userAbort: unknown): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.resolve = resolve as (v: unknown) => void;
      this.reject = reject;
      this.sweep.add(this);
      const user = this.user;
      if (user !== undefined) {
        const onAbort = (): void => this.giveUp(user.reason, userAbort);
        user.addEventListener('abort', onAbort, { once: true });
        this.onEnd = () => user.removeEventListener('abort', onAbort);
      }
      let p: Promise<T>;
      try {
        p = work(this);
      } catch (e) {
        this.settle(undefined, e, false);
        return;
      }
      this.follow(p);
    });
  }

  /**
   * The promise of `p`, work already begun for a call without a signal of the caller's: as
   * {@link Attempt.run}, without a function made for the work.
   */
  watch<T>(p: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.resolve = resolve as (v: unknown) => void;
      this.reject = reject;
      this.sweep.add(this);
      this.follow(p);
    });
  }

  private follow(p: Promise<unknown>): void {
    p.then(
      (v) => this.settle(v, undefined, true),
      (e: unknown) => this.settle(undefined, e, false),
    );
  }

  private settle(v: unknown, e: unknown, ok: boolean): void {
    if (this.done) return;
    const resolve = this.resolve!;
    const reject = this.reject!;
    this.finish();
    if (ok) resolve(v);
    else reject(e);
  }

  /**
   * Done: out of the sweep's count, and holding nothing of the call (its promise's functions),
   * so that the sweep's list keeps no call's objects alive until it is next rid of it.
   */
  private finish(): void {
    this.done = true;
    this.sweep.remove();
    this.resolve = undefined;
    this.reject = undefined;
    if (this.onEnd !== undefined) {
      this.onEnd();
      this.onEnd = undefined;
    }
  }

  /** Gives the call up: `reason` for the work still running, `rejection` for its promise. */
  giveUp(reason: unknown, rejection: unknown): void {
    if (this.done) return;
    this.reason = reason;
    const reject = this.reject!;
    this.finish();
    this.controller?.abort(reason);
    reject(rejection);
  }

  /** A signal that aborts when the call is given up (made on the first request). */
  signal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.done) this.controller.abort(this.reason);
    }
    return this.controller.signal;
  }

  /** Throws why the call was given up, if it was: nothing more is sent for it. */
  throwIfGivenUp(): void {
    if (this.done && this.reason !== undefined) throw this.reason;
  }

  /** Stops the deadline (the call waits for the client, not for Redis). */
  stop(): void {
    this.deadline = Number.POSITIVE_INFINITY;
  }

  /** Counts the deadline anew from now, in full. */
  restart(): void {
    if (this.done) return;
    const now = performance.now();
    this.deadline = now + this.budgetMs;
    this.latest = now + WAIT_FACTOR * this.budgetMs;
    this.sweep.moved(this);
  }

  /** Waits for the client's start-up work `p` with the deadline stopped, then counts it anew. */
  async outside<U>(p: Promise<U>): Promise<U> {
    this.stop();
    let value: U;
    try {
      value = await p;
    } finally {
      this.restart();
    }
    // Given up meanwhile (the caller's abort): nothing more is sent.
    this.throwIfGivenUp();
    return value;
  }
}

/**
 * The list of calls is rid of those that are done once it is this long (or twice the calls not
 * done): often, so that a call's objects die young (a list that kept a timeout's worth of calls
 * would keep them through the young generation's collections, into the old one).
 */
const COMPACT_AT_LEAST = 64;

/**
 * The deadlines of one client's calls. Attempts are kept in the order they came and dropped by
 * the sweep once done; the timer is set for the earliest deadline among those not done, and
 * referenced (keeping the process alive) only while some call is not done.
 */
export class Sweep {
  private attempts: Attempt[] = [];
  /** The length at which the list is next rid of the calls that are done. */
  private compactAt = COMPACT_AT_LEAST;
  private live = 0;
  private timer: NodeJS.Timeout | undefined = undefined;
  /** When the timer fires (`performance.now()` ms); Infinity when it is not set. */
  private armedFor = Number.POSITIVE_INFINITY;
  private sweeping = false;

  /**
   * `answeredAt`: when Redis last answered a call of the client. At its deadline, a call whose
   * client Redis answered within its budget waits on, up to its latest.
   */
  constructor(private readonly answeredAt: () => number) {}

  add(a: Attempt): void {
    if (this.attempts.length >= this.compactAt) this.compact();
    this.attempts.push(a);
    if (this.live++ === 0) this.timer?.ref();
    if (a.deadline < this.armedFor) this.arm(a.deadline);
  }

  /** A call is done. */
  remove(): void {
    if (--this.live === 0) this.timer?.unref();
  }

  /** A call's deadline moved (counted anew after its start-up wait). */
  moved(a: Attempt): void {
    if (a.deadline < this.armedFor) this.arm(a.deadline);
  }

  private arm(at: number): void {
    if (this.sweeping) return;
    this.armedFor = at;
    const ms = Math.max(1, Math.ceil(at - performance.now()));
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.fire(), ms);
    if (this.live === 0) this.timer.unref();
  }

  private fire(): void {
    this.timer = undefined;
    this.armedFor = Number.POSITIVE_INFINITY;
    const now = performance.now();
    if (this.attempts.some((a) => !a.done && a.deadline <= now)) {
      // Some deadline has passed: an answer that came but is not read yet is read first. The
      // timer is set again afterwards.
      this.sweeping = true;
      afterNextPoll(() => {
        this.sweeping = false;
        this.expire();
      });
      return;
    }
    this.rearm();
  }

  /** Gives up every call past its deadline (unless Redis answers the client's other calls), then sets the timer again. */
  private expire(): void {
    const now = performance.now();
    const quiet = now - this.answeredAt();
    for (const a of this.attempts) {
      if (a.done || a.deadline > now) continue;
      if (quiet < a.budgetMs && now < a.latest) {
        a.deadline = now + Math.max(1, Math.min(a.budgetMs - quiet, a.latest - now));
        continue;
      }
      const e = new Error(`no answer within ${a.budgetMs} ms`);
      a.expired = true;
      a.giveUp(e, e);
    }
    this.rearm();
  }

  /** Drops the calls that are done and sets the timer for the earliest deadline left. */
  private rearm(): void {
    const next = this.compact();
    if (next !== Number.POSITIVE_INFINITY) this.arm(next);
  }

  /** Drops the calls that are done: the earliest deadline left. */
  private compact(): number {
    let next = Number.POSITIVE_INFINITY;
    const kept: Attempt[] = [];
    for (const a of this.attempts) {
      if (a.done) continue;
      kept.push(a);
      if (a.deadline < next) next = a.deadline;
    }
    this.attempts = kept;
    this.compactAt = Math.max(COMPACT_AT_LEAST, 2 * kept.length);
    return next;
  }
}
