/**
 * Hot keys against a real server, with node-redis and with ioredis: the deny cache (one call per
 * wait however many callers, the probe, its bound), what the conformance table cannot show
 * because it runs under the test clock; leased batches raced by several processes (one of them
 * killed with SIGKILL), against Redis's own count.
 */

import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import { Client, fixedWindow } from '../src/index.js';
import { type Admin, LIBRARIES, PACKAGE_ROOT, PATIENT, Server, cmd, modulePath, open, ready, serverBinary, sleep } from './harness.js';

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

/** A worker of the race (tests/hotworker.ts): its admissions as they come, then its summary. */
class Worker {
  admitted = 0;
  summary: Record<string, number> | undefined;
  readonly exited: Promise<number | null>;
  readonly proc: ChildProcess;
  private out = '';
  constructor(args: string[], onAdmit?: (w: Worker) => void) {
    this.proc = spawn(process.execPath, [join(PACKAGE_ROOT, 'build', 'tests', 'hotworker.js'), ...args], {
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, RL_REDIS_SERVER: serverBinary(), RL_MODULE: modulePath() },
    });
    this.proc.stdout!.setEncoding('utf8');
    this.proc.stdout!.on('data', (d: string) => {
      this.out += d;
      const nl = this.out.indexOf('\n');
      const head = nl < 0 ? this.out : this.out.slice(0, nl);
      this.admitted = [...head].filter((ch) => ch === 'a').length;
      onAdmit?.(this);
    });
    this.exited = new Promise((r) => this.proc.once('exit', (code) => r(code)));
  }
  async done(): Promise<void> {
    await this.exited;
    const lines = this.out.split('\n');
    if (lines.length > 1 && lines[1]!.trim() !== '') this.summary = JSON.parse(lines[1]!) as Record<string, number>;
  }
}

describe('leased batches raced by several processes', () => {
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

  test('a bounded table: an evicted entry gives its batch back; a lease that ends gives it back on a timer', async () => {
    await cmd(admin, 'FLUSHALL');
    await cmd(admin, 'CONFIG', 'RESETSTAT');
    const o = open('node-redis', server.port);
    await ready(o);
    try {
      const client = new Client(o.connection, { ...PATIENT, mode: 'module' }).withBatching({
        hotKeys: ['x', 'y', 'z', 't'],
        maxKeys: 2,
        initial: 4,
        leaseMs: 60_000,
      });
      const limit = fixedWindow(1000, 3600);
      const count = async (k: string): Promise<number> => Number(String(await cmd(admin, 'GET', k)).split(' ')[1]);
      for (const k of ['x', 'y', 'z']) assert.equal((await client.check(k, limit)).decision.remaining, 999);
      // x left the table (2 entries at most) and its 3 units went back.
      assert.equal(await client.flush(), 6);
      assert.deepEqual([await count('x'), await count('y'), await count('z')], [1, 1, 1]);
      assert.deepEqual(client.batchStats(), { refills: 3, granted: 12, used: 3, answered: 0, returned: 9, lapsed: 0, held: 0 });
      assert.equal(await calls(admin, 'rl.settle'), 3);
      // A lease of 100 ms: its 3 units go back by themselves.
      const short = new Client(o.connection, { ...PATIENT, mode: 'module' }).withBatching({ hotKeys: ['t'], initial: 4, leaseMs: 100 });
      assert.equal((await short.check('t', limit)).decision.remaining, 999);
      assert.equal(await count('t'), 4);
      await sleep(400);
      assert.equal(await count('t'), 1);
      assert.equal(short.batchStats().returned, 3);
      assert.equal(await short.close(), 0);
    } finally {
      await o.close();
    }
  });

  test('3 processes of 8 callers drain a limit of 3000: Redis counts exactly what they admitted, none over', async () => {
    await cmd(admin, 'FLUSHALL');
    await cmd(admin, 'CONFIG', 'RESETSTAT');
    const workers = [0, 1, 2].map((i) => new Worker([String(server.port), LIBRARIES[i % 2]!, 'race', '3000', '8', '64']));
    await Promise.all(workers.map((w) => w.done()));
    const admitted = workers.reduce((n, w) => n + w.admitted, 0);
    const count = Number(String(await cmd(admin, 'GET', 'race')).split(' ')[1]);
    assert.ok(workers.every((w) => w.summary !== undefined), 'every worker ended');
    assert.equal(count, admitted);
    assert.ok(admitted <= 3000, `${admitted} admitted`);
    // Batches did the work: far fewer calls than admissions.
    const answered = workers.reduce((n, w) => n + w.summary!['answered']!, 0);
    const refills = workers.reduce((n, w) => n + w.summary!['refills']!, 0);
    assert.ok(answered > admitted / 2, `${answered} of ${admitted} answered from batches`);
    assert.ok(refills < admitted / 4, `${refills} refills`);
    for (const w of workers) assert.equal(w.summary!['held'], 0);
    for (const w of workers) assert.equal(w.summary!['lapsed'], 0);
    process.stdout.write(`# race: admitted ${admitted} of 3000, Redis's count ${count}, ${answered} from batches, ${refills} refills\n`);
  });

  test('a process killed with SIGKILL loses at most its one batch (64 units), and nothing is admitted twice', async () => {
    await cmd(admin, 'FLUSHALL');
    let killedAt: number | undefined;
    const onAdmit = (w: Worker): void => {
      if (killedAt === undefined && w.admitted >= 300) {
        w.proc.kill('SIGKILL');
        killedAt = w.admitted;
      }
    };
    const workers = [
      new Worker([String(server.port), 'ioredis', 'crash', '3000', '8', '64'], onAdmit),
      new Worker([String(server.port), 'node-redis', 'crash', '3000', '8', '64']),
      new Worker([String(server.port), 'ioredis', 'crash', '3000', '8', '64']),
    ];
    await Promise.all(workers.map((w) => w.done()));
    assert.notEqual(killedAt, undefined);
    assert.equal(workers[0]!.summary, undefined);
    const admitted = workers.reduce((n, w) => n + w.admitted, 0);
    const count = Number(String(await cmd(admin, 'GET', 'crash')).split(' ')[1]);
    const lost = count - admitted;
    assert.ok(admitted <= 3000, `${admitted} admitted`);
    assert.ok(lost >= 0 && lost <= 64, `Redis counted ${count}, the processes admitted ${admitted}`);
    process.stdout.write(`# crash: killed after ${workers[0]!.admitted} admissions; admitted ${admitted} of 3000, Redis's count ${count}, lost ${lost}\n`);
  });
});
