/**
 * A 3-master Redis Cluster, with the module on every node and without it (scripts, and the
 * Functions library loaded on every master): keys routed by slot with node-redis's cluster and
 * ioredis's (with its `Command` class, and through MOVED without it), several limits under one
 * hash tag in one call, refusals of keys in several slots, reservations and leases on every shard.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { Client, type Connection, LIBRARY, type Mode, RejectedError, concurrency, fixedWindow, gcra, keySlot, tokenBucket } from '../src/index.js';
import { Cluster, PATIENT, cmd } from './harness.js';

type Conn = { connection: Connection; close(): Promise<void> };

async function exactlyItsCapacity(cluster: Cluster, conn: Conn, mode: Mode, tag: string): Promise<void> {
  const c = new Client(conn.connection, { mode, timeoutMs: 5000 });
  const algo = tokenBucket(3, 0.0001);
  for (let k = 0; k < 24; k++) {
    let allowed = 0;
    for (let i = 0; i < 4; i++) {
      const o = await c.check(`${tag}:user:${k}`, algo);
      assert.deepEqual([o.degraded, o.mode], [undefined, mode]);
      allowed += o.decision.allowed ? 1 : 0;
    }
    assert.equal(allowed, 3, `${tag}:user:${k}`);
  }
  // Several limits in one call: one hash tag puts them in one slot.
  for (const who of ['a', 'b', 'c', 'd']) {
    const limits = [
      [`{${tag}${who}}:route`, fixedWindow(2, 3600)],
      [`{${tag}${who}}:global`, gcra(9, 1, 3600)],
    ] as const;
    const seen: Array<[boolean, number]> = [];
    for (let i = 0; i < 3; i++) {
      const o = await c.checkAll(limits, 1);
      assert.equal(o.mode, mode);
      seen.push([o.allowed, o.deniedBy]);
    }
    assert.deepEqual(seen, [[true, 0], [true, 0], [false, 1]], who);
    const r = await c.reserveAll(limits, 0);
    const s = await r.reservation!.settle(0);
    assert.deepEqual([s.mode, s.decisions.map((d) => d.remaining)], [mode, [0, 8]]);
  }
  // Keys of other slots in one call: Redis refuses (CROSSSLOT), nothing is degraded.
  const a = `${tag}-x`;
  let b = `${tag}-y`;
  for (let i = 0; keySlot(a) === keySlot(b); i++) b = `${tag}-y${i}`;
  await assert.rejects(
    c.checkAll([[a, fixedWindow(2, 60)], [b, fixedWindow(2, 60)]], 1),
    (e) => e instanceof RejectedError && e.code === 'CROSSSLOT',
  );
  // Reservations and leases on every shard.
  for (let k = 0; k < 6; k++) {
    const key = `${tag}:budget:${k}`;
    const r = await c.reserve(key, tokenBucket(100, 0.0001), 40);
    const s = await r.reservation!.settle(10);
    assert.deepEqual([s.mode, s.decisions[0]!.remaining], [mode, 90]);
    const l = await c.acquire(`${tag}:slots:${k}`, concurrency(1, 30));
    assert.equal((await c.acquire(`${tag}:slots:${k}`, concurrency(1, 30))).outcome.decision.allowed, false);
    assert.equal(await l.lease!.release(), true);
  }
  const sizes = await cluster.dbsizes();
  assert.ok(sizes.every((n) => n > 0), `keys on every shard: ${sizes}`);
}

async function libraries(cluster: Cluster): Promise<Array<[string, () => Promise<Conn>]>> {
  return [
    ['node-redis', () => cluster.nodeRedis()],
    ['ioredis with Command', () => cluster.ioredis(true)],
    ['ioredis through MOVED', () => cluster.ioredis(false)],
  ];
}

describe('a cluster with the module on every node', () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.start(true);
  });
  after(async () => cluster.stop());

  test('every library routes each key to its master', async () => {
    for (const [name, make] of await libraries(cluster)) {
      const conn = await make();
      try {
        await exactlyItsCapacity(cluster, conn, 'module', name.replace(/ /g, '-'));
        const c = await Client.open(conn.connection, PATIENT);
        assert.equal(c.mode, 'module', 'detected on a node');
      } finally {
        await conn.close();
      }
    }
  });
});

describe('a cluster without the module', () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.start(false);
  });
  after(async () => cluster.stop());

  test('the scripts (loaded again on NOSCRIPT on the key\'s node), then the Functions library loaded on every master', async () => {
    for (const [name, make] of await libraries(cluster)) {
      const conn = await make();
      try {
        await exactlyItsCapacity(cluster, conn, 'script', `s-${name.replace(/ /g, '-')}`);
      } finally {
        await conn.close();
      }
    }
    for (const n of cluster.nodes) {
      const a = await n.admin();
      assert.equal(await cmd(a, 'FUNCTION', 'LOAD', 'REPLACE', LIBRARY), 'ratelimit');
      a.destroy();
    }
    for (const [name, make] of await libraries(cluster)) {
      const conn = await make();
      try {
        const c = await Client.open(conn.connection, PATIENT);
        assert.equal(c.mode, 'function');
        await exactlyItsCapacity(cluster, conn, 'function', `f-${name.replace(/ /g, '-')}`);
      } finally {
        await conn.close();
      }
    }
  });
});
