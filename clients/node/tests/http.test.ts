/**
 * What the table does not show of the HTTP middleware: the counters through prom-client, an
 * actual cost set after the response's head (settled once sent), leases kept alive for long
 * requests, and the client addresses and numbers as the keys and commands carry them.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { Registry, register } from 'prom-client';

import {
  Client,
  Metrics,
  canonicalIp,
  concurrency,
  fixedWindow,
  plainNumber,
  policy,
  setActualCost,
  tokenBucket,
} from '../src/index.js';
import { type App, Gates, send, startApp } from './apps.js';
import { type Admin, PATIENT, Server, cmd, open, ready, sleep } from './harness.js';
import express from 'express';
import type { AddressInfo } from 'node:net';
import { rateLimit } from '../src/index.js';

describe('the HTTP middleware beyond the table', () => {
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

  test('prom-client: the counters in a registry, read at every scrape; none with prometheus: false', async () => {
    const o = open('node-redis', server.port);
    await ready(o);
    const registry = new Registry();
    const c = new Client(o.connection, PATIENT);
    const app = express();
    const quietLimiter = rateLimit(c, { key: { header: 'x-api-key' }, prometheus: false, limits: [{ plan: '*', class: '*', policies: [policy('q', fixedWindow(1, 60))] }] });
    app.get('/quiet', quietLimiter, (_req, res) => {
      res.end('quiet');
    });
    const limiter = rateLimit(c, {
      key: { header: 'x-api-key' },
      prometheus: registry,
      estimates: { '*': 10 },
      limits: [{ plan: '*', class: '*', policies: [policy('tokens', tokenBucket(25, 0.001)), policy('new', fixedWindow(20, 60), { shadow: true })] }],
    });
    app.use(limiter);
    app.use((req, res) => {
      setActualCost(res, Number(req.headers['x-used'] ?? 10));
      res.end('ok');
    });
    const s = app.listen(0, '127.0.0.1');
    await new Promise<void>((r) => s.once('listening', () => r()));
    const port = (s.address() as AddressInfo).port;
    try {
      const statuses: number[] = [];
      for (const used of [4, 10, 15, 1]) statuses.push((await send(port, { headers: { 'x-api-key': 'p', 'x-used': String(used) } })).status);
      assert.deepEqual(statuses, [200, 200, 200, 429]);
      // exposeToPrometheus registers once prom-client is imported: give it that moment.
      await sleep(50);
      const text = await registry.metrics();
      const lines = text.split('\n').filter((l) => l.startsWith('ratelimit_'));
      assert.deepEqual(lines, [
        'ratelimit_decisions_total{limit="new",outcome="allowed"} 2',
        'ratelimit_decisions_total{limit="new",outcome="denied"} 0',
        'ratelimit_decisions_total{limit="new",outcome="degraded"} 0',
        'ratelimit_decisions_total{limit="new",outcome="shadow_denied"} 1',
        'ratelimit_decisions_total{limit="tokens",outcome="allowed"} 3',
        'ratelimit_decisions_total{limit="tokens",outcome="denied"} 1',
        'ratelimit_decisions_total{limit="tokens",outcome="degraded"} 0',
        'ratelimit_settled_units_total{limit="new",direction="refunded"} 6',
        'ratelimit_settled_units_total{limit="new",direction="charged"} 0',
        'ratelimit_settled_units_total{limit="tokens",direction="refunded"} 6',
        'ratelimit_settled_units_total{limit="tokens",direction="charged"} 5',
      ]);
      assert.match(text, /# HELP ratelimit_decisions_total Rate-limit decisions per limit/);
      assert.match(text, /# TYPE ratelimit_settled_units_total counter/);
      assert.equal(limiter.metrics.counts('tokens').allowed, 3);
      // The same counts again at the next scrape, not twice as many.
      assert.deepEqual((await registry.metrics()).split('\n').filter((l) => l.startsWith('ratelimit_')), lines);
      assert.equal((await send(port, { path: '/quiet', headers: { 'x-api-key': 'p' } })).status, 200);
      // prometheus: false: in no registry, not even prom-client's global one (the default).
      assert.equal((await registry.metrics()).includes('limit="q"'), false);
      assert.equal((await register.metrics()).includes('limit="q"'), false);
    } finally {
      s.closeAllConnections();
      await new Promise<void>((r) => s.close(() => r()));
      await o.close();
    }
  });

  test('an actual cost set once the head has left is settled after the response', async () => {
    const o = open('ioredis', server.port);
    await ready(o);
    const c = new Client(o.connection, PATIENT);
    const app = express();
    app.use(rateLimit(c, { key: { header: 'x-api-key' }, estimates: { '*': 100 }, limits: [{ plan: '*', class: '*', policies: [policy('tokens', tokenBucket(1000, 0.001))] }] }));
    app.use((_req, res) => {
      res.write('streamed');
      setActualCost(res, 30);
      res.end();
    });
    const s = app.listen(0, '127.0.0.1');
    await new Promise<void>((r) => s.once('listening', () => r()));
    try {
      const r = await send((s.address() as AddressInfo).port, { headers: { 'x-api-key': 'late' } });
      assert.deepEqual([r.status, r.headers['ratelimit'], r.body], [200, '"tokens";r=900;t=100000', 'streamed']);
      const deadline = Date.now() + 5000;
      while (!String(await cmd(admin, 'GET', 'rl:{late}:default:tokens')).match(/^(tb )?970(\.\d+)? /)) {
        assert.ok(Date.now() < deadline, 'never settled');
        await sleep(5);
      }
    } finally {
      s.closeAllConnections();
      await new Promise<void>((r) => s.close(() => r()));
      await o.close();
    }
  });

  test('leaseKeepAliveMs keeps the slot of a request that outlasts its lease', async () => {
    const o = open('node-redis', server.port);
    await ready(o);
    const c = new Client(o.connection, PATIENT);
    const gates = new Gates();
    let app: App | undefined;
    try {
      app = await startApp(
        'express',
        c,
        { key: { header: 'x-api-key' }, leaseKeepAliveMs: 150, limits: [{ plan: '*', class: '*', policies: [policy('inflight', concurrency(1, 1))] }], metrics: new Metrics() },
        gates,
      );
      const port = app.port;
      const long = send(port, { headers: { 'x-api-key': 'long', 'x-hold': 'long' } });
      await gates.reached('long');
      await sleep(1500);
      const meanwhile = await send(port, { headers: { 'x-api-key': 'long' } });
      assert.equal(meanwhile.status, 429, 'the slot is still held after one and a half leases');
      gates.release('long');
      assert.equal((await long).status, 200);
      const deadline = Date.now() + 5000;
      while (Number(await cmd(admin, 'ZCARD', 'rl:{long}:default:inflight')) !== 0) {
        assert.ok(Date.now() < deadline, 'never given back');
        await sleep(5);
      }
      await sleep(250);
      assert.equal(Number(await cmd(admin, 'EXISTS', 'rl:{long}:default:inflight')), 0, 'no renewal after the response');
    } finally {
      await app?.close();
      await o.close();
    }
  });
});

test('client addresses as keys: IPv4-mapped addresses as IPv4, IPv6 in its canonical form', () => {
  assert.deepEqual(
    ['127.0.0.2', '::ffff:127.0.0.2', '2001:DB8::1', '2001:db8:0:0:1:0:0:1', '2001:db8::0:1', 'fe80::1%eth0', '::', '::1', '1:0:0:2:0:0:0:3', '::ffff:1.2.3.4', '0:0:0:0:0:0:0:1', '1.2.3', 'not-an-address'].map(canonicalIp),
    ['127.0.0.2', '127.0.0.2', '2001:db8::1', '2001:db8::1:0:0:1', '2001:db8::1', 'fe80::1', '::', '::1', '1:0:0:2::3', '1.2.3.4', '::1', undefined, undefined],
  );
});

test('numbers as the module reads them: plain decimals, the shortest digits', () => {
  assert.deepEqual(
    [0.0000001, 1e21, 2.5, 60, 0.1 + 0.2, 1 / 3, 3.0000000000000004e-7, 123456789012345, 5e-324, 0].map(plainNumber),
    ['0.0000001', '1000000000000000000000', '2.5', '60', '0.30000000000000004', '0.3333333333333333', '0.00000030000000000000004', '123456789012345', `0.${'0'.repeat(323)}5`, '0'],
  );
});
