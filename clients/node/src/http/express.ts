/**
 * The Express middleware (it works on Node's own `http` server too: it only uses the request and
 * response of `node:http`).
 */

import type { ServerResponse } from 'node:http';

import type { Client } from '../client.js';
import type { Metrics } from '../metrics.js';
import {
  type Admitted,
  type ExpressRequestLike,
  type Fields,
  type RateLimitOptions,
  type RequestLike,
  type ResponseLike,
  RateLimitEngine,
  actualCostOf,
  setRateLimitInfo,
} from './core.js';

/** An Express (or Connect) middleware, with the counters it keeps. */
export interface RateLimitMiddleware<Req extends RequestLike = ExpressRequestLike> {
  (req: Req, res: ResponseLike, next: (err?: unknown) => void): void;
  /** The counters. */
  readonly metrics: Metrics;
  /** What to serve on `/metrics`: the counters, then the gauge `ratelimit_breaker_open` of the client. */
  renderPrometheus(): string;
  readonly engine: RateLimitEngine<Req>;
}

function setFields(res: ServerResponse, fields: Fields): void {
  for (const [name, value] of fields) res.setHeader(name, value);
}

/**
 * Holds the response's head (and what the handler writes after it) until `before` has run, when
 * `before` says there is something to do first. Everything is written in its order afterwards.
 */
function holdHead(res: ServerResponse, before: () => Promise<void> | undefined): void {
  const { writeHead, write, end } = res;
  let state: 'idle' | 'holding' | 'done' = 'idle';
  const queue: Array<() => void> = [];
  const restore = (): void => {
    res.writeHead = writeHead;
    res.write = write;
    res.end = end;
  };
  /** Whether this call must wait. */
  const hold = (): boolean => {
    if (state === 'holding') return true;
    if (state === 'done') return false;
    const pending = before();
    if (pending === undefined) {
      state = 'done';
      restore();
      return false;
    }
    state = 'holding';
    void pending
      .catch(() => undefined)
      .then(() => {
        state = 'done';
        restore();
        for (const run of queue.splice(0)) run();
      });
    return true;
  };
  res.writeHead = function (this: ServerResponse, ...args: unknown[]) {
    if (!hold()) return (writeHead as (...a: unknown[]) => ServerResponse).apply(res, args);
    queue.push(() => (writeHead as (...a: unknown[]) => ServerResponse).apply(res, args));
    return res;
  } as typeof res.writeHead;
  res.write = function (this: ServerResponse, ...args: unknown[]) {
    if (!hold()) return (write as (...a: unknown[]) => boolean).apply(res, args);
    queue.push(() => (write as (...a: unknown[]) => boolean).apply(res, args));
    return true;
  } as typeof res.write;
  res.end = function (this: ServerResponse, ...args: unknown[]) {
    if (!hold()) return (end as (...a: unknown[]) => ServerResponse).apply(res, args);
    queue.push(() => (end as (...a: unknown[]) => ServerResponse).apply(res, args));
    return res;
  } as typeof res.end;
}

/** Sends a response the middleware decided itself (a 429 or a 500). */
function refuse(res: ServerResponse, status: number, fields: Fields, body: string): void {
  res.statusCode = status;
  setFields(res, fields);
  res.setHeader('content-length', Buffer.byteLength(body));
  res.end(body);
}

/** @internal What runs once the middleware let a request through: fields, settlement, slots given back. */
export function followResponse(res: ServerResponse, admitted: Admitted): void {
  setFields(res, admitted.fields);
  let settled = false;
  const settle = (): Promise<void> | undefined => {
    const actual = actualCostOf(res);
    if (settled || !admitted.needsSettlement(actual)) return undefined;
    settled = true;
    return admitted.settle(actual!).then((fields) => {
      if (!res.headersSent) setFields(res, fields);
    });
  };
  holdHead(res, settle);
  const done = (): void => {
    // An actual cost set once the head had left: settled now, the fields could not show it.
    void settle()?.catch(() => undefined);
    admitted.release();
  };
  res.once('finish', done);
  res.once('close', done);
}

/**
 * Rate limiting for Express: every limited response carries `RateLimit-Policy` and `RateLimit`
 * (and the legacy fields when asked), a denial is a `429` with `Retry-After` and a problem+json
 * body, a limit Redis refuses is a `500` problem+json. Concurrency slots are given back when the
 * response has been sent (`finish`) or the client went away (`close`); an actual cost set with
 * `setActualCost(res, n)` before the response's first byte settles the route's estimate before
 * the response leaves.
 */
export function redisRateLimit<Req extends RequestLike = ExpressRequestLike>(
  client: Client,
  options: RateLimitOptions<Req>,
): RateLimitMiddleware<Req> {
  const engine = new RateLimitEngine<Req>(client, options);
  const middleware = (req: Req, response: ResponseLike, next: (err?: unknown) => void): void => {
    const res = response as unknown as ServerResponse;
    engine.admit(req).then(
      (a) => {
        switch (a.kind) {
          case 'pass':
            next();
            return;
          case 'refuse':
            if (a.info) setRateLimitInfo(res, a.info);
            refuse(res, a.refusal.status, a.refusal.fields, a.refusal.body);
            return;
          case 'admit':
            setRateLimitInfo(res, a.admitted.info);
            if (res.writableEnded || res.destroyed) {
              a.admitted.release();
              return;
            }
            followResponse(res, a.admitted);
            next();
        }
      },
      (e: unknown) => next(e),
    );
  };
  return Object.assign(middleware, { metrics: engine.metrics, engine, renderPrometheus: () => engine.renderPrometheus() });
}

/**
 * @deprecated The same function as {@link redisRateLimit}, under the name express-rate-limit
 * exports too; import `redisRateLimit`.
 */
export const rateLimit: typeof redisRateLimit = redisRateLimit;
