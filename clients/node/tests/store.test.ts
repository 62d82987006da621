/**
 * The express-rate-limit store, with the real express-rate-limit over TCP: an app moves from
 * rate-limit-redis to this store by replacing one constructor and answers the same (statuses and
 * every rate-limit header of each header option, byte for byte), 200 requests at once admit
 * exactly the limit, decrements (skipFailedRequests), another algorithm, a per-request limit,
 * getKey and resetKey.
 */

import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';

import express from 'express';
import { type Options as ErlOptions, type Store, rateLimit } from 'express-rate-limit';
import { RedisStore } from 'rate-limit-redis';

import { RateLimitStore, slidingWindow } from '../src/index.js';
import { type Admin, LIBRARIES, type Library, type Opened, PATIENT, Server, cmd, open, ready, sleep } from './harness.js';
import { request as httpRequest } from 'node:http';

/** The fields express-rate-limit may send, and the status. */
const HEADERS = [
  'ratelimit-policy',
  'ratelimit',
  'ratelimit-limit',
  'ratelimit-remaining',
  'ratelimit-reset',
  'x-ratelimit-limit',
  'x-ratelimit-remaining',
  'x-ratelimit-reset',
  'retry-after',
];

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

function get(port: number, path = '/'): Promise<Answer> {
  return new Promise((ok, fail) => {
    const req = httpRequest({ host: '127.0.0.1', port, path, agent: false }, (res) => {
      const headers: Record<string, string> = {};
      for (const h of HEADERS) if (typeof res.headers[h] === 'string') headers[h] = res.headers[h];
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.once('end', () => ok({ status: res.statusCode ?? 0, headers, body }));
    });
    req.once('error', fail);
    req.end();
  });
}

/** An app with express-rate-limit in front of `/` (200 ok) and `/fail` (500). */
async function serve(options: Partial<ErlOptions>): Promise<{ port: number; limiter: ReturnType<typeof rateLimit>; close(): Promise<void> }> {
  const app = express();
  app.disable('x-powered-by');
  const limiter = rateLimit(options);
  app.use(limiter);
  app.get('/', (_req, res) => {
    res.send('ok');
  });
  app.get('/fail', (_req, res) => {
    res.status(500).send('failed');
  });
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((r) => server.once('listening', () => r()));
  return {
    port: (server.address() as AddressInfo).port,
    limiter,
    close: () => new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}

/** rate-limit-redis's `sendCommand` for each library, as its README shows it. */
function sendCommand(library: Library, o: Opened): (...args: string[]) => Promise<never> {
  const c = o.raw;
  if (library === 'node-redis' && 'sendCommand' in c && !('call' in c)) {
    return (...args: string[]) => c.sendCommand(args) as Promise<never>;
  }
  if (library === 'ioredis' && 'call' in c) return (command: string, ...args: string[]) => c.call(command, ...args) as Promise<never>;
  throw new Error(`not a ${library} client`);
}

describe('the express-rate-limit store', () => {
  let server: Server;
  let admin: Admin;
  before(async () => {
    // The real clock: rate-limit-redis's expiries run on it.
    server = await Server.start();
    admin = await server.admin();
  });
  after(async () => {
    admin.destroy();
    await server.stop();
  });

  for (const library of LIBRARIES) {
    for (const headers of [
      { standardHeaders: 'draft-6', legacyHeaders: false },
      { standardHeaders: 'draft-7', legacyHeaders: false },
      { standardHeaders: 'draft-8', legacyHeaders: true },
      { standardHeaders: false, legacyHeaders: true },
    ] as const) {
      test(`${library}, ${JSON.stringify(headers)}: from rate-limit-redis to this store by one constructor, the same answers`, async () => {
        const o = open(library, server.port);
        await ready(o);
        try {
          const run = async (makeStore: () => Store): Promise<Answer[]> => {
            await cmd(admin, 'FLUSHALL');
            // The app as it was, but for the store's constructor.
            const app = await serve({ windowMs: 60_000, limit: 3, ...headers, store: makeStore() });
            try {
              const out: Answer[] = [];
              const t0 = Date.now();
              for (let i = 0; i < 5; i++) out.push(await get(app.port));
              const t1 = Date.now();
              // X-RateLimit-Reset is a time, the window's end in Unix seconds (rounded up from
              // milliseconds that each store computes with a millisecond of play): checked on
              // every answer against the clock, then set aside before comparing two runs made a
              // moment apart.
              const [lo, hi] = [Math.ceil((t0 + 60_000 - 5) / 1000), Math.ceil((t1 + 60_000 + 5) / 1000)];
              for (const a of out) {
                const end = a.headers['x-ratelimit-reset'];
                if (end === undefined) continue;
                assert.ok(lo <= Number(end) && Number(end) <= hi, `window end ${end} outside [${lo}, ${hi}]`);
                a.headers['x-ratelimit-reset'] = 'the end of the window';
              }
              return out;
            } finally {
              await app.close();
            }
          };
          // One options object for both: rate-limit-redis ignores clientOptions (here only to keep
          // a loaded test machine from turning a slow answer into a failure policy's).
          const options = { sendCommand: sendCommand(library, o), clientOptions: PATIENT };
          const before = await run(() => new RedisStore(options));
          const now = await run(() => new RateLimitStore(options));
          assert.deepEqual(now, before);
          assert.deepEqual(now.map((a) => a.status), [200, 200, 200, 429, 429]);
          const remaining = headers.standardHeaders === 'draft-6' ? 'ratelimit-remaining' : headers.legacyHeaders ? 'x-ratelimit-remaining' : undefined;
          if (remaining) assert.deepEqual(now.map((a) => a.headers[remaining]), ['2', '1', '0', '0', '0']);
          if (headers.standardHeaders === 'draft-8') {
            assert.match(now[0]!.headers['ratelimit-policy']!, /^"3-in-1min"; q=3; w=60; pk=:[A-Za-z0-9+/=]+:$/);
            assert.match(now[1]!.headers['ratelimit']!, /^"3-in-1min"; r=1; t=60$/);
          }
          assert.deepEqual(now.slice(3).map((a) => a.headers['retry-after']), ['60', '60']);
          // What this store keeps: one fixed window of the module.
          assert.match(String(await cmd(admin, 'GET', 'rl:store:127.0.0.1')), /^(fw )?3 \d+$/);
        } finally {
          await o.close();
        }
      });
    }

    test(`${library}: 200 requests at once admit exactly the limit`, async () => {
      const o = open(library, server.port);
      await ready(o);
      const app = await serve({
        windowMs: 60_000,
        limit: 40,
        standardHeaders: 'draft-7',
        legacyHeaders: false,
        keyGenerator: () => `race-${library}`,
        store: new RateLimitStore({ sendCommand: sendCommand(library, o), clientOptions: { timeoutMs: 10_000 } }),
      });
      try {
        const answers = await Promise.all(Array.from({ length: 200 }, () => get(app.port)));
        assert.equal(answers.filter((a) => a.status === 200).length, 40);
        assert.equal(answers.filter((a) => a.status === 429).length, 160);
        const info = await app.limiter.getKey(`race-${library}`);
        assert.equal(info?.totalHits, 40);
      } finally {
        await app.close();
        await o.close();
      }
    });
  }

  test('skipFailedRequests: failures and refusals given back as with rate-limit-redis', async () => {
    const o = open('node-redis', server.port);
    await ready(o);
    try {
      const run = async (store: Store): Promise<[number[], number | undefined]> => {
        await cmd(admin, 'FLUSHALL');
        const app = await serve({ windowMs: 60_000, limit: 2, standardHeaders: 'draft-7', legacyHeaders: false, skipFailedRequests: true, store });
        try {
          const statuses: number[] = [];
          for (const path of ['/fail', '/fail', '/', '/', '/fail', '/', '/']) {
            statuses.push((await get(app.port, path)).status);
            // The decrement follows the response.
            await sleep(40);
          }
          return [statuses, (await app.limiter.getKey('127.0.0.1'))?.totalHits];
        } finally {
          await app.close();
        }
      };
      const options = { sendCommand: sendCommand('node-redis', o), clientOptions: PATIENT };
      const before = await run(new RedisStore(options));
      const now = await run(new RateLimitStore(options));
      assert.deepEqual(before, [[500, 500, 200, 200, 429, 429, 429], 2]);
      assert.deepEqual(now, before);
    } finally {
      await o.close();
    }
  });

  test('another algorithm, a limit per request, getKey and resetKey', async () => {
    const o = open('ioredis', server.port);
    await ready(o);
    try {
      const send = sendCommand('ioredis', o);
      const sliding = await serve({
        windowMs: 10_000,
        limit: 3,
        standardHeaders: 'draft-6',
        legacyHeaders: false,
        store: new RateLimitStore({ sendCommand: send, clientOptions: PATIENT, prefix: 'sw:', algorithm: ({ limit, windowMs }) => slidingWindow(limit, windowMs / 1000) }),
      });
      try {
        const answers: Answer[] = [];
        for (let i = 0; i < 4; i++) answers.push(await get(sliding.port));
        assert.deepEqual(answers.map((a) => [a.status, a.headers['ratelimit-remaining']]), [[200, '2'], [200, '1'], [200, '0'], [429, '0']]);
        assert.match(String(await cmd(admin, 'GET', 'sw:127.0.0.1')), /^(sw )?\d+ 3 0$/);
        assert.equal((await sliding.limiter.getKey('127.0.0.1'))?.totalHits, 3);
        await sliding.limiter.resetKey('127.0.0.1');
        assert.equal(Number(await cmd(admin, 'EXISTS', 'sw:127.0.0.1')), 0);
        assert.equal(await sliding.limiter.getKey('127.0.0.1'), undefined);
        assert.equal((await get(sliding.port)).status, 200);
      } finally {
        await sliding.close();
      }
      // A limit computed per request: the store counts every hit and express-rate-limit decides.
      const perRequest = await serve({
        windowMs: 60_000,
        limit: () => 2,
        standardHeaders: 'draft-7',
        legacyHeaders: false,
        store: new RateLimitStore({ sendCommand: send, clientOptions: PATIENT, prefix: 'pr:' }),
      });
      try {
        const statuses: number[] = [];
        for (let i = 0; i < 4; i++) statuses.push((await get(perRequest.port)).status);
        assert.deepEqual(statuses, [200, 200, 429, 429]);
        assert.equal((await perRequest.limiter.getKey('127.0.0.1'))?.totalHits, 4);
      } finally {
        await perRequest.close();
      }
    } finally {
      await o.close();
    }
  });
});
