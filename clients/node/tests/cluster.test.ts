/**
 * A 3-master Redis Cluster, with the module on every node and without it (scripts, and the
 * Functions library loaded on every master): keys routed by slot with node-redis's cluster and
 * ioredis's (with its `Command` class, and through MOVED without it), several limits under one
 * hash tag in one call, refusals of keys in several slots, reservations and leases on every shard.
 */

import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import { Client, type Connection, LIBRARY, type Mode, RejectedError, concurrency, fixedWindow, gcra, keySlot, tokenBucket } from '../src/index.js';
import { type Admin, Cluster, PATIENT, type Server, cmd, sleep } from './harness.js';

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

/** Waits until `node` answers `ROLE` as a master. */
async function untilMaster(node: Server): Promise<void> {
  const a = await node.admin();
  try {
    const deadline = Date.now() + 30_000;
    while (((await cmd(a, 'ROLE')) as unknown[])[0] !== 'master') {
      if (Date.now() > deadline) throw new Error(`${node.port} never became a master`);
      await sleep(20);
    }
  } finally {
    a.destroy();
  }
}

/** Waits until `replica` has every write of `master` (their replication offsets equal). */
async function caughtUp(master: Server, replica: Server): Promise<void> {
  const m = await master.admin();
  const r = await replica.admin();
  const offset = async (a: Admin): Promise<string> => /master_repl_offset:(\d+)/.exec(String(await cmd(a, 'INFO', 'replication')))?.[1] ?? '';
  try {
    const deadline = Date.now() + 30_000;
    while ((await offset(m)) !== (await offset(r))) {
      if (Date.now() > deadline) throw new Error('the replica never caught up');
      await sleep(20);
    }
  } finally {
    m.destroy();
    r.destroy();
  }
}

/** `INFO commandstats` calls of `command` on each node. */
async function callsOn(nodes: Server[], command: string): Promise<number[]> {
  const out: number[] = [];
  for (const n of nodes) {
    const a = await n.admin();
    const m = new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(String(await cmd(a, 'INFO', 'commandstats')));
    out.push(m ? Number(m[1]) : 0);
    a.destroy();
  }
  return out;
}

describe('a cluster with a replica: durable admissions, then following a failover', () => {
  const key = 'follow:{user42}';
  let cluster: Cluster;
  let first: Server;
  let second: Server;
  before(async () => {
    cluster = await Cluster.start(true);
    first = await cluster.masterOf(keySlot(key));
    second = await cluster.addReplica(first);
  });
  after(async () => cluster.stop());

  for (const library of ['node-redis', 'ioredis'] as const) {
    test(`${library}: durable admissions: WAIT goes to the master of the call's key, on the lane's connection; a frozen replica makes the admission short (denied)`, async () => {
      const make = (): Promise<Conn> => (library === 'node-redis' ? cluster.nodeRedis() : cluster.ioredis(true));
      const conn = await make();
      const lanes = new Map<Connection, Conn>();
      const c = new Client(conn.connection, { mode: 'module', timeoutMs: 2000 }).withDurability({
        replicas: 1,
        timeoutMs: 300,
        connect: async () => {
          const l = await make();
          lanes.set(l.connection, l);
          return l.connection;
        },
        close: async (source) => lanes.get(source as Connection)?.close(),
      });
      const k = `${key}:${library}`;
      try {
        for (const n of cluster.nodes) {
          const a = await n.admin();
          await cmd(a, 'CONFIG', 'RESETSTAT');
          a.destroy();
        }
        const limit = fixedWindow(10, 3600);
        for (let i = 1; i <= 3; i++) {
          const o = await c.check(k, limit);
          assert.deepEqual([o.decision.allowed, o.decision.remaining, o.degraded], [true, 10 - i, undefined]);
        }
        assert.deepEqual(c.durabilityStats(), { acknowledged: 3, short: 0 });
        second.signal('SIGSTOP');
        try {
          const o = await c.check(k, limit);
          assert.deepEqual([o.decision.allowed, o.decision.remaining, o.decision.retryAfterMs, o.degraded], [false, 6, 1000, undefined]);
        } finally {
          second.signal('SIGCONT');
        }
        assert.deepEqual(c.durabilityStats(), { acknowledged: 3, short: 1 });
        const waits = await callsOn(cluster.nodes, 'wait');
        assert.deepEqual(waits, cluster.nodes.map((n) => (n === first ? 4 : 0)), 'every WAIT on the key\'s master');
        assert.equal(lanes.size, 1, 'one lane connection, taken and put back');
      } finally {
        await c.close();
        await conn.close();
      }
    });
  }

  test('ioredis: a manual CLUSTER FAILOVER (MOVED followed), then a frozen master whose replica took over (CLUSTER FAILOVER FORCE; the slots read again): the count carried on to the unit', async () => {
    const conn = await cluster.ioredis(true);
    try {
      const c = new Client(conn.connection, { mode: 'module', policy: 'fail-closed', failClosedRetryMs: 777, timeoutMs: 150, breaker: { failures: 1000 } });
      const algo = tokenBucket(100, 0.0001);
      for (let i = 1; i <= 5; i++) assert.deepEqual([(await c.check(key, algo, 1, PATIENT)).decision.remaining], [100 - i]);

      // A manual failover: the replica waits for every write of the master, then takes its
      // slots; the old master answers MOVED, which ioredis follows.
      const a = await second.admin();
      await cmd(a, 'CLUSTER', 'FAILOVER');
      a.destroy();
      await untilMaster(second);
      const moved = await c.check(key, algo, 1, PATIENT);
      assert.deepEqual([moved.degraded, moved.mode, moved.decision.remaining], [undefined, 'module', 94]);

      // The new master freezes: it answers nothing and sends no redirection.
      await caughtUp(second, first);
      second.signal('SIGSTOP');
      try {
        const t0 = performance.now();
        const unanswered = await c.check(key, algo);
        const took = performance.now() - t0;
        assert.deepEqual([unanswered.degraded, unanswered.decision.retryAfterMs], ['fail-closed', 777]);
        assert.ok(took >= 149, `answered after ${took} ms`);
        // The slots are being read again (ioredis asks the nodes): a call meanwhile is answered
        // by the policy at once, and sent nowhere.
        const t1 = performance.now();
        const meanwhile = await c.check(key, algo);
        assert.equal(meanwhile.degraded, 'fail-closed');
        assert.ok(performance.now() - t1 < 100, 'answered at once');

        const f = await first.admin();
        await cmd(f, 'CLUSTER', 'FAILOVER', 'FORCE');
        f.destroy();
        await untilMaster(first);
        // Each call without an answer has the slots read again, until they name the new master.
        let answered: Awaited<ReturnType<typeof c.check>> | undefined;
        for (let i = 0; i < 300 && answered === undefined; i++) {
          const o = await c.check(key, algo);
          if (o.degraded === undefined) answered = o;
          else await sleep(20);
        }
        assert.ok(answered !== undefined, 'the new master never answered');
        // The calls the frozen master was sent never reached the new one.
        assert.deepEqual([answered.mode, answered.decision.remaining], ['module', 93]);
      } finally {
        second.signal('SIGCONT');
      }
    } finally {
      await conn.close();
    }
  });
});
