/**
 * 200 callers at once on one key: exactly `limit` admitted, in every mode, with both libraries,
 * and through the Express middleware over TCP (a rate limit, and requests in flight).
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { Client, type Lease, type Mode, concurrency, fixedWindow, policy, slidingLog, tokenBucket } from '../src/index.js';
import { type App, Gates, send, startApp } from './apps.js';
import { type Admin, LIBRARIES, Server, cmd, open, ready, sleep } from './harness.js';

const MODES: Mode[] = ['module', 'function', 'script'];
const RACERS = 200;

describe('200 racers', () => {
  let server: Server;
  let admin: Admin;
  before(async () => {
    server = await Server.start();
    admin = await server.admin();
    await cmd(admin, 'FUNCTION', 'LOAD', 'REPLACE', (await import('../src/index.js')).LIBRARY);
  });
  after(async () => {
    admin.destroy();
    await server.stop();
  });

  for (const library of LIBRARIES) {
    for (const mode of MODES) {
      test(`${library}, ${mode}: exactly the limit admitted, one lease per slot`, async () => {
        const o = open(library, server.port);
        await ready(o);
        // The race is about the server's atomicity: no call may fall back to the failure policy.
        const c = new Client(o.connection, { mode, timeoutMs: 10_000 });
        try {
          for (const [name, algo, limit] of [
            ['bucket', tokenBucket(50, 0.0001), 50],
            ['window', fixedWindow(37, 3600), 37],
            ['log', slidingLog(23, 3600), 23],
          ] as const) {
            const key = `${name}:${library}:${mode}`;
            const outs = await Promise.all(Array.from({ length: RACERS }, () => c.check(key, algo)));
            assert.ok(outs.every((x) => x.degraded === undefined && x.mode === mode));
            assert.equal(outs.filter((x) => x.decision.allowed).length, limit, name);
            const remaining = outs.filter((x) => x.decision.allowed).map((x) => x.decision.remaining).sort((a, b) => a - b);
            assert.deepEqual(remaining, Array.from({ length: limit }, (_, i) => i), `${name}: each remaining count once`);
          }
          const slots = `slots:${library}:${mode}`;
          const takes = await Promise.all(Array.from({ length: RACERS }, () => c.acquire(slots, concurrency(20, 60))));
          const leases = takes.map((t) => t.lease).filter((l): l is Lease => l !== undefined);
          assert.equal(leases.length, 20);
          assert.equal(Number(await cmd(admin, 'ZCARD', slots)), 20);
          assert.deepEqual(await Promise.all(leases.map((l) => l.release())), Array<boolean>(20).fill(true));
          assert.equal(Number(await cmd(admin, 'EXISTS', slots)), 0);
        } finally {
          await o.close();
        }
      });
    }
  }

  for (const library of LIBRARIES) {
    test(`${library}: 200 requests at once through Express over TCP: exactly the limit get 200, the others 429`, async () => {
      const o = open(library, server.port);
      await ready(o);
      const c = new Client(o.connection, { timeoutMs: 10_000 });
      const gates = new Gates();
      let app: App | undefined;
      try {
        app = await startApp('express', c, { key: { header: 'x-api-key' }, limits: [{ plan: '*', class: '*', policies: [policy('minute', fixedWindow(60, 60))] }] }, gates);
        const port = app.port;
        const replies = await Promise.all(Array.from({ length: RACERS }, () => send(port, { headers: { 'x-api-key': `race-${library}` } })));
        const ok = replies.filter((r) => r.status === 200);
        assert.equal(ok.length, 60);
        assert.equal(replies.filter((r) => r.status === 429).length, RACERS - 60);
        assert.deepEqual(
          ok.map((r) => Number(/r=(\d+)/.exec(r.headers['ratelimit']!)![1])).sort((a, b) => a - b),
          Array.from({ length: 60 }, (_, i) => i),
        );
        assert.equal(app.metrics.renderPrometheus().includes('ratelimit_decisions_total{limit="minute",outcome="allowed"} 60\n'), true);
      } finally {
        await app?.close();
        await o.close();
      }
    });
  }

  test('50 requests at once held in their handlers against 10 slots: 10 in, 40 refused, every slot back after', async () => {
    const o = open('node-redis', server.port);
    await ready(o);
    const c = new Client(o.connection, { timeoutMs: 10_000 });
    const gates = new Gates();
    let app: App | undefined;
    try {
      app = await startApp('express', c, { key: { header: 'x-api-key' }, limits: [{ plan: '*', class: '*', policies: [policy('inflight', concurrency(10, 30))] }] }, gates);
      const port = app.port;
      const replies = Array.from({ length: 50 }, () => send(port, { headers: { 'x-api-key': 'held', 'x-hold': 'all' } }));
      await gates.reached('all');
      // Every request answered or in its handler.
      const deadline = Date.now() + 10_000;
      while (Number(await cmd(admin, 'ZCARD', 'rl:{held}:default:inflight')) !== 10 || (await settledCount(replies)) < 40) {
        assert.ok(Date.now() < deadline, 'the requests never settled');
        await sleep(10);
      }
      gates.release('all');
      const all = await Promise.all(replies);
      assert.equal(all.filter((r) => r.status === 200).length, 10);
      assert.equal(all.filter((r) => r.status === 429).length, 40);
      while (Number(await cmd(admin, 'ZCARD', 'rl:{held}:default:inflight')) !== 0) {
        assert.ok(Date.now() < deadline, 'slots never given back');
        await sleep(5);
      }
    } finally {
      await app?.close();
      await o.close();
    }
  });
});

async function settledCount(ps: Array<Promise<unknown>>): Promise<number> {
  let n = 0;
  await Promise.all(ps.map((p) => Promise.race([p.then(() => (n += 1)), sleep(0)])));
  return n;
}
