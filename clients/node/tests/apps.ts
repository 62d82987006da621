/**
 * The HTTP side of the tests: an Express app and a Fastify app with the package's middleware in
 * front of the table's handler, served over TCP on loopback, and a client that sends requests
 * from a given loopback address.
 */

import { type IncomingMessage, type ServerResponse, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';

import express from 'express';
import Fastify from 'fastify';

import {
  type Client,
  Metrics,
  type RateLimitOptions,
  type RequestLike,
  fastifyRateLimit,
  redisRateLimit,
  rateLimitInfo,
  setActualCost,
} from '../src/index.js';

export type Framework = 'express' | 'fastify';

/** Requests held in their handler until the test lets them go. */
export class Gates {
  private readonly entered = new Map<string, () => void>();
  private readonly enteredP = new Map<string, Promise<void>>();
  private readonly open = new Map<string, () => void>();
  private readonly openP = new Map<string, Promise<void>>();

  private slot(name: string): void {
    if (this.enteredP.has(name)) return;
    this.enteredP.set(name, new Promise((r) => this.entered.set(name, r)));
    this.openP.set(name, new Promise((r) => this.open.set(name, r)));
  }

  /** In the handler: says it is there, then waits for `release`. */
  async pass(name: string): Promise<void> {
    this.slot(name);
    this.entered.get(name)!();
    await this.openP.get(name);
  }

  /** Resolves once a handler is held at `name`. */
  reached(name: string): Promise<void> {
    this.slot(name);
    return this.enteredP.get(name)!;
  }

  release(name: string): void {
    this.slot(name);
    this.open.get(name)!();
  }

  releaseAll(): void {
    for (const r of this.open.values()) r();
  }
}

const TEXT = 'text/plain; charset=utf-8';

/** The shadow denials of a response, in a header of their own for the test to read. */
const SHADOW_HEADER = 'x-shadow-denials';

/** A running app: its port, its counters, and how to stop it. */
export interface App {
  readonly port: number;
  readonly metrics: Metrics;
  close(): Promise<void>;
}

function pathOf(url: string | undefined): string {
  const u = url ?? '/';
  const q = u.indexOf('?');
  return q < 0 ? u : u.slice(0, q);
}

/**
 * The table's handler behind the middleware: `ok` as text/plain, the actual cost from
 * `x-used`, held while `x-hold` names a gate, and `/stream` never ends (a line every 20 ms until
 * the client goes away).
 */
export async function startApp(
  framework: Framework,
  client: Client,
  options: RateLimitOptions<RequestLike>,
  gates: Gates,
): Promise<App> {
  const metrics = options.metrics ?? new Metrics();
  const opts = { ...options, metrics, prometheus: false as const };
  if (framework === 'express') {
    const app = express();
    app.disable('x-powered-by');
    app.disable('etag');
    // An outer layer that logs the shadow denials (here: into a header the test reads).
    app.use((_req: IncomingMessage, res: ServerResponse, next: () => void) => {
      const writeHead = res.writeHead;
      res.writeHead = function (this: ServerResponse, ...args: unknown[]) {
        const denials = rateLimitInfo(res)?.shadowDenials ?? [];
        if (denials.length > 0) res.setHeader(SHADOW_HEADER, JSON.stringify(denials));
        return (writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
      } as typeof res.writeHead;
      next();
    });
    app.use(redisRateLimit(client, opts));
    app.use(async (req: IncomingMessage, res: ServerResponse) => {
      const hold = req.headers['x-hold'];
      if (typeof hold === 'string') await gates.pass(hold);
      res.setHeader('content-type', TEXT);
      const used = req.headers['x-used'];
      if (typeof used === 'string') setActualCost(res, Number(used));
      if (pathOf(req.url) === '/stream') {
        res.write('tick\n');
        const every = setInterval(() => res.write('tick\n'), 20);
        res.once('close', () => clearInterval(every));
        return;
      }
      res.end('ok');
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise<void>((ok) => server.once('listening', () => ok()));
    return {
      port: (server.address() as AddressInfo).port,
      metrics,
      close: () =>
        new Promise<void>((ok) => {
          server.closeAllConnections();
          server.close(() => ok());
        }),
    };
  }
  const app = Fastify();
  await app.register(fastifyRateLimit, { client, ...opts });
  app.addHook('onSend', async (_req, reply, payload) => {
    const denials = rateLimitInfo(reply)?.shadowDenials ?? [];
    if (denials.length > 0) reply.header(SHADOW_HEADER, JSON.stringify(denials));
    return payload;
  });
  app.get('/*', async (req, reply) => {
    const hold = req.headers['x-hold'];
    if (typeof hold === 'string') await gates.pass(hold);
    reply.header('content-type', TEXT);
    const used = req.headers['x-used'];
    if (typeof used === 'string') setActualCost(reply, Number(used));
    if (pathOf(req.url) === '/stream') {
      const body = new Readable({ read() {} });
      body.push('tick\n');
      const every = setInterval(() => body.push('tick\n'), 20);
      reply.raw.once('close', () => {
        clearInterval(every);
        body.destroy();
      });
      return reply.send(body);
    }
    return 'ok';
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  return {
    port: (app.server.address() as AddressInfo).port,
    metrics,
    close: async () => {
      app.server.closeAllConnections();
      await app.close();
    },
  };
}

/** A response as the table records it. */
export interface HttpReply {
  status: number;
  headers: Record<string, string>;
  body: string | undefined;
  shadowDenials: string[] | undefined;
}

/** The response fields the table records, when present. */
export const FIELDS = [
  'ratelimit-policy',
  'ratelimit',
  'ratelimit-partition',
  'ratelimit-limit',
  'ratelimit-remaining',
  'ratelimit-reset',
  'ratelimit-degraded',
  'retry-after',
  'content-type',
];

/**
 * One request over TCP from `peer` (a loopback address) on a connection of its own. A stream is
 * read up to its first line, then the connection is closed (the client went away).
 */
export function send(
  port: number,
  r: { path?: string; headers?: Record<string, string>; peer?: string; stream?: boolean },
): Promise<HttpReply> {
  return new Promise((ok, fail) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port,
        path: r.path ?? '/',
        method: 'GET',
        headers: r.headers ?? {},
        localAddress: r.peer ?? '127.0.0.1',
        agent: false,
      },
      (res) => {
        const headers: Record<string, string> = {};
        for (const f of FIELDS) {
          const v = res.headers[f];
          if (typeof v === 'string') headers[f] = v;
        }
        const shadow = res.headers[SHADOW_HEADER];
        const shadowDenials = typeof shadow === 'string' ? (JSON.parse(shadow) as string[]) : undefined;
        const chunks: Buffer[] = [];
        if (r.stream) {
          res.once('data', (chunk: Buffer) => {
            if (!chunk.toString().startsWith('tick')) fail(new Error(`the stream sent ${chunk.toString()}`));
            req.destroy();
            ok({ status: res.statusCode ?? 0, headers, body: undefined, shadowDenials });
          });
          return;
        }
        res.on('data', (c: Buffer) => chunks.push(c));
        res.once('end', () =>
          ok({ status: res.statusCode ?? 0, headers, body: Buffer.concat(chunks).toString('utf8'), shadowDenials }),
        );
        res.once('error', fail);
      },
    );
    req.once('error', fail);
    req.end();
  });
}
