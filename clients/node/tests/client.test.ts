/**
 * The client against real servers, with node-redis and with ioredis: mode detection, the
 * scripts' SHA-1s, timeouts and abort signals, the breaker, the refusals that are thrown and never
 * failed open (NOPERM, NOAUTH, OOM, READONLY) and the errors that mean Redis could not decide
 * (CLUSTERDOWN), leases with `await using`, `withLease` and `keepAlive`.
 */

import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import {
  Client,
  type ClientOptions,
  LIBRARY,
  type Mode,
  RejectedError,
  UnsupportedError,
  concurrency,
  fromIORedis,
  fromNodeRedis,
  tokenBucket,
} from '../src/index.js';
import { ALL_SCRIPT, RELEASE_SCRIPT, SETTLE_SCRIPT, scriptFor } from '../src/scripts.js';
import { type Admin, LIBRARIES, type Library, type Opened, Server, cmd, open, ready, sleep } from './harness.js';

const MODES: Mode[] = ['module', 'function', 'script'];
const bucket = tokenBucket(5, 0.001);

async function calls(admin: Admin, command: string): Promise<number> {
  const info = String(await cmd(admin, 'INFO', 'commandstats'));
  const m = new RegExp(`^cmdstat_${command.replace('.', '\\.')}:calls=(\\d+)`, 'm').exec(info);
  return m ? Number(m[1]) : 0;
}

/** A connection of `library` to `server`, ready. */
async function connect(library: Library, server: Server): Promise<Opened> {
  const o = open(library, server.port);
  await ready(o);
  return o;
}

describe('modes', () => {
  let withModule: Server;
  let plain: Server;
  before(async () => {
    withModule = await Server.start();
    plain = await Server.start({ module: false });
  });
  after(async () => {
    await withModule.stop();
    await plain.stop();
  });

  test('the scripts are the SHA-1s Redis gives them', async () => {
    const admin = await plain.admin();
    try {
      for (const s of [scriptFor(bucket), scriptFor(concurrency(1, 1)), ALL_SCRIPT, RELEASE_SCRIPT, SETTLE_SCRIPT]) {
        assert.equal(await cmd(admin, 'SCRIPT', 'LOAD', s.source), s.sha);
      }
    } finally {
      admin.destroy();
    }
  });

  for (const library of LIBRARIES) {
    test(`detected with ${library}: the module, else the Functions library, else the scripts`, async () => {
      const admin = await plain.admin();
      const a = await connect(library, withModule);
      const b = await connect(library, plain);
      try {
        await cmd(admin, 'FUNCTION', 'FLUSH');
        const c1 = await Client.open(a.connection);
        assert.equal(c1.mode, 'module');
        const c2 = new Client(b.connection);
        assert.equal(c2.mode, undefined, 'detected on the first call');
        const o2 = await c2.check(`script:${library}`, bucket);
        assert.deepEqual([o2.mode, o2.degraded, o2.decision.remaining], ['script', undefined, 4]);
        await c2.loadLibrary();
        assert.equal(await cmd(admin, 'FUNCTION', 'LIST', 'LIBRARYNAME', 'ratelimit').then((l) => (l as unknown[]).length), 1);
        const c3 = await Client.open(b.connection);
        assert.equal(c3.mode, 'function');
        const o3 = await c3.check(`script:${library}`, bucket);
        assert.deepEqual([o3.mode, o3.degraded, o3.decision.remaining], ['function', undefined, 3]);
        const o1 = await c1.check(`module:${library}`, bucket, 2);
        assert.deepEqual([o1.mode, o1.degraded, o1.decision.remaining], ['module', undefined, 3]);
        // A user that may not list functions: the scripts decide alike.
        await cmd(admin, 'ACL', 'SETUSER', `nofn-${library}`, 'on', '>pw', '~*', '+@all', '-function');
        const d = open(library, plain.port);
        await ready(d);
        const raw = d.raw as { sendCommand?: (a: string[]) => Promise<unknown>; call?: (...a: string[]) => Promise<unknown> };
        await (raw.call ? raw.call('AUTH', `nofn-${library}`, 'pw') : raw.sendCommand!(['AUTH', `nofn-${library}`, 'pw']));
        const c4 = await Client.open(d.connection);
        assert.equal(c4.mode, 'script');
        await d.close();
      } finally {
        admin.destroy();
        await a.close();
        await b.close();
      }
    });
  }

  test('a server that does not answer in time: no mode yet, detected later', async () => {
    const admin = await withModule.admin();
    const a = await connect('node-redis', withModule);
    try {
      await cmd(admin, 'CLIENT', 'PAUSE', '300', 'ALL');
      const c = await Client.open(a.connection, { timeoutMs: 50 });
      assert.equal(c.mode, undefined);
      await cmd(admin, 'CLIENT', 'UNPAUSE');
      assert.equal(await c.detect(), 'module');
    } finally {
      admin.destroy();
      await a.close();
    }
  });
});

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
          if (mode === 'function') await new Client(a.connection).loadLibrary();
          const c = new Client(a.connection, { mode, policy: 'fail-closed', failClosedRetryMs: 777 });
          await cmd(admin, 'CLIENT', 'PAUSE', '400', 'WRITE');
          const t0 = performance.now();
          const o = await c.check(`slow:${library}:${mode}`, bucket, 1, { timeoutMs: 60 });
          const took = performance.now() - t0;
          assert.deepEqual([o.degraded, o.mode, o.decision], ['fail-closed', undefined, { allowed: false, remaining: 0, retryAfterMs: 777, resetAfterMs: 777, limit: 5 }]);
          assert.ok(took >= 55 && took < 350, `answered after ${took} ms`);
          await cmd(admin, 'CLIENT', 'UNPAUSE');
        } finally {
          await a.close();
        }
      });
    }

    test(`${library}: a caller's abort rejects with its reason, is no failure, and sends nothing when already aborted`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', breaker: { failures: 1 } });
        await cmd(admin, 'CONFIG', 'RESETSTAT');
        const gone = new Error('the caller went away');
        await assert.rejects(c.check('abort', bucket, 1, { signal: AbortSignal.abort(gone) }), (e) => e === gone);
        assert.equal(await calls(admin, 'rl.tokenbucket'), 0, 'nothing sent');
        await cmd(admin, 'CLIENT', 'PAUSE', '300', 'WRITE');
        const ac = new AbortController();
        const pending = c.check('abort', bucket, 1, { signal: ac.signal, timeoutMs: 2000 });
        setTimeout(() => ac.abort(gone), 30);
        const t0 = performance.now();
        await assert.rejects(pending, (e) => e === gone);
        assert.ok(performance.now() - t0 < 250, 'given up at once');
        assert.equal(c.breakerOpen, false, 'an abort is not a failure of Redis');
        await cmd(admin, 'CLIENT', 'UNPAUSE');
      } finally {
        await a.close();
      }
    });

    test(`${library}: the breaker opens after its failures, skips Redis for its cooldown, then closes on a trial call`, async () => {
      const a = await connect(library, server);
      try {
        const c = new Client(a.connection, { mode: 'module', timeoutMs: 50, breaker: { failures: 2, cooldownMs: 400 } });
        const key = `breaker:${library}`;
        await cmd(admin, 'CLIENT', 'PAUSE', '2000', 'WRITE');
        assert.equal((await c.check(key, bucket)).degraded, 'fail-open');
        assert.equal(c.breakerOpen, false, 'one failure of two');
        assert.equal((await c.check(key, bucket)).degraded, 'fail-open');
        assert.equal(c.breakerOpen, true);
        const opened = performance.now();
        await cmd(admin, 'CLIENT', 'UNPAUSE');
        // The two paused calls are served now; the next ones must not reach Redis.
        for (let i = 0; i < 50 && Number(await cmd(admin, 'GET', key).then((v) => (v === null ? 0 : 1))) === 0; i++) await sleep(5);
        await cmd(admin, 'CONFIG', 'RESETSTAT');
        const t0 = performance.now();
        const skipped = await c.check(key, bucket);
        assert.ok(performance.now() - t0 < 30, 'answered without waiting');
        assert.equal(skipped.degraded, 'fail-open');
        assert.equal(await calls(admin, 'rl.tokenbucket'), 0, 'Redis skipped while open');
        await sleep(Math.max(0, 420 - (performance.now() - opened)));
        const trial = await c.check(key, bucket);
        assert.deepEqual([trial.degraded, trial.mode, trial.decision.remaining], [undefined, 'module', 2]);
        assert.equal(c.breakerOpen, false);
        assert.equal(await calls(admin, 'rl.tokenbucket'), 1);
      } finally {
        await a.close();
      }
    });
  }
});

describe('refusals are thrown, never failed open; Redis unable to decide is', () => {
  let master: Server;
  let replica: Server;
  let admin: Admin;
  before(async () => {
    master = await Server.start({ extra: ['--repl-diskless-sync-delay', '0'] });
    replica = await Server.start();
    admin = await master.admin();
    const r = await replica.admin();
    await cmd(r, 'REPLICAOF', '127.0.0.1', master.port);
    await cmd(admin, 'FUNCTION', 'LOAD', 'REPLACE', LIBRARY);
    const deadline = Date.now() + 10_000;
    while (!String(await cmd(r, 'INFO', 'replication')).includes('master_link_status:up')) {
      if (Date.now() > deadline) throw new Error('the replica never synced');
      await sleep(20);
    }
    while (((await cmd(r, 'FUNCTION', 'LIST')) as unknown[]).length === 0) await sleep(20);
    r.destroy();
  });
  after(async () => {
    admin.destroy();
    await replica.stop();
    await master.stop();
  });

  async function refused(c: Client, key: string, code: string): Promise<void> {
    await assert.rejects(c.check(key, bucket), (e) => e instanceof RejectedError && e.code === code && e.reply.startsWith(`${code} `));
    assert.equal(c.breakerOpen, false);
  }

  for (const library of LIBRARIES) {
    for (const mode of MODES) {
      test(`${library}, ${mode}: NOPERM, OOM and READONLY`, async () => {
        const user = `app-${library}-${mode}`;
        await cmd(admin, 'ACL', 'SETUSER', user, 'reset', 'on', '>pw', '~*', '+@connection');
        const a = await connect(library, master);
        const raw = a.raw as { sendCommand?: (a: string[]) => Promise<unknown>; call?: (...a: string[]) => Promise<unknown> };
        const r = await connect(library, replica);
        const full = await connect(library, master);
        try {
          await (raw.call ? raw.call('AUTH', user, 'pw') : raw.sendCommand!(['AUTH', user, 'pw']));
          await refused(new Client(a.connection, { mode, breaker: { failures: 1 } }), 'perm', 'NOPERM');
          await refused(new Client(r.connection, { mode, breaker: { failures: 1 } }), 'ro', 'READONLY');
          const c = new Client(full.connection, { mode, breaker: { failures: 1 } });
          await cmd(admin, 'CONFIG', 'SET', 'maxmemory', '1');
          try {
            await refused(c, `oom:${library}:${mode}`, 'OOM');
          } finally {
            await cmd(admin, 'CONFIG', 'SET', 'maxmemory', '0');
          }
          const after = await c.check(`oom:${library}:${mode}`, bucket);
          assert.deepEqual([after.degraded, after.mode, after.decision.remaining], [undefined, mode, 4]);
        } finally {
          await a.close();
          await r.close();
          await full.close();
        }
      });
    }
  }

  for (const library of LIBRARIES) {
    test(`${library}: NOAUTH (a server that wants a password, none given) is thrown`, async () => {
      const locked = await Server.start({ extra: ['--requirepass', 'secret'] });
      const a = open(library, locked.port);
      try {
        for (const mode of MODES) {
          const c = new Client(a.connection, { mode, breaker: { failures: 1 } });
          for (let i = 0; ; i++) {
            const e = await c.check('k', bucket).then(() => undefined, (err: unknown) => err);
            if (e !== undefined) {
              assert.ok(e instanceof RejectedError && e.code === 'NOAUTH', String(e));
              assert.equal(c.breakerOpen, false);
              break;
            }
            // Not connected yet: answered by the policy; the connection comes within moments.
            assert.ok(i < 200, 'never connected');
            await sleep(5);
          }
        }
      } finally {
        await a.close();
        await locked.stop();
      }
    });
  }

  test('RESP3 (both libraries\' default): a refused handshake keeps the connection from being ready, the failure policy answers', async () => {
    const locked = await Server.start({ extra: ['--requirepass', 'secret'] });
    const { Redis } = await import('ioredis');
    const { createClient } = await import('redis');
    const io = new Redis(locked.port, '127.0.0.1', { enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => 50 });
    io.on('error', () => undefined);
    const nr = createClient({ url: locked.url, disableOfflineQueue: true, socket: { reconnectStrategy: 50 } });
    nr.on('error', () => undefined);
    nr.connect().catch(() => undefined);
    try {
      await sleep(200);
      for (const conn of [fromIORedis(io), fromNodeRedis(nr)]) {
        const o = await new Client(conn, { mode: 'module' }).check('k', bucket);
        assert.deepEqual([o.degraded, o.mode], ['fail-open', undefined]);
      }
    } finally {
      io.disconnect();
      nr.destroy();
      await locked.stop();
    }
  });

  for (const library of LIBRARIES) {
    test(`${library}: CLUSTERDOWN is Redis unable to decide: the failure policy answers, the breaker counts it`, async () => {
      const lone = await Server.start({ cluster: true });
      const a = await connect(library, lone);
      try {
        const c = new Client(a.connection, { mode: 'module', policy: 'fail-closed', breaker: { failures: 1 } });
        const o = await c.check('k', bucket);
        assert.deepEqual([o.degraded, o.decision.allowed], ['fail-closed', false]);
        assert.equal(c.breakerOpen, true);
        await assert.rejects(c.top(1), /redis did not answer/);
      } finally {
        await a.close();
        await lone.stop();
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
          if (mode === 'function') await new Client(a.connection).loadLibrary();
          const c = new Client(a.connection, { mode });
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
        const c = new Client(a.connection, { mode: 'module' });
        const key = `kept:${library}`;
        const { lease } = await c.acquire(key, concurrency(1, 0.3));
        lease!.keepAlive(100);
        await sleep(700);
        assert.equal(lease!.lastRenewal?.decision.allowed, true);
        const other = await c.acquire(key, concurrency(1, 0.3));
        assert.equal(other.outcome.decision.allowed, false, 'still held after twice its lease');
        assert.equal(await lease!.release(), true);
        assert.equal(await lease!.release(), false, 'released once');
        await sleep(250);
        assert.equal((await c.acquire(key, concurrency(1, 0.3))).outcome.decision.allowed, true, 'no renewal after the release');
      } finally {
        await a.close();
      }
    });
  }

  test('a lease id of the caller renews its own slot instead of taking a second', async () => {
    const a = await connect('node-redis', server);
    try {
      const c = new Client(fromNodeRedis(a.raw as never), { mode: 'module' });
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

describe('options', () => {
  test('a client with no options uses the documented defaults', () => {
    const c = new Client({ send: () => Promise.reject(new Error('unused')) });
    assert.deepEqual([c.timeoutMs, c.policy, c.instances, c.failClosedRetryMs, c.mode], [100, 'fail-open', 1, 1000, undefined]);
    const o: ClientOptions = { mode: 'script', policy: 'local', instances: 4, timeoutMs: 250 };
    const d = new Client({ send: () => Promise.reject(new Error('unused')) }, o);
    assert.deepEqual([d.timeoutMs, d.policy, d.instances, d.mode], [250, 'local', 4, 'script']);
  });
});
