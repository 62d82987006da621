/**
 * The Fastify plugin: the same engine as the Express middleware, on Fastify's hooks.
 */

import type { Client } from '../client.js';
import type { Metrics } from '../metrics.js';
import {
  type Admitted,
  type RateLimitOptions,
  type RequestLike,
  type ResponseLike,
  RateLimitEngine,
  actualCostOf,
  setRateLimitInfo,
} from './core.js';

/** What the plugin uses of Fastify's request. */
export interface FastifyRequestLike extends RequestLike {
  readonly raw: RequestLike;
}

/** What the plugin uses of Fastify's reply. */
export interface FastifyReplyLike {
  readonly raw: ResponseLike;
  code(status: number): FastifyReplyLike;
  header(name: string, value: string): FastifyReplyLike;
  send(payload?: unknown): FastifyReplyLike;
}

/** What the plugin uses of a Fastify instance. */
export interface FastifyInstanceLike {
  addHook(name: 'onRequest', hook: (req: FastifyRequestLike, reply: FastifyReplyLike) => Promise<unknown>): unknown;
  addHook(name: 'onSend', hook: (req: FastifyRequestLike, reply: FastifyReplyLike, payload: unknown) => Promise<unknown>): unknown;
}

export interface FastifyRateLimitOptions<Req extends FastifyRequestLike> extends RateLimitOptions<Req> {
  client: Client;
}

/** A Fastify plugin function, with the counters it keeps once registered. */
export interface FastifyRateLimitPlugin {
  (fastify: FastifyInstanceLike, options: FastifyRateLimitOptions<FastifyRequestLike>): Promise<void>;
}

const admissions = new WeakMap<object, Admitted>();
const engines = new WeakMap<object, RateLimitEngine<FastifyRequestLike>>();

/**
 * `fastify.register(fastifyRateLimit, { client, limits, ... })`: rate limiting on every route of
 * the instance (the plugin is not encapsulated, as fastify-plugin would do). The same options,
 * fields, 429 and 500 problem+json answers as the Express middleware; an actual cost set with
 * `setActualCost(reply, n)` before `reply.send` is settled in `onSend`, before the response
 * leaves. The counters are on `options.metrics` (pass your own `Metrics` to read them).
 */
export const fastifyRateLimit: FastifyRateLimitPlugin & {
  metricsOf(options: object): Metrics | undefined;
  renderPrometheusOf(options: object): string | undefined;
} = Object.assign(
  async (fastify: FastifyInstanceLike, options: FastifyRateLimitOptions<FastifyRequestLike>): Promise<void> => {
    const engine = new RateLimitEngine<FastifyRequestLike>(options.client, options);
    engines.set(options, engine);
    fastify.addHook('onRequest', async (req, reply) => {
      const a = await engine.admit(req);
      if (a.kind === 'pass') return;
      if (a.kind === 'refuse') {
        if (a.info) setRateLimitInfo(reply.raw, a.info);
        reply.code(a.refusal.status);
        for (const [name, value] of a.refusal.fields) reply.header(name, value);
        reply.send(Buffer.from(a.refusal.body));
        return reply;
      }
      const admitted = a.admitted;
      setRateLimitInfo(reply.raw, admitted.info);
      admissions.set(reply.raw, admitted);
      for (const [name, value] of admitted.fields) reply.header(name, value);
      const done = (): void => admitted.release();
      reply.raw.once('finish', done);
      reply.raw.once('close', done);
      if (reply.raw.destroyed) done();
      return undefined;
    });
    fastify.addHook('onSend', async (_req, reply, payload) => {
      const admitted = admissions.get(reply.raw);
      const actual = actualCostOf(reply.raw);
      if (admitted && admitted.needsSettlement(actual)) {
        admissions.delete(reply.raw);
        const fields = await admitted.settle(actual!);
        for (const [name, value] of fields) reply.header(name, value);
      }
      return payload;
    });
  },
  {
    /** The counters of the plugin registered with these options. */
    metricsOf(options: object): Metrics | undefined {
      return engines.get(options)?.metrics;
    },
    /** What to serve on `/metrics` for the plugin registered with these options: its counters, then `ratelimit_breaker_open`. */
    renderPrometheusOf(options: object): string | undefined {
      return engines.get(options)?.renderPrometheus();
    },
  },
);

// Registered on the instance itself rather than in a child context (what fastify-plugin does).
(fastifyRateLimit as unknown as Record<symbol, unknown>)[Symbol.for('skip-override')] = true;
(fastifyRateLimit as unknown as Record<symbol, unknown>)[Symbol.for('fastify.display-name')] = 'ratelimit-client';
