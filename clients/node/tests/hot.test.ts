/**
 * Hot keys against a real server, with node-redis and with ioredis: the deny cache (one call per
 * wait however many callers, the probe, its bound), what the conformance table cannot show
 * because it runs under the test clock.
 */

import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import { Client, fixedWindow } from '../src/index.js';
import { type Admin, LIBRARIES, PATIENT, Server, cmd, open, ready, sleep } from './harness.js';

async function calls(admin: Admin, command: string): Promise<number> {
  const info = String(await cmd(admin, 'INFO', 'commandstats'));
  const m = new RegExp(`^cmdstat_${command.replace('.', '\\.')}:calls=(\\d+)`, 'm').exec(info);
  return m ? Number(m[1]) : 0;
}

describe('the deny cache', () => {
  let server: Server;
  let admin: Admin;
  before(async () => {
    server = await Server.start();
    admin = await server.admin();
  });
  after(async () => {
    admin.destroy();
    await server.stop();
  });

  for (const library of LIBRARIES) {
    test(`${library}: a denied key costs one call per wait, whatever the callers; the probe; never an admission`, async () => {
      const o = open(library, server.port);
      await ready(o);
      const client = new Client(o.connection, { ...PATIENT, mode: 'module' }).withDenyCache(100);
      try {
        await cmd(admin, 'FLUSHALL');
        await cmd(admin, 'CONFIG', 'RESETSTAT');
        const limit = fixedWindow(1, 1);
        const first = await client.check('k', limit);
        assert.equal(first.decision.allowed, true);
        const denied = await client.check('k', limit);
        assert.equal(denied.decision.allowed, false);
        assert.equal(denied.answeredLocally, undefined);
        assert.equal(client.denyCacheLen, 1);
        // 50 callers at once, all denied in the process: no call.
        const burst = await Promise.all(Array.from({ length: 50 }, () => client.check('k', limit)));
        assert.deepEqual(
          burst.map((b) => [b.decision.allowed, b.answeredLocally, b.granted]),
          Array.from({ length: 50 }, () => [false, 'deny_cache', 0]),
        );
        for (const b of burst) assert.ok(b.decision.retryAfterMs >= 1 && b.decision.retryAfterMs <= denied.decision.retryAfterMs);
        assert.equal(await calls(admin, 'rl.fixedwindow'), 2);
        // The entry's wait over (and the server's window with it): one probe, the others answered
        // from the entry while it is in flight.
        const until = client.deniedUntil([['k', limit]], 1)!;
        await sleep(Math.max(until - performance.now(), 0) + 50);
        const after = await Promise.all(Array.from({ length: 20 }, () => client.check('k', limit)));
        assert.equal(after.filter((b) => b.answeredLocally === 'deny_cache').length, 19);
        assert.equal(after.filter((b) => b.decision.allowed).length, 1);
        assert.equal(await calls(admin, 'rl.fixedwindow'), 3);
        // The probe's admission left nothing: the next check asks Redis, which denies again.
        const next = await client.check('k', limit);
        assert.equal(next.decision.allowed, false);
        assert.equal(next.answeredLocally, undefined);
        assert.equal(await calls(admin, 'rl.fixedwindow'), 4);
        // What Redis admitted in all: 2, in two windows, as its own count says.
        assert.equal(await cmd(admin, 'EXISTS', 'k'), 1);
      } finally {
        await o.close();
      }
    });
  }

  test('bounded: the least recently used entry is evicted; peeks, partial grants and other costs are not cached', async () => {
    const o = open('node-redis', server.port);
    await ready(o);
    const client = new Client(o.connection, { ...PATIENT, mode: 'module' }).withDenyCache(3);
    try {
      await cmd(admin, 'FLUSHALL');
      await cmd(admin, 'CONFIG', 'RESETSTAT');
      const limit = fixedWindow(1, 60);
      for (const k of ['a', 'b', 'c', 'd', 'e']) {
        assert.equal((await client.check(k, limit)).decision.allowed, true);
        assert.equal((await client.check(k, limit)).decision.allowed, false);
      }
      assert.equal(client.denyCacheCapacity, 3);
      assert.equal(client.denyCacheLen, 3);
      assert.equal(await calls(admin, 'rl.fixedwindow'), 10);
      const again = [];
      for (const k of ['e', 'd', 'c', 'a', 'b']) again.push((await client.check(k, limit)).answeredLocally ?? 'redis');
      // a and b were evicted; asking Redis again puts them back, evicting e and d (used least recently).
      assert.deepEqual(again, ['deny_cache', 'deny_cache', 'deny_cache', 'redis', 'redis']);
      assert.equal(await calls(admin, 'rl.fixedwindow'), 12);
      assert.equal((await client.check('c', limit)).answeredLocally, 'deny_cache');
      assert.equal((await client.check('d', limit)).answeredLocally, undefined);
      assert.equal(client.denyCacheLen, 3);
      assert.equal((await client.limiter(limit).peek('e')).answeredLocally, undefined);
      assert.equal((await client.checkUpto('e', limit, 1)).answeredLocally, undefined);
      assert.equal((await client.check('e', limit, 2)).decision.retryAfterMs, -1);
      assert.equal((await client.check('e', limit, 2)).answeredLocally, undefined);
      assert.equal(await calls(admin, 'rl.fixedwindow'), 17);
    } finally {
      await o.close();
    }
  });
});
