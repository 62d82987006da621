/**
 * An application started while Redis is down, with the start of docs/node.md and the client's
 * default options: the start returns, every call is answered by the failure policy within a
 * deadline bound while Redis is down, and once Redis is up on that address the calls are decided
 * by Redis, exactly.
 */

import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { test } from 'node:test';

import { Redis } from 'ioredis';
import { createClient } from 'redis';

import { Client, type ConnectionSource, type Outcome, fixedWindow } from '../src/index.js';
import { LIBRARIES, type Library, Server, freePort, sleep } from './harness.js';

/** docs/node.md's start, line for line (the address aside). */
function start(library: Library, url: string): { redis: ConnectionSource; close(): void } {
  if (library === 'node-redis') {
    const redis = createClient({ url, disableOfflineQueue: true });
    redis.on('error', () => undefined); // node-redis reconnects by itself; log it here
    redis.connect().catch(() => undefined); // not awaited: the app starts while Redis is down
    return { redis, close: () => redis.destroy() };
  }
  const redis = new Redis(url, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
  });
  redis.on('error', () => undefined);
  return { redis, close: () => redis.disconnect() };
}

const window = fixedWindow(4, 3600);

for (const library of LIBRARIES) {
  test(`${library}: started while Redis is down, answered by the policy until it is up, then decided by Redis`, async () => {
    const port = await freePort();
    const t0 = performance.now();
    const app = start(library, `redis://127.0.0.1:${port}`);
    const limiter = new Client(app.redis);
    assert.ok(performance.now() - t0 < 2000, 'the start returned');
    let server: Server | undefined;
    try {
      // Down: the default policy (fail-open) answers, each call within a bound a loaded machine
      // meets (the deadline is 100 ms; a failed connection attempt answers at once).
      const down: Outcome[] = [];
      for (let i = 0; i < 6; i++) {
        const t = performance.now();
        const o = await limiter.check('started', window);
        const took = performance.now() - t;
        assert.ok(took < 1500, `call ${i + 1} answered after ${took.toFixed(0)} ms`);
        down.push(o);
        await sleep(50);
      }
      assert.deepEqual(
        down.map((o) => [o.degraded, o.mode, o.decision.allowed]),
        Array.from({ length: 6 }, () => ['fail-open', undefined, true]),
      );
      assert.equal(limiter.mode, undefined, 'nothing detected while down');

      server = await Server.start({ port });
      // Back: the library reconnects by itself and the breaker's cooldown (1 s) ends; from the
      // first call Redis decides, and exactly (4 of the window, then denied).
      const deadline = Date.now() + 15_000;
      let first: Outcome;
      for (;;) {
        first = await limiter.check('started', window);
        if (first.degraded === undefined) break;
        assert.ok(Date.now() < deadline, 'Redis never decided');
        await sleep(20);
      }
      const rest = [];
      for (let i = 0; i < 4; i++) rest.push(await limiter.check('started', window));
      assert.deepEqual(
        [first, ...rest].map((o) => [o.degraded, o.mode, o.decision.allowed, o.decision.remaining]),
        [
          [undefined, 'module', true, 3],
          [undefined, 'module', true, 2],
          [undefined, 'module', true, 1],
          [undefined, 'module', true, 0],
          [undefined, 'module', false, 0],
        ],
      );
      assert.equal(limiter.breakerOpen, false);
    } finally {
      app.close();
      await server?.stop();
    }
  });
}
