/**
 * The client's own behaviour against a real server, with node-redis and with ioredis: timeouts and
 * abort signals, the breaker, leases with `await using`, `withLease` and `keepAlive`, the
 * options' defaults.
 */

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import {
  Client,
  type ClientOptions,
  type Connection,
  type Mode,
  type Outcome,
  RejectedError,
  UnsupportedError,
  concurrency,
  tokenBucket,
} from '../src/index.js';
import { type Admin, LIBRARIES, type Library, type Opened, PACKAGE_ROOT, PATIENT, Server, cmd, open, ready, sleep } from './harness.js';

const MODES: Mode[] = ['module', 'function', 'script'];
const bucket = tokenBucket(5, 0.001);

async function calls(admin: Admin, command: string): Promise<number> {
  const info = String(await cmd(admin, 'INFO', 'commandstats'));
  const m = new RegExp(`^cmdstat_${command.replace('.', '\\.')}:calls=(\\d+)`, 'm').exec(info);
  return m ? Number(m[1]) : 0;
}

/** Runs `fn` while the server holds every client's writes (or every command), then lets go. */
async function paused<T>(admin: Admin, what: 'WRITE' | 'ALL', fn: () => Promise<T>): Promise<T> {
  // Long enough for a loaded machine: it ends with the UNPAUSE, not by itself.
  await cmd(admin, 'CLIENT', 'PAUSE', '10000', what);
  try {
    return await fn();
  } finally {
    await cmd(admin, 'CLIENT', 'UNPAUSE');
  }
}

/** A connection of `library` to `server`, ready. */
async function connect(library: Library, server: Server): Promise<Opened> {
  const o = open(library, server.port);
  await ready(o);
  return o;
}

describe('timeouts, abort signals and the breaker', () => {
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
    for (const mode of MODES) {
      test(`${library}, ${mode}: a call that outlasts its timeout gets the failure policy's answer`, async () => {
        const a = await connect(library, server);
        try {
          if (mode === 'function') await new Client(a.connection, PATIENT).loadLibrary();
          const c = new Client(a.connection, { ...PATIENT, mode, policy: 'fail-closed', failClosedRetryMs: 777 });
          const [o, took] = await paused(admin, 'WRITE', async () => {
            const t0 = performance.now();
            const out = await c.check(`slow:${library}:${mode}`, bucket, 1, { timeoutMs: 60 });
            return [out, performance.now() - t0] as const;
          });
          assert.deepEqual([o.degraded, o.mode, o.decision], ['fail-closed', undefined, { allowed: false, remaining: 0, retryAfterMs: 777, resetAfterMs: 777, limit: 5 }]);
          assert.ok(took >= 55 && took < 2000, `answered after ${took} ms`);
        } finally {
          await a.close();
        }
      });
    }

    test(`${library}: a caller's abort rejects with its reason, is no failure, and sends nothing when already aborted`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { ...PATIENT, mode: 'module', breaker: { failures: 1 } });
        await cmd(admin, 'CONFIG', 'RESETSTAT');
        const gone = new Error('the caller went away');
        await assert.rejects(c.check('abort', bucket, 1, { signal: AbortSignal.abort(gone) }), (e) => e === gone);
        assert.equal(await calls(admin, 'rl.tokenbucket'), 0, 'nothing sent');
        await paused(admin, 'WRITE', async () => {
          const ac = new AbortController();
          const pending = c.check('abort', bucket, 1, { signal: ac.signal, timeoutMs: 5000 });
          setTimeout(() => ac.abort(gone), 30);
          const t0 = performance.now();
          await assert.rejects(pending, (e) => e === gone);
          assert.ok(performance.now() - t0 < 2500, 'given up before the timeout of 5 s');
        });
        assert.equal(c.breakerOpen, false, 'an abort is not a failure of Redis');
      } finally {
        await a.close();
      }
    });

    test(`${library}: the breaker opens after its failures, skips Redis for its cooldown, then closes on a trial call`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', timeoutMs: 50, breaker: { failures: 2, cooldownMs: 1500 } });
        const key = `breaker:${library}`;
        const opened = await paused(admin, 'WRITE', async () => {
          assert.equal((await c.check(key, bucket)).degraded, 'fail-open');
          assert.equal(c.breakerOpen, false, 'one failure of two');
          assert.equal((await c.check(key, bucket)).degraded, 'fail-open');
          assert.equal(c.breakerOpen, true);
          return performance.now();
        });
        // The two paused calls are served now (3 of 5 left); the next ones must not reach Redis.
        const deadline = Date.now() + 5000;
        while (((await cmd(admin, 'RL.TOKENBUCKET', key, 5, 0.001, 0)) as number[])[1] !== 3) {
          assert.ok(Date.now() < deadline, 'the paused calls never ran');
          await sleep(5);
        }
        await cmd(admin, 'CONFIG', 'RESETSTAT');
        const skipped = await c.check(key, bucket);
        assert.equal(skipped.degraded, 'fail-open');
        assert.equal(await calls(admin, 'rl.tokenbucket'), 0, 'Redis skipped while open');
        assert.ok(performance.now() - opened < 1500, 'still within the cooldown');
        await sleep(Math.max(0, 1520 - (performance.now() - opened)));
        const trial = await c.check(key, bucket, 1, { timeoutMs: 2000 });
        assert.deepEqual([trial.degraded, trial.mode, trial.decision.remaining], [undefined, 'module', 2]);
        assert.equal(c.breakerOpen, false);
        assert.equal(await calls(admin, 'rl.tokenbucket'), 1);
      } finally {
        await a.close();
      }
    });
  }
});

describe('leases', () => {
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
  const two = concurrency(2, 1);

  for (const library of LIBRARIES) {
    for (const mode of MODES) {
      test(`${library}, ${mode}: await using gives the slot back at the end of the block, withLease in finally`, async () => {
        const a = await connect(library, server);
        try {
          if (mode === 'function') await new Client(a.connection, PATIENT).loadLibrary();
          const c = new Client(a.connection, { ...PATIENT, mode });
          const key = `slots:${library}:${mode}`;
          {
            await using first = (await c.acquire(key, two)).lease!;
            await using second = (await c.acquire(key, two)).lease!;
            assert.equal(Number(await cmd(admin, 'ZCARD', key)), 2);
            assert.deepEqual([first.holdsSlot, second.holdsSlot], [true, true]);
            const third = await c.acquire(key, two);
            assert.deepEqual([third.outcome.decision.allowed, third.lease], [false, undefined]);
          }
          assert.equal(Number(await cmd(admin, 'ZCARD', key)), 0, 'both given back');
          const failed = c.withLease(key, two, async (lease) => {
            assert.equal(Number(await cmd(admin, 'ZSCORE', key, lease.id)) > 0, true);
            throw new Error('the work failed');
          });
          await assert.rejects(failed, /the work failed/);
          assert.equal(Number(await cmd(admin, 'ZCARD', key)), 0, 'given back in finally');
          const done = await c.withLease(key, two, async () => 42);
          assert.deepEqual([done.outcome.decision.allowed, done.result], [true, 42]);
          assert.equal(Number(await cmd(admin, 'ZCARD', key)), 0);
          await assert.rejects(c.check(key, two, 1), UnsupportedError);
        } finally {
          await a.close();
        }
      });
    }

    test(`${library}: keepAlive renews a lease past its expiry until it is released`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { ...PATIENT, mode: 'module' });
        const key = `kept:${library}`;
        const { lease } = await c.acquire(key, concurrency(1, 1));
        lease!.keepAlive(150);
        await sleep(1500);
        assert.equal(lease!.lastRenewal?.decision.allowed, true);
        const other = await c.acquire(key, concurrency(1, 1));
        assert.equal(other.outcome.decision.allowed, false, 'still held after one and a half leases');
        assert.equal(await lease!.release(), true);
        assert.equal(await lease!.release(), false, 'released once');
        await sleep(250);
        assert.equal((await c.acquire(key, concurrency(1, 1))).outcome.decision.allowed, true, 'no renewal after the release');
      } finally {
        await a.close();
      }
    });
  }

  for (const library of LIBRARIES) {
    test(`${library}: a release waits for the renewal on its way: none lands after it and takes the slot again`, async () => {
      const a = await connect(library, server);
      try {
        // A path on which each renewal (every RL.ACQUIRE after the first) takes 150 ms to reach
        // Redis, as on a slow or loaded network: released on a keep-alive tick, the renewal
        // already on its way must not land after the release.
        let acquires = 0;
        let onTheirWay = 0;
        const slow: Connection = {
          send: async (args, key, signal) => {
            if (args[0] === 'RL.ACQUIRE' && ++acquires > 1) {
              onTheirWay += 1;
              await sleep(150);
              onTheirWay -= 1;
            }
            return a.connection.send(args, key, signal);
          },
        };
        const c = new Client(slow, { ...PATIENT, mode: 'module' });
        const key = `renewing:${library}`;
        const lease = (await c.acquire(key, concurrency(1, 30))).lease!;
        lease.keepAlive(20);
        while (onTheirWay === 0) await sleep(2);
        assert.equal(await lease.release(), true);
        assert.equal(onTheirWay, 0, 'no renewal on its way once released');
        const sent = acquires;
        assert.equal(Number(await cmd(admin, 'ZCARD', key)), 0, 'released');
        await sleep(300);
        assert.equal(acquires, sent, 'no renewal after the release');
        assert.equal(Number(await cmd(admin, 'ZCARD', key)), 0, 'the slot is still free');
      } finally {
        await a.close();
      }
    });
  }

  test('a lease id of the caller renews its own slot instead of taking a second', async () => {
    const a = await connect('node-redis', server);
    try {
      const c = new Client(a.raw, { ...PATIENT, mode: 'module' });
      const one = await c.acquireAs('job', concurrency(1, 10), 'job-7');
      const again = await c.acquireAs('job', concurrency(1, 10), 'job-7');
      assert.deepEqual([one.outcome.decision.allowed, again.outcome.decision.allowed], [true, true]);
      assert.equal(Number(await cmd(admin, 'ZCARD', 'job')), 1);
      assert.equal(await c.release('job', 'job-7'), true);
    } finally {
      await a.close();
    }
  });
});

describe('the deadline sweep: one timer per client, no timer or signal per call', () => {
  let server: Server;
  before(async () => {
    server = await Server.start();
  });
  after(async () => {
    await server.stop();
  });
  const hundred = tokenBucket(100, 0.001);
  const closed = { allowed: false, remaining: 0, retryAfterMs: 777, resetAfterMs: 777, limit: 100 };

  /** Runs `fn` while the server is frozen (SIGSTOP: it reads and answers nothing, its connections stay open). */
  async function frozen<T>(fn: () => Promise<T>): Promise<T> {
    server.signal('SIGSTOP');
    try {
      return await fn();
    } finally {
      server.signal('SIGCONT');
    }
  }

  for (const library of LIBRARIES) {
    test(`${library}: on a frozen server each call ends at its deadline, the ones queued for a place a deadline later each round; the late replies are ignored`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', policy: 'fail-closed', failClosedRetryMs: 777, timeoutMs: 80, maxInFlight: 16, breaker: { failures: 1000 } });
        const key = `frozen:${library}`;
        assert.equal((await c.check(key, hundred)).decision.remaining, 99);
        const ended = await frozen(async () => {
          const t0 = performance.now();
          return Promise.all(
            Array.from({ length: 40 }, () => c.check(key, hundred).then((o) => [o, performance.now() - t0] as const)),
          );
        });
        for (const [o] of ended) assert.deepEqual([o.degraded, o.mode, o.decision], ['fail-closed', undefined, closed]);
        const took = ended.map(([, ms]) => ms).sort((x, y) => x - y);
        // 16 calls have a place at once and end at their deadline; each of the others waits for the
        // place of one that ended, outside its deadline, which then counts in full: 16, 16, 8.
        assert.ok(took[0]! >= 79, `the first ended after ${took[0]} ms`);
        assert.ok(took[16]! >= 159 && took[32]! >= 239, `rounds ended after ${took[16]} and ${took[32]} ms`);
        assert.ok(took[39]! < 240 + 1500, `the last ended after ${took[39]} ms`);
        // Thawed, the server runs the 40 commands it was sent (a call given up is not taken back),
        // and the client is answered by Redis again at once.
        const back = await c.check(key, hundred, 1, { timeoutMs: 2000 });
        assert.deepEqual([back.degraded, back.mode, back.decision.remaining], [undefined, 'module', 100 - 1 - 40 - 1]);
      } finally {
        await a.close();
      }
    });

    test(`${library}: no bound by default: on a frozen server 40 calls are all sent at once and end together at their deadline`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', policy: 'fail-closed', failClosedRetryMs: 777, timeoutMs: 80, breaker: { failures: 1000 } });
        const key = `unbounded:${library}`;
        await c.check(key, hundred, 0, PATIENT);
        const took = await frozen(async () => {
          const t0 = performance.now();
          return Promise.all(Array.from({ length: 40 }, () => c.check(key, hundred).then(() => performance.now() - t0)));
        });
        took.sort((x, y) => x - y);
        // One round: with any bound below 40 the calls past it would wait for a place and then a
        // deadline of their own, 80 ms or more after the first ended.
        assert.ok(took[0]! >= 79, `the first ended after ${took[0]} ms`);
        assert.ok(took[39]! - took[0]! < 79, `the calls ended from ${took[0]} to ${took[39]} ms`);
        const back = await c.check(key, hundred, 1, PATIENT);
        assert.deepEqual([back.degraded, back.decision.remaining], [undefined, 100 - 40 - 1]);
      } finally {
        await a.close();
      }
    });

    test(`${library}: maxInFlight 4: on a frozen server 10 calls end in three rounds of a deadline each (4, 4, 2)`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', policy: 'fail-closed', failClosedRetryMs: 777, timeoutMs: 80, maxInFlight: 4, breaker: { failures: 1000 } });
        const key = `places:${library}`;
        await c.check(key, hundred, 0, PATIENT);
        const took = await frozen(async () => {
          const t0 = performance.now();
          return Promise.all(Array.from({ length: 10 }, () => c.check(key, hundred).then(() => performance.now() - t0)));
        });
        took.sort((x, y) => x - y);
        assert.ok(took[0]! >= 79 && took[3]! < 319, `the first round ended after ${took[0]} to ${took[3]} ms`);
        assert.ok(took[4]! >= 159 && took[8]! >= 239, `rounds ended after ${took[4]} and ${took[8]} ms`);
        const back = await c.check(key, hundred, 1, PATIENT);
        assert.deepEqual([back.degraded, back.decision.remaining], [undefined, 100 - 10 - 1]);
      } finally {
        await a.close();
      }
    });

    test(`${library}: a shorter deadline that comes later ends first (the timer is set again for it)`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', policy: 'fail-closed', failClosedRetryMs: 777, breaker: { failures: 1000 } });
        const key = `deadlines:${library}`;
        await c.check(key, hundred, 0, PATIENT);
        const [long, short] = await frozen(async () => {
          const t0 = performance.now();
          const at = (timeoutMs: number): Promise<readonly [boolean, number]> =>
            c.check(key, hundred, 1, { timeoutMs }).then((o) => [o.degraded === 'fail-closed', performance.now() - t0] as const);
          const first = at(600);
          await sleep(5);
          return Promise.all([first, at(60)]);
        });
        assert.deepEqual([long[0], short[0]], [true, true]);
        assert.ok(short[1] >= 64 && short[1] < 600, `the short one ended after ${short[1]} ms`);
        assert.ok(long[1] >= 599, `the long one ended after ${long[1]} ms`);
      } finally {
        await a.close();
      }
    });
  }

  for (const library of LIBRARIES) {
    test(`${library}: a check of one unit without call options (one promise of the call's own) answers as the general path: decisions, a rejection, the breaker`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', policy: 'fail-closed', failClosedRetryMs: 777, timeoutMs: 2000, breaker: { failures: 1, cooldownMs: 60000 } });
        const three = tokenBucket(3, 0.001);
        const seen = async (key: string, call: object | undefined): Promise<unknown[]> => {
          const o = call === undefined ? await c.check(key, three) : await c.check(key, three, 1, call);
          return [o.degraded, o.mode, o.granted, o.decision.allowed, o.decision.remaining, o.decision.limit, o.decision.retryAfterMs > 0];
        };
        const admitted = (remaining: number) => [undefined, 'module', 1, true, remaining, 3, false];
        const denied = [undefined, 'module', 0, false, 0, 3, true];
        for (const [key, call] of [[`short:${library}`, undefined], [`general:${library}`, {}]] as const) {
          assert.deepEqual(
            [await seen(key, call), await seen(key, call), await seen(key, call), await seen(key, call)],
            [admitted(2), admitted(1), admitted(0), denied],
          );
        }
        // A key of another type: Redis refuses (no failure of Redis: the breaker stays closed).
        const str = `list:${library}`;
        await a.connection.send(['RPUSH', str, 'x'], str);
        for (const call of [undefined, {}]) {
          await assert.rejects(call === undefined ? c.check(str, three) : c.check(str, three, 1, call), (e) => e instanceof RejectedError && e.code === 'WRONGTYPE');
          assert.equal(c.breakerOpen, false);
        }
        // No answer (frozen): the failure policy at the deadline, then the breaker open (one failure) skips Redis, on either path.
        const d = new Client(a.connection, { mode: 'module', policy: 'fail-closed', failClosedRetryMs: 777, timeoutMs: 80, breaker: { failures: 1, cooldownMs: 60000 } });
        const late = `late:${library}`;
        assert.deepEqual(await seen(late, PATIENT), admitted(2));
        assert.deepEqual((await d.check(late, three)).decision.remaining, 1);
        await sleep(100);
        const fail = { allowed: false, remaining: 0, retryAfterMs: 777, resetAfterMs: 777, limit: 3 };
        server.signal('SIGSTOP');
        const ended: [Outcome, number][] = [];
        try {
          const t0 = performance.now();
          for (const call of [undefined, undefined, {}]) {
            const o = call === undefined ? await d.check(late, three) : await d.check(late, three, 1, call);
            ended.push([o, performance.now() - t0]);
          }
        } finally {
          server.signal('SIGCONT');
        }
        for (const [o] of ended) assert.deepEqual([o.degraded, o.mode, o.granted, o.decision], ['fail-closed', undefined, 0, fail]);
        const [first, second, third] = ended.map(([, ms]) => ms);
        assert.ok(first! >= 79 && first! < 1500, `the first ended after ${first} ms`);
        assert.ok(second! - first! < 40 && third! - first! < 40, `the breaker's answers came after ${second} and ${third} ms`);
        assert.equal(d.breakerOpen, true);
        assert.equal(c.breakerOpen, false);
      } finally {
        await a.close();
      }
    });
  }

  test("a process's last answered call does not hold it: it exits without waiting for the deadline's timer", () => {
    const index = new URL('../src/index.js', import.meta.url).href;
    const script = `
      import { createRequire } from 'node:module';
      const { createClient } = createRequire(${JSON.stringify(join(PACKAGE_ROOT, 'package.json'))})('redis');
      const { Client, tokenBucket } = await import(${JSON.stringify(index)});
      const redis = createClient({ url: ${JSON.stringify(server.url)} });
      await redis.connect();
      const c = new Client(redis, { timeoutMs: 60000 });
      const o = await c.check('exits', tokenBucket(5, 1));
      console.log(JSON.stringify([o.degraded ?? null, o.mode, o.decision.remaining]));
      redis.destroy();
    `;
    const t0 = performance.now();
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30000 });
    const took = performance.now() - t0;
    assert.equal(r.stderr, '');
    assert.deepEqual([r.status, r.stdout.trim()], [0, JSON.stringify([null, 'module', 4])]);
    assert.ok(took < 20000, `the process took ${took} ms to end (the deadline is 60 s)`);
  });
});

describe('options', () => {
  test('a client with no options uses the documented defaults', () => {
    const c = new Client({ send: () => Promise.reject(new Error('unused')) });
    assert.deepEqual([c.timeoutMs, c.policy, c.instances, c.failClosedRetryMs, c.mode, c.maxInFlight], [100, 'fail-open', 1, 1000, undefined, Number.POSITIVE_INFINITY]);
    const o: ClientOptions = { mode: 'script', policy: 'local', instances: 4, timeoutMs: 250, maxInFlight: 64 };
    const d = new Client({ send: () => Promise.reject(new Error('unused')) }, o);
    assert.deepEqual([d.timeoutMs, d.policy, d.instances, d.mode, d.maxInFlight], [250, 'local', 4, 'script', 64]);
  });
});
