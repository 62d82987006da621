/**
 * What the client sees of each server, with node-redis and with ioredis: mode detection, the
 * scripts' SHA-1s, the refusals that are thrown and never failed open (NOPERM, NOAUTH, OOM,
 * READONLY) and the errors that mean Redis could not decide (CLUSTERDOWN). Run on every server of
 * the matrix.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
  Client,
  LIBRARY,
  type Mode,
  RejectedError,
  concurrency,
  fromIORedis,
  fromNodeRedis,
  tokenBucket,
} from '../src/index.js';
import { ALL_SCRIPT, RELEASE_SCRIPT, SETTLE_SCRIPT, scriptFor } from '../src/scripts.js';
import { type Admin, LIBRARIES, type Library, type Opened, PATIENT, Server, cmd, open, ready, sleep } from './harness.js';

const MODES: Mode[] = ['module', 'function', 'script'];
const bucket = tokenBucket(5, 0.001);

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
        const c1 = await Client.open(a.connection, PATIENT);
        assert.equal(c1.mode, 'module');
        const c2 = new Client(b.connection, PATIENT);
        assert.equal(c2.mode, undefined, 'detected on the first call');
        const o2 = await c2.check(`script:${library}`, bucket);
        assert.deepEqual([o2.mode, o2.degraded, o2.decision.remaining], ['script', undefined, 4]);
        await c2.loadLibrary();
        assert.equal(await cmd(admin, 'FUNCTION', 'LIST', 'LIBRARYNAME', 'ratelimit').then((l) => (l as unknown[]).length), 1);
        const c3 = await Client.open(b.connection, PATIENT);
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
        const c4 = await Client.open(d.connection, PATIENT);
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
      // Paused for a second (CLIENT UNPAUSE would wait behind it too): detection within 50 ms
      // fails, a later one within 5 s waits for the pause to end.
      await cmd(admin, 'CLIENT', 'PAUSE', '1000', 'ALL');
      const c = await Client.open(a.connection, { timeoutMs: 50 });
      assert.equal(c.mode, undefined);
      assert.equal(await c.detect({ timeoutMs: 5000 }), 'module');
    } finally {
      admin.destroy();
      await a.close();
    }
  });
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
          await refused(new Client(a.connection, { ...PATIENT, mode, breaker: { failures: 1 } }), 'perm', 'NOPERM');
          await refused(new Client(r.connection, { ...PATIENT, mode, breaker: { failures: 1 } }), 'ro', 'READONLY');
          const c = new Client(full.connection, { ...PATIENT, mode, breaker: { failures: 1 } });
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
    test(`${library}: NOAUTH (a server that wants a password, none given) is thrown in every mode`, async () => {
      const locked = await Server.start({ extra: ['--requirepass', 'secret'] });
      const a = open(library, locked.port);
      try {
        for (const mode of MODES) {
          const c = new Client(a.connection, { ...PATIENT, mode, breaker: { failures: 1 } });
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

  test('a handshake the server refuses (RESP3\'s HELLO without a password, a wrong password) is thrown; a server gone after it is Redis unable to decide', async () => {
    const locked = await Server.start({ extra: ['--requirepass', 'secret'] });
    const { Redis } = await import('ioredis');
    const { createClient } = await import('redis');
    // Each library's defaults (RESP3: HELLO at connection time), then RESP2 with a wrong password.
    const io3 = new Redis(locked.port, '127.0.0.1', { enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => 50 });
    const nr3 = createClient({ url: locked.url, disableOfflineQueue: true, socket: { reconnectStrategy: 50 } });
    const ioWrong = new Redis(locked.port, '127.0.0.1', { password: 'wrong', protocol: 2, enableReadyCheck: false, enableOfflineQueue: false, maxRetriesPerRequest: 0, retryStrategy: () => 50 });
    const nrWrong = createClient({ url: `redis://:wrong@127.0.0.1:${locked.port}`, RESP: 2, disableOfflineQueue: true, socket: { reconnectStrategy: 50 } });
    for (const c of [io3, nr3, ioWrong, nrWrong]) c.on('error', () => undefined);
    for (const c of [nr3, nrWrong]) c.connect().catch(() => undefined);
    const clients: Array<[string, Client, string]> = [
      ['ioredis, RESP3', new Client(fromIORedis(io3), { ...PATIENT, mode: 'module' }), 'NOAUTH'],
      ['node-redis, RESP3', new Client(fromNodeRedis(nr3), { ...PATIENT, mode: 'module' }), 'NOAUTH'],
      ['ioredis, a wrong password', new Client(fromIORedis(ioWrong), { ...PATIENT, mode: 'script' }), 'WRONGPASS'],
      ['node-redis, a wrong password', new Client(fromNodeRedis(nrWrong), { ...PATIENT, mode: 'function' }), 'WRONGPASS'],
    ];
    try {
      for (const [name, c, code] of clients) {
        // The first handshake may still be on its way: answered by the policy until it is refused.
        const deadline = Date.now() + 5000;
        for (;;) {
          const e = await c.check('k', bucket).then(() => undefined, (err: unknown) => err);
          if (e !== undefined) {
            assert.ok(e instanceof RejectedError && e.code === code, `${name}: ${String(e)}`);
            break;
          }
          assert.ok(Date.now() < deadline, `${name}: never refused`);
          await sleep(10);
        }
        assert.equal(c.breakerOpen, false, name);
      }
      await locked.kill();
      for (const [name, c] of clients) {
        const deadline = Date.now() + 5000;
        for (;;) {
          const o = await c.check('k', bucket).catch(() => undefined);
          if (o?.degraded === 'fail-open') break;
          assert.ok(Date.now() < deadline, `${name}: a server that is gone is still reported as the refusal`);
          await sleep(20);
        }
      }
    } finally {
      io3.disconnect();
      ioWrong.disconnect();
      nr3.destroy();
      nrWrong.destroy();
      await locked.stop();
    }
  });

  for (const library of LIBRARIES) {
    test(`${library}: CLUSTERDOWN is Redis unable to decide: the failure policy answers, the breaker counts it`, async () => {
      const lone = await Server.start({ cluster: true });
      const a = await connect(library, lone);
      try {
        const c = new Client(a.connection, { ...PATIENT, mode: 'module', policy: 'fail-closed', breaker: { failures: 1 } });
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
