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
import { type App, Gates, type HttpReply, send, startApp } from './apps.js';
import { connect } from 'node:net';
import { type Admin, PATIENT, Server, cmd, freePort, open, ready, sleep } from './harness.js';
import express from 'express';
import type { AddressInfo } from 'node:net';
import { rateLimit, redisRateLimit } from '../src/index.js';

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
    const quietLimiter = redisRateLimit(c, { key: { header: 'x-api-key' }, prometheus: false, limits: [{ plan: '*', class: '*', policies: [policy('q', fixedWindow(1, 60))] }] });
    app.get('/quiet', quietLimiter, (_req, res) => {
      res.end('quiet');
    });
    const limiter = redisRateLimit(c, {
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
        'ratelimit_breaker_open 0',
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

  test('ratelimit_breaker_open: 0, then 1 once the breaker opened, in renderPrometheus() and through prom-client', async () => {
    const registry = new Registry();
    const port0 = await freePort();
    const o = open('ioredis', port0);
    const c = new Client(o.connection, { timeoutMs: 200, breaker: { failures: 1, cooldownMs: 60_000 } });
    const limiter = redisRateLimit(c, {
      key: { header: 'x-api-key' },
      prometheus: registry,
      limits: [{ plan: '*', class: '*', policies: [policy('pm', fixedWindow(10, 60))] }],
    });
    const app = express();
    app.get('/metrics', (_req, res) => {
      res.type('text/plain').send(limiter.renderPrometheus());
    });
    app.use(limiter);
    app.use((_req, res) => {
      res.end('ok');
    });
    const s = app.listen(0, '127.0.0.1');
    await new Promise<void>((r) => s.once('listening', () => r()));
    const port = (s.address() as AddressInfo).port;
    const gauge =
      "# HELP ratelimit_breaker_open Whether the client's circuit breaker is open: Redis failed repeatedly and the failure policy answers without asking it.\n" +
      '# TYPE ratelimit_breaker_open gauge\n';
    try {
      assert.equal((await send(port, { path: '/metrics' })).body, limiter.metrics.renderPrometheus() + gauge + 'ratelimit_breaker_open 0\n');
      await sleep(50);
      assert.match(await registry.metrics(), /\nratelimit_breaker_open 0\n/);
      const r = await send(port, { path: '/', headers: { 'x-api-key': 'k' } });
      assert.deepEqual([r.status, r.headers['ratelimit-degraded']], [200, 'fail-open']);
      assert.equal(c.breakerOpen, true);
      const text = (await send(port, { path: '/metrics' })).body!;
      assert.equal(
        text,
        '# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n' +
          '# TYPE ratelimit_decisions_total counter\n' +
          'ratelimit_decisions_total{limit="pm",outcome="allowed"} 1\n' +
          'ratelimit_decisions_total{limit="pm",outcome="denied"} 0\n' +
          'ratelimit_decisions_total{limit="pm",outcome="degraded"} 1\n' +
          gauge +
          'ratelimit_breaker_open 1\n',
      );
      assert.match(await registry.metrics(), /\nratelimit_breaker_open 1\n/);
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
    app.use(redisRateLimit(c, { key: { header: 'x-api-key' }, estimates: { '*': 100 }, limits: [{ plan: '*', class: '*', policies: [policy('tokens', tokenBucket(1000, 0.001))] }] }));
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

  for (const framework of ['express', 'fastify'] as const) {
    test(`${framework}: headerFormat 'draft-12': a, w and the cost c; RateLimit-Partition; the rest as draft-11`, async () => {
      const o = open('node-redis', server.port);
      await ready(o);
      const c = new Client(o.connection, PATIENT);
      const limits = [
        { plan: '*', class: '*', policies: [policy('burst', fixedWindow(4, 60)), policy('new', fixedWindow(3, 60), { shadow: true })] },
        { plan: '*', class: 'jobs', policies: [policy('inflight', concurrency(1, 30))] },
      ];
      const app = await startApp(
        framework,
        c,
        {
          key: { header: 'x-api-key' },
          routeClass: (req) => (req.url?.startsWith('/jobs') ? 'jobs' : 'api'),
          estimates: { api: 2 },
          limits,
          legacyHeaders: true,
          headerFormat: 'draft-12',
        },
        new Gates(),
      );
      const eleven = await startApp(framework, c, { key: { header: 'x-api-key' }, estimates: { '*': 2 }, limits, legacyHeaders: true }, new Gates());
      try {
        const seen: HttpReply[] = [];
        for (let i = 0; i < 3; i++) seen.push(await send(app.port, { headers: { 'x-api-key': `${framework}-12` } }));
        const pick = (r: HttpReply): Array<string | number | undefined> => [
          r.status,
          r.headers['ratelimit-policy'],
          r.headers['ratelimit']?.replace(/;w=\d+/g, ';w=W'),
          r.headers['ratelimit-partition'],
          r.headers['ratelimit-limit'],
          r.headers['ratelimit-remaining'],
        ];
        const policyField = '"burst";q=4;w=60, "new";q=3;w=60';
        const partition = '"burst";client_id, "new";client_id';
        assert.deepEqual(seen.map(pick), [
          [200, policyField, '"burst";a=2;w=W;c=2, "new";a=1;w=W;c=2', partition, '4', '2'],
          // The shadow policy would have refused: it took nothing.
          [200, policyField, '"burst";a=0;w=W;c=2, "new";a=1;w=W;c=0', partition, '4', '0'],
          [429, policyField, '"burst";a=0;w=W;c=0, "new";a=1;w=W;c=0', partition, '4', '0'],
        ]);
        // w is draft-11's t, and everything but RateLimit and RateLimit-Partition is draft-11's.
        for (const r of seen) assert.match(r.headers['ratelimit'] ?? '', /^"burst";a=\d+;w=(5\d|60);c=\d, "new";a=\d+;w=(5\d|60);c=\d$/);
        const old = await send(eleven.port, { headers: { 'x-api-key': `${framework}-11` } });
        assert.equal(old.headers['ratelimit-partition'], undefined);
        assert.match(old.headers['ratelimit'] ?? '', /^"burst";r=2;t=(5\d|60), "new";r=1;t=(5\d|60)$/);
        const strip = (h: Record<string, string>): Record<string, string> =>
          Object.fromEntries(Object.entries(h).filter(([k]) => !['ratelimit', 'ratelimit-partition', 'date', 'keep-alive', 'connection'].includes(k)));
        assert.deepEqual(strip(old.headers), strip(seen[0]!.headers));
        assert.equal(JSON.parse(seen[2]!.body!).retry_after > 0, true);
        // A concurrency slot: c=1 whatever the estimate.
        const job = await send(app.port, { path: '/jobs', headers: { 'x-api-key': `${framework}-12` } });
        assert.deepEqual(
          [job.status, job.headers['ratelimit-policy'], job.headers['ratelimit']?.replace(/;w=\d+/g, ';w=W'), job.headers['ratelimit-partition']],
          [200, '"inflight";q=1;qu="concurrent-requests"', '"inflight";a=0;w=W;c=1', '"inflight";client_id'],
        );
      } finally {
        await app.close();
        await eleven.close();
        await o.close();
      }
    });
  }

  test('skip leaves a route alone; rateLimit is redisRateLimit; a plan may be a header as Node gives it', async () => {
    const o = open('ioredis', server.port);
    await ready(o);
    const c = new Client(o.connection, PATIENT);
    const app = express();
    const limits = redisRateLimit(c, {
      key: { header: 'x-api-key' },
      prometheus: false,
      skip: (req) => req.path === '/metrics',
      plan: (req) => req.headers['x-plan'],
      limits: [
        { plan: 'default', class: '*', policies: [policy('per-minute', fixedWindow(2, 60))] },
        { plan: 'pro, gold', class: '*', policies: [policy('both', fixedWindow(9, 60))] },
      ],
    });
    app.use(limits);
    app.get('/metrics', (_req, res) => {
      res.type('text/plain').send(limits.metrics.renderPrometheus());
    });
    app.use((_req, res) => {
      res.end('ok');
    });
    const s = app.listen(0, '127.0.0.1');
    await new Promise<void>((r) => s.once('listening', () => r()));
    const port = (s.address() as AddressInfo).port;
    try {
      const scrapes: Array<[number, string | undefined]> = [];
      for (let i = 0; i < 100; i++) {
        const r = await send(port, { path: '/metrics', headers: { 'x-api-key': 'scraper' } });
        scrapes.push([r.status, r.headers['ratelimit']]);
      }
      assert.deepEqual(scrapes, Array.from({ length: 100 }, () => [200, undefined]));
      const others: number[] = [];
      for (let i = 0; i < 3; i++) others.push((await send(port, { path: '/', headers: { 'x-api-key': 'scraper' } })).status);
      assert.deepEqual(others, [200, 200, 429]);
      assert.deepEqual(limits.metrics.counts('per-minute'), {
        allowed: 2,
        denied: 1,
        degraded: 0,
        shadowDenied: 0,
        shadow: false,
        refunded: 0,
        charged: 0,
        batch: 0,
        denyCache: 0,
      });
      // A repeated header: its values joined as Node joins them.
      const raw = await new Promise<string>((ok, fail) => {
        const sock = connect(port, '127.0.0.1', () =>
          sock.write('GET / HTTP/1.1\r\nHost: x\r\nx-api-key: both\r\nx-plan: pro\r\nx-plan: gold\r\nConnection: close\r\n\r\n'),
        );
        let buf = '';
        sock.on('data', (d: Buffer) => (buf += d.toString()));
        sock.on('end', () => ok(buf));
        sock.on('error', fail);
      });
      assert.match(raw, /\r\nratelimit-policy: "both";q=9;w=60\r\n/i);
      assert.equal(rateLimit, redisRateLimit);
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
