/**
 * Redis killed under each failure policy, then started again on the same port, with both
 * libraries: while it is down every answer is the policy's (and says so), leases and
 * reservations follow the policy, and once it is back (and the breaker's cooldown over) Redis
 * decides again on its own, empty, state.
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Client, type ClientOptions, type Outcome, concurrency, fixedWindow, tokenBucket } from '../src/index.js';
import { LIBRARIES, Server, open, ready, sleep } from './harness.js';

const bucket = tokenBucket(10, 0.0001);
const window = fixedWindow(4, 3600);
const slots = concurrency(4, 60);

async function backOnRedis(c: Client, key: string): Promise<Outcome> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const o = await c.check(key, window);
    if (o.degraded === undefined) return o;
    assert.ok(Date.now() < deadline, 'Redis never decided again');
    await sleep(20);
  }
}

const POLICIES: Array<[string, ClientOptions]> = [
  ['fail-open', { policy: 'fail-open' }],
  ['fail-closed', { policy: 'fail-closed', failClosedRetryMs: 1500 }],
  ['local for 2 instances', { policy: 'local', instances: 2 }],
];

for (const library of LIBRARIES) {
  for (const [name, policy] of POLICIES) {
    test(`${library}, ${name}: Redis stopped, then started again`, async () => {
      const server = await Server.start();
      const o = open(library, server.port);
      try {
        await ready(o);
        const c = new Client(o.connection, { ...policy, mode: 'module', timeoutMs: 1000, breaker: { failures: 1, cooldownMs: 100 } });
        const before = await c.check('k', bucket, 3);
        assert.deepEqual([before.degraded, before.mode, before.decision.remaining], [undefined, 'module', 7]);
        const held = (await c.acquire('s', slots)).lease!;
        assert.equal(held.holdsSlot, true);

        await server.kill();
        const down = await c.check('k', bucket, 3);
        const again = await c.check('k', bucket, 3);
        const multi = await c.checkAll([['{m}:a', bucket], ['{m}:b', window]], 2);
        const lease = await c.acquire('s', slots);
        const reserved = await c.reserve('r', bucket, 2);
        switch (policy.policy) {
          case 'fail-open':
            assert.deepEqual([down.degraded, down.decision], ['fail-open', { allowed: true, remaining: 10, retryAfterMs: 0, resetAfterMs: 0, limit: 10 }]);
            assert.deepEqual(again.decision, down.decision);
            assert.deepEqual([multi.degraded, multi.allowed, multi.deniedBy], ['fail-open', true, 0]);
            assert.deepEqual([lease.outcome.degraded, lease.lease?.holdsSlot], ['fail-open', false]);
            assert.deepEqual((await reserved.reservation!.settle(5)).decisions, [{ allowed: true, remaining: 10, retryAfterMs: 0, resetAfterMs: 0, limit: 10 }]);
            break;
          case 'fail-closed':
            assert.deepEqual([down.degraded, down.decision], ['fail-closed', { allowed: false, remaining: 0, retryAfterMs: 1500, resetAfterMs: 1500, limit: 10 }]);
            assert.deepEqual([multi.degraded, multi.allowed, multi.deniedBy], ['fail-closed', false, 1]);
            assert.deepEqual([lease.outcome.degraded, lease.outcome.decision.allowed, lease.lease], ['fail-closed', false, undefined]);
            assert.deepEqual([reserved.outcome.decision.allowed, reserved.reservation], [false, undefined]);
            break;
          default: {
            // Half of each limit in process: a bucket of 5 and a window of 2, two of four slots.
            assert.deepEqual([down.degraded, down.decision.allowed, down.decision.remaining, down.decision.limit], ['local', true, 2, 5]);
            assert.deepEqual([again.decision.allowed, again.decision.remaining], [false, 2]);
            assert.deepEqual([multi.degraded, multi.allowed, multi.decisions.map((d) => d.remaining)], ['local', true, [3, 0]]);
            assert.deepEqual([lease.outcome.degraded, lease.outcome.decision.remaining, lease.lease?.holdsSlot], ['local', 1, true]);
            const settled = await reserved.reservation!.settle(5);
            assert.deepEqual([settled.degraded, settled.decisions[0]!.remaining], ['local', 0]);
            assert.equal((await c.check('r', bucket)).decision.allowed, false, 'the local bucket is in debt');
            assert.equal(await lease.lease!.release(), true);
          }
        }
        // The lease taken on Redis cannot be given back now: it would expire there.
        assert.equal(await held.release(), false);
        assert.equal(c.breakerOpen, true);

        await server.launch();
        const back = await backOnRedis(c, 'w');
        assert.deepEqual([back.mode, back.decision.remaining], ['module', 3]);
        const fresh = await c.check('k', bucket, 3);
        assert.deepEqual([fresh.degraded, fresh.decision.remaining], [undefined, 7], 'a new server: an empty bucket state');
        assert.equal(c.breakerOpen, false);
      } finally {
        await o.close();
        await server.stop();
      }
    });
  }
}
