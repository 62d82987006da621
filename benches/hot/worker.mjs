// One worker process of benches/hot/run.py for Node.js: `--tasks` concurrent callers sending
// requests through the package's node:http middleware (`redisRateLimit`, the one Express mounts
// too), each request a node:http IncomingMessage and ServerResponse made in the process, without
// a socket, the middleware called as the server would call it with the handler as `next`; one
// key until the run ends; its counts as one JSON line. Run after the package's build
// (`node scripts/build.mjs` in clients/node).
//
// With `--http` the requests go over HTTP/1.1 on loopback instead: a node:http server serving the
// middleware, and node:http requests of the same process (a keep-alive agent, one socket per
// caller).
//
// Protocol (the same in every language): it prints `ready` once its client has detected the mode,
// reads the start (Unix ms) from stdin, runs `--seconds` from then, closes its client (what the
// batches hold goes back) and prints the JSON line. With `--admissions FILE` it appends one byte
// to FILE per admitted request as it happens.

import { existsSync, openSync, writeSync } from 'node:fs';
import { Agent, IncomingMessage, ServerResponse, createServer, get } from 'node:http';
import { createRequire } from 'node:module';
import { Socket } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';

const PACKAGE = join(resolve(dirname(fileURLToPath(import.meta.url)), '..', '..'), 'clients', 'node');
const require = createRequire(join(PACKAGE, 'package.json'));
const { createClient } = require('redis');
const entry = join(PACKAGE, 'dist', 'esm', 'index.js');
if (!existsSync(entry)) {
  console.error(`${entry} not found: build the package first (node scripts/build.mjs in clients/node)`);
  process.exit(1);
}
const { Client, fixedWindow, fromNodeRedis, policy, rateLimitFields, redisRateLimit, tokenBucket } = await import(
  pathToFileURL(entry).href
);

const args = process.argv.slice(2);
const arg = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : fallback;
};
const port = Number(arg('--port', '6379'));
const scenario = arg('--scenario', 'below');
const variant = arg('--variant', 'unbatched');
const tasks = Number(arg('--tasks', '16'));
const seconds = Number(arg('--seconds', '2'));
const admissions = arg('--admissions', '');
const limitAbove = Number(arg('--limit', '20000'));
const overHttp = args.includes('--http');

function algorithm() {
  if (scenario === 'below') return tokenBucket(1_000_000_000_000, 1_000_000_000_000);
  if (scenario === 'above') return fixedWindow(limitAbove, 3600);
  return fixedWindow(1, 1);
}

/** 16 buckets per power of two of nanoseconds (as hot_key.rs). */
function bucket(ns) {
  const n = Math.max(1, Math.floor(ns));
  const exp = Math.floor(Math.log2(n));
  const mantissa = exp >= 4 ? Math.floor(n / 2 ** (exp - 4)) & 15 : 0;
  return exp * 16 + mantissa;
}

const redis = createClient({ url: `redis://127.0.0.1:${port}`, disableOfflineQueue: true });
redis.on('error', () => undefined);
await redis.connect();
// Generous: an answer of the policy would not be Redis's.
let client = new Client(fromNodeRedis(redis), { timeoutMs: 2000, policy: 'fail-closed' });
if ((await client.detect()) === undefined) {
  console.error('hot worker (node): no mode detected');
  process.exit(1);
}
// Detected hot: 100 calls a second from this process, the default.
if (variant.startsWith('batched')) client = client.withBatching({});
// "no limit": the route has no limit, the middleware lets it through untouched (its floor);
// "headers only" adds the draft fields to that (the floor with what a limit owes).
const routeClass = variant === 'no limit' || variant === 'headers only' ? 'other' : '*';
const policies = [policy('hot', algorithm())];
const middleware = redisRateLimit(client, {
  key: { header: 'x-api-key' },
  limits: [{ plan: '*', class: routeClass, policies }],
  denyCache: variant.endsWith('deny cache'),
  prometheus: false,
});
const headersOnly =
  variant === 'headers only'
    ? rateLimitFields(
        policies,
        {
          allowed: true,
          deniedBy: 0,
          decisions: [{ allowed: true, remaining: 999_999_999, retryAfterMs: 0, resetAfterMs: 1, limit: 1_000_000_000 }],
          degraded: undefined,
          mode: undefined,
          granted: 1,
        },
        false,
      )
    : [];
const told = admissions ? openSync(admissions, 'a') : undefined;
const byte = Buffer.from('a');

/** One request through the middleware: its response's status and whether it is degraded. */
function request(socket) {
  return new Promise((done) => {
    const req = new IncomingMessage(socket);
    req.method = 'GET';
    req.url = '/';
    req.headers = { host: 'hot', 'x-api-key': 'hot' };
    req.complete = true;
    const res = new ServerResponse(req);
    const end = res.end;
    res.end = function (...a) {
      const r = end.apply(res, a);
      done([res.statusCode, res.hasHeader('ratelimit-degraded')]);
      return r;
    };
    middleware(req, res, (err) => {
      if (err) {
        res.statusCode = 500;
        res.end();
        return;
      }
      handler(res);
    });
  });
}

/** The handler behind the middleware. */
function handler(res) {
  for (const [name, value] of headersOnly) res.setHeader(name, value);
  res.setHeader('content-type', 'text/plain');
  res.end('ok');
}

let server;
let agent;
let httpPort = 0;
if (overHttp) {
  server = createServer((req, res) =>
    middleware(req, res, (err) => {
      if (err) {
        res.statusCode = 500;
        res.end();
        return;
      }
      handler(res);
    }),
  );
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  httpPort = server.address().port;
  agent = new Agent({ keepAlive: true, maxSockets: tasks });
}

/** One request over HTTP: its response's status and whether it is degraded. */
function requestOverHttp() {
  return new Promise((done) => {
    const req = get({ host: '127.0.0.1', port: httpPort, path: '/', agent, headers: { 'x-api-key': 'hot' } }, (res) => {
      res.resume();
      res.once('end', () => done([res.statusCode, res.headers['ratelimit-degraded'] !== undefined]));
    });
    req.once('error', () => done([0, false]));
  });
}

const lines = createInterface({ input: process.stdin });
console.log('ready');
const startMs = Number(await new Promise((ok) => lines.once('line', ok)));
lines.close();
await new Promise((ok) => setTimeout(ok, Math.max(0, startMs - Date.now())));
const cpu0 = process.cpuUsage();
const began = performance.now();
const steady = began + 1000;
const end = began + seconds * 1000;
const counts = { admitted: 0, admitted_after_1s: 0, denied: 0, other: 0, degraded: 0 };
const hist = new Map();
await Promise.all(
  Array.from({ length: tasks }, async () => {
    const socket = new Socket();
    while (performance.now() < end) {
      // A server reads each request from its socket: one turn of the event loop per request.
      // Without it, a caller whose requests the middleware answers in the process (from a batch
      // or the deny cache) runs on microtasks alone and the replies from Redis wait for it.
      if (!overHttp) await new Promise((ok) => setImmediate(ok));
      const t0 = performance.now();
      const [status, degraded] = overHttp ? await requestOverHttp() : await request(socket);
      const done = performance.now();
      const b = bucket((done - t0) * 1e6);
      hist.set(b, (hist.get(b) ?? 0) + 1);
      if (degraded) counts.degraded += 1;
      if (status === 200) {
        counts.admitted += 1;
        if (done > steady) counts.admitted_after_1s += 1;
        if (told !== undefined) writeSync(told, byte);
      } else if (status === 429) counts.denied += 1;
      else counts.other += 1;
    }
  }),
);
const cpu = process.cpuUsage(cpu0);
const stats = client.batchStats();
const returned = await client.close();
console.log(
  JSON.stringify({
    ...counts,
    held_at_end: stats.held,
    returned_at_end: returned,
    lapsed: stats.lapsed + (stats.held - returned),
    refills: stats.refills,
    cpu_us: cpu.user + cpu.system,
    hist: [...hist.entries()].sort((x, y) => x[0] - y[0]),
  }),
);
agent?.destroy();
server?.close();
await redis.quit().catch(() => undefined);
process.exit(0);
