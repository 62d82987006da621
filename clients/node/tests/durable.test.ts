/**
 * Durable admissions against a real master and replica (`--replicaof`, the module loaded on
 * both), with node-redis and with ioredis: `WAIT` after every admitting write on a connection of
 * the durable lane, what an admission fewer replicas acknowledged becomes, and `WAITAOF` (or, on
 * a server without it, `WAIT`).
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { Client, type Connection, type Durability, UnsupportedError, fixedWindow } from '../src/index.js';
import { type Admin, LIBRARIES, type Library, type Opened, Server, cmd, open, ready, serverVersion, sleep } from './harness.js';

async function calls(admin: Admin, command: string): Promise<number> {
  const info = String(await cmd(admin, 'INFO', 'commandstats'));
  const m = new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info);
  return m ? Number(m[1]) : 0;
}

/** Whether the server has WAITAOF (Redis 7.2 and later, Valkey). */
function hasWaitaof(): boolean {
  const [name, version] = serverVersion().split(' ');
  const [major, minor] = version!.split('.').map(Number) as [number, number];
  return name !== 'redis' || major > 7 || (major === 7 && minor >= 2);
}

/** The lane's connections: opened with `library` on `port`, ready, and closed by `close`. */
function lane(library: Library, port: number, opened: Map<Connection, Opened>): Pick<Durability, 'connect' | 'close'> {
  return {
    connect: async () => {
      const o = open(library, port);
      await ready(o);
      opened.set(o.connection, o);
      return o.connection;
    },
    close: async (c) => {
      await opened.get(c as Connection)?.close();
      opened.delete(c as Connection);
    },
  };
}

describe(`durable admissions on ${serverVersion()}`, () => {
  let master: Server;
  let replica: Server;
  let admin: Admin;
  let replicaAdmin: Admin;
  before(async () => {
    master = await Server.start();
    replica = await Server.start({
      extra: ['--replicaof', '127.0.0.1', String(master.port), '--repl-diskless-sync-delay', '0', '--appendonly', 'yes', '--appendfsync', 'always'],
    });
    admin = await master.admin();
    replicaAdmin = await replica.admin();
    const deadline = Date.now() + 10_000;
    while (!/slave0:.*state=online/.test(String(await cmd(admin, 'INFO', 'replication')))) {
      if (Date.now() > deadline) throw new Error('the replica never came online');
      await sleep(20);
    }
  });
  after(async () => {
    admin.destroy();
    replicaAdmin.destroy();
    await replica.stop();
    await master.stop();
  });

  for (const library of LIBRARIES) {
    test(`${library}: WAIT after each admission, on the lane; denials answered at once; the replica holds the count`, async () => {
      await cmd(admin, 'FLUSHALL');
      await cmd(admin, 'CONFIG', 'RESETSTAT');
      const o = open(library, master.port);
      await ready(o);
      const opened = new Map<Connection, Opened>();
      const client = new Client(o.connection, { timeoutMs: 2000, mode: 'module' }).withDurability({
        replicas: 1,
        timeoutMs: 1000,
        ...lane(library, master.port, opened),
      });
      try {
        const limit = fixedWindow(3, 60);
        const got = [];
        for (let i = 0; i < 5; i++) {
          const r = await client.check('d', limit);
          got.push([r.decision.allowed, r.decision.remaining, r.granted, r.degraded]);
        }
        assert.deepEqual(got, [
          [true, 2, 1, undefined],
          [true, 1, 1, undefined],
          [true, 0, 1, undefined],
          [false, 0, 0, undefined],
          [false, 0, 0, undefined],
        ]);
        assert.deepEqual(client.durabilityStats(), { acknowledged: 3, short: 0 });
        assert.equal(await calls(admin, 'wait'), 3);
        // A peek writes nothing: no lane, no WAIT.
        assert.equal((await client.limiter(limit).peek('d')).decision.remaining, 0);
        assert.equal(await calls(admin, 'wait'), 3);
        // Each WAIT went on a lane connection: one was enough for calls one after the other.
        assert.equal(opened.size, 1);
        // Acknowledged: the replica has the count already.
        assert.equal(String(await cmd(replicaAdmin, 'GET', 'd')).split(' ')[1], '3');
        // A partial grant and RL.ALL wait too.
        assert.equal((await client.checkUpto('u', fixedWindow(10, 60), 4)).granted, 4);
        const all = await client.checkAll([['{p}:a', limit], ['{p}:b', limit]], 2);
        assert.equal(all.allowed, true);
        assert.deepEqual(client.durabilityStats(), { acknowledged: 5, short: 0 });
        assert.equal(String(await cmd(replicaAdmin, 'GET', '{p}:b')).split(' ')[1], '2');
        await client.close();
        assert.equal(opened.size, 0);
      } finally {
        await o.close();
      }
    });
  }

  test('fewer replicas than asked: denied (the units spent), admitted and counted, or the failure policy', async () => {
    await cmd(admin, 'FLUSHALL');
    const o = open('node-redis', master.port);
    await ready(o);
    const opened = new Map<Connection, Opened>();
    try {
      const limit = fixedWindow(10, 60);
      const two = (short: Durability['short']): Durability => ({ replicas: 2, timeoutMs: 100, short, ...lane('node-redis', master.port, opened) });
      const deny = new Client(o.connection, { timeoutMs: 2000, mode: 'module' }).withDurability(two('deny'));
      const r = await deny.check('s', limit);
      assert.deepEqual([r.decision.allowed, r.decision.remaining, r.decision.retryAfterMs, r.granted, r.degraded], [false, 9, 1000, 0, undefined]);
      assert.equal(String(await cmd(admin, 'GET', 's')).split(' ')[1], '1');
      assert.deepEqual(deny.durabilityStats(), { acknowledged: 0, short: 1 });
      const admit = new Client(o.connection, { timeoutMs: 2000, mode: 'module' }).withDurability(two('admit'));
      const a = await admit.check('s', limit);
      assert.deepEqual([a.decision.allowed, a.decision.remaining, a.granted], [true, 8, 1]);
      assert.deepEqual(admit.durabilityStats(), { acknowledged: 0, short: 1 });
      const policy = new Client(o.connection, { timeoutMs: 2000, mode: 'module', policy: 'fail-closed' }).withDurability(two('failure-policy'));
      const p = await policy.check('s', limit);
      assert.deepEqual([p.decision.allowed, p.degraded], [false, 'fail-closed']);
      assert.equal(String(await cmd(admin, 'GET', 's')).split(' ')[1], '3');
      // Refused before any call: no replica, or a WAIT as long as the call's whole budget.
      assert.throws(() => new Client(o.connection, { timeoutMs: 100 }).withDurability({ ...two('deny'), replicas: 0 }), UnsupportedError);
      assert.throws(() => new Client(o.connection, { timeoutMs: 100 }).withDurability({ ...two('deny'), timeoutMs: 100 }), UnsupportedError);
      for (const c of [deny, admit, policy]) await c.close();
    } finally {
      await o.close();
    }
  });

  test(`aof: WAITAOF 0 1 (${hasWaitaof() ? 'the server has it' : 'WAIT: the server has no WAITAOF'}), acknowledged by a replica with appendonly yes`, async () => {
    await cmd(admin, 'FLUSHALL');
    await cmd(admin, 'CONFIG', 'RESETSTAT');
    const o = open('ioredis', master.port);
    await ready(o);
    const opened = new Map<Connection, Opened>();
    const client = new Client(o.connection, { timeoutMs: 2000, mode: 'module' }).withDurability({
      replicas: 1,
      timeoutMs: 1000,
      aof: true,
      ...lane('ioredis', master.port, opened),
    });
    try {
      for (let i = 0; i < 3; i++) assert.equal((await client.check('f', fixedWindow(10, 60))).decision.allowed, true);
      assert.deepEqual(client.durabilityStats(), { acknowledged: 3, short: 0 });
      if (hasWaitaof()) assert.deepEqual([await calls(admin, 'waitaof'), await calls(admin, 'wait')], [3, 0]);
      // Redis 7.0: one WAITAOF refused as unknown (not counted as a call), then WAIT for each.
      else assert.deepEqual([await calls(admin, 'waitaof'), await calls(admin, 'wait')], [0, 3]);
      await client.close();
    } finally {
      await o.close();
    }
  });
});
