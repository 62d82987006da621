/**
 * Following a Sentinel failover with ioredis's Sentinel support: the client asks the Sentinel
 * where the master is (ioredis does), a `SENTINEL FAILOVER` promotes the replica, and the calls
 * carry on on the new master from the replicated count, to the unit. A call that meets the old
 * master turned replica (`READONLY`) is a rejection, and the client drops the connection so
 * that ioredis asks the Sentinel again; one that meets no connection is answered by the failure
 * policy. The Sentinel is the server binary under test in sentinel mode.
 */

import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { Redis as IORedis } from 'ioredis';

import { Client, RejectedError, fixedWindow, fromIORedis } from '../src/index.js';
import { type Admin, Server, cmd, freePort, serverBinary, serverVersion, sleep } from './harness.js';

let master: Server;
let replica: Server;
let sentinel: ChildProcess | undefined;
let sentinelPort = 0;
let dir = '';

async function sentinelCmd(...args: string[]): Promise<unknown> {
  const c = new IORedis(sentinelPort, '127.0.0.1', { lazyConnect: true, maxRetriesPerRequest: 0 });
  c.on('error', () => undefined);
  try {
    await c.connect();
    return await c.call(args[0]!, ...args.slice(1));
  } finally {
    c.disconnect();
  }
}

before(async () => {
  master = await Server.start({ extra: ['--repl-diskless-sync-delay', '0'] });
  replica = await Server.start({ extra: ['--replicaof', '127.0.0.1', String(master.port), '--repl-diskless-sync-delay', '0'] });
  const admin = await master.admin();
  try {
    const until = Date.now() + 10_000;
    while (!/slave0:.*state=online/.test(String(await cmd(admin, 'INFO', 'replication')))) {
      if (Date.now() > until) throw new Error('the replica never came online');
      await sleep(20);
    }
  } finally {
    admin.destroy();
  }
  dir = mkdtempSync(join(tmpdir(), 'rl-sentinel-'));
  sentinelPort = await freePort();
  const conf = join(dir, 'sentinel.conf');
  writeFileSync(
    conf,
    [
      `port ${sentinelPort}`,
      'bind 127.0.0.1',
      `dir ${dir}`,
      `sentinel monitor mymaster 127.0.0.1 ${master.port} 1`,
      'sentinel down-after-milliseconds mymaster 400',
      'sentinel failover-timeout mymaster 5000',
      '',
    ].join('\n'),
  );
  sentinel = spawn(serverBinary(), [conf, '--sentinel'], { stdio: 'ignore' });
  const deadline = Date.now() + 15_000;
  for (;;) {
    try {
      const replicas = (await sentinelCmd('SENTINEL', 'REPLICAS', 'mymaster')) as string[][];
      const ok = replicas.some((r) => {
        const flags = r[r.indexOf('flags') + 1] ?? '';
        return flags === 'slave';
      });
      if (ok) break;
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) throw new Error('the Sentinel never saw the replica');
    await sleep(100);
  }
});

after(async () => {
  sentinel?.kill('SIGKILL');
  await replica.stop();
  await master.stop();
  rmSync(dir, { recursive: true, force: true });
});

test(`ioredis Sentinel on ${serverVersion()}: a SENTINEL FAILOVER, and the new master carries on from the replicated count`, async () => {
  const redis = new IORedis({
    sentinels: [{ host: '127.0.0.1', port: sentinelPort }],
    name: 'mymaster',
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    sentinelRetryStrategy: () => 50,
    retryStrategy: () => 50,
  });
  redis.on('error', () => undefined);
  const admins: Admin[] = [];
  try {
    await new Promise<void>((r) => redis.once('ready', () => r()));
    const client = new Client(fromIORedis(redis), { timeoutMs: 500, mode: 'module', breaker: { failures: 1000 } });
    const limit = fixedWindow(1000, 3600);
    let counted = 0;
    for (let i = 0; i < 5; i++) {
      const o = await client.check('f', limit);
      assert.deepEqual([o.decision.allowed, o.decision.remaining, o.degraded], [true, 999 - i, undefined]);
      counted += 1;
    }
    // Acknowledged by the replica before the switch (the failover promotes it as it is).
    const oldAdmin = await master.admin();
    assert.equal(await cmd(oldAdmin, 'WAIT', 1, 1000), 1);
    oldAdmin.destroy();
    assert.equal(await sentinelCmd('SENTINEL', 'FAILOVER', 'mymaster'), 'OK');
    // The switch done: the Sentinel names the replica, and the old master is a replica of it.
    const until = Date.now() + 15_000;
    for (;;) {
      const addr = (await sentinelCmd('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', 'mymaster')) as string[];
      // A connection of its own each time: the Sentinel closes the old master's clients.
      let role = '';
      try {
        const a = await master.admin();
        role = String(await cmd(a, 'ROLE'));
        a.destroy();
      } catch {
        // closed under it: asked again
      }
      if (Number(addr[1]) === replica.port && role.startsWith('slave')) break;
      if (Date.now() > until) throw new Error('the failover did not end');
      await sleep(20);
    }
    // Calls every 20 ms until one is answered: the old connection meets READONLY (a rejection,
    // and the connection is dropped) or was closed by the Sentinel (the failure policy answers);
    // ioredis then asks the Sentinel and connects to the new master.
    const seen = { redis: 0, degraded: 0, rejected: 0 };
    const deadline = Date.now() + 15_000;
    let last: number | undefined;
    for (;;) {
      try {
        const o = await client.check('f', limit);
        if (o.degraded !== undefined) seen.degraded += 1;
        else {
          seen.redis += 1;
          counted += 1;
          last = o.decision.remaining;
          break;
        }
      } catch (e) {
        assert.ok(e instanceof RejectedError && e.code === 'READONLY', String(e));
        seen.rejected += 1;
      }
      if (Date.now() > deadline) throw new Error(`no answer from the new master: ${JSON.stringify(seen)}`);
      await sleep(20);
    }
    const addr = (await sentinelCmd('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', 'mymaster')) as string[];
    assert.equal(Number(addr[1]), replica.port);
    // A few more on the new master: every admission counted once, across the failover.
    for (let i = 0; i < 3; i++) {
      const o = await client.check('f', limit);
      assert.equal(o.degraded, undefined);
      counted += 1;
      last = o.decision.remaining;
    }
    const newMaster = await replica.admin();
    admins.push(newMaster);
    assert.equal(String(await cmd(newMaster, 'GET', 'f')).split(' ')[1], String(counted));
    assert.equal(last, 1000 - counted);
    process.stdout.write(`# failover: ${JSON.stringify(seen)} calls until the new master answered; ${counted} admitted in all, the new master's count ${counted}\n`);
  } finally {
    for (const a of admins) a.destroy();
    redis.disconnect();
  }
});
