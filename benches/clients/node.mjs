// The Node client's cost per call: the client's check of one token bucket (Client.check) next
// to the bare RL.TOKENBUCKET sent through the same node-redis connection (sendCommand), and to
// the floor, the bare command under the cheapest deadline of its own the runtime offers (one
// setTimeout, cleared by the answer, rejecting the call's one promise: no AbortController, no
// Promise.race), one call at a time and with 64 concurrent callers, in blocks of each in turn.
// One line per measurement:
//
//   client-cost lang=node mode=<sequential|concurrent64> what=<raw|floor|client> p50_us=.. p99_us=.. calls_per_s=.. client_cpu_us_per_call=..
//
// Run after the package's build (`make dist-node`, or `node scripts/build.mjs` in clients/node):
//
//   node benches/clients/node.mjs
//
// RL_BENCH_ADDR (host:port) is a server with the module to use; without it the bench starts one
// (RL_REDIS_SERVER, default redis-server, with RL_MODULE, default the workspace's release build)
// on a free port, on the second core (taskset, where there is one; make bench-clients runs the
// bench on the first), and stops it at the end. RL_BENCH_CALLS is the calls per measurement (default
// 100000), RL_BENCH_BLOCK the calls per block (default 1000).

import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath, pathToFileURL } from 'node:url';

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const PACKAGE = join(REPO, 'clients', 'node');
const require = createRequire(join(PACKAGE, 'package.json'));
const { createClient } = require('redis');
const entry = join(PACKAGE, 'dist', 'esm', 'index.js');
if (!existsSync(entry)) {
  console.error(`${entry} not found: build the package first (make dist-node)`);
  process.exit(1);
}
const { Client, tokenBucket } = await import(pathToFileURL(entry).href);

const CALLS = Number(process.env.RL_BENCH_CALLS ?? 100_000);
const BLOCK = Number(process.env.RL_BENCH_BLOCK ?? 1000);
const CONCURRENCY = 64;

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once('error', fail);
    s.listen(0, '127.0.0.1', () => {
      const port = s.address().port;
      s.close(() => ok(port));
    });
  });
}

function ping(port) {
  return new Promise((ok) => {
    const socket = new Socket();
    socket.once('error', () => ok(false));
    socket.connect(port, '127.0.0.1', () => socket.write('PING\r\n'));
    socket.once('data', (d) => {
      socket.destroy();
      ok(d.toString().startsWith('+PONG'));
    });
  });
}

/** A server of the bench's own, or the one RL_BENCH_ADDR names. */
async function server() {
  if (process.env.RL_BENCH_ADDR) {
    const [host, port] = process.env.RL_BENCH_ADDR.split(':');
    return { url: `redis://${host}:${port}`, stop: async () => undefined };
  }
  const module = process.env.RL_MODULE || join(REPO, 'target', 'release', 'libredis_rate_limiter.so');
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'rl-bench-node-'));
  const args = [
    process.env.RL_REDIS_SERVER || 'redis-server',
    '--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', '--loadmodule', module,
  ];
  // The server on the second core (make bench-clients runs the bench on the first).
  if (existsSync('/usr/bin/taskset')) args.unshift('/usr/bin/taskset', '-c', '1');
  const child = spawn(args[0], args.slice(1), { stdio: 'ignore' });
  const exited = new Promise((r) => child.once('exit', r));
  const deadline = Date.now() + 10_000;
  while (!(await ping(port))) {
    if (child.exitCode !== null || Date.now() > deadline) throw new Error('redis-server did not start');
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    stop: async () => {
      child.kill('SIGKILL');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

// A bucket no run drains: every call is admitted and takes the same path.
const CAPACITY = '1000000000000';
const bucket = tokenBucket(1_000_000_000_000, 1_000_000_000_000);

/** One measurement's running totals, added to block by block. */
function totals() {
  return { latencies: [], wallMs: 0, cpuUs: 0, calls: 0 };
}

async function block(t, concurrency, call) {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  let left = BLOCK;
  const worker = async () => {
    while (left > 0) {
      left -= 1;
      const s = performance.now();
      await call();
      t.latencies.push(performance.now() - s);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  t.wallMs += performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  t.cpuUs += cpu.user + cpu.system;
  t.calls += BLOCK;
}

function line(mode, what, t) {
  const sorted = Float64Array.from(t.latencies).sort();
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] * 1000;
  return (
    `client-cost lang=node mode=${mode} what=${what} p50_us=${at(0.5).toFixed(1)} p99_us=${at(0.99).toFixed(1)} ` +
    `calls_per_s=${Math.round(t.calls / (t.wallMs / 1000))} client_cpu_us_per_call=${(t.cpuUs / t.calls).toFixed(2)}`
  );
}

const srv = await server();
const redis = createClient({ url: srv.url, disableOfflineQueue: true });
redis.on('error', () => undefined);
await redis.connect();
try {
  const client = new Client(redis);
  const raw = () => redis.sendCommand(['RL.TOKENBUCKET', 'bench:raw', CAPACITY, CAPACITY, '1']);
  // A floor call past its deadline (a loaded machine) is counted, as the client's are.
  const late = new Error('no answer within 100 ms');
  let floorLate = 0;
  const deadlined = () =>
    new Promise((ok, fail) => {
      const timer = setTimeout(fail, 100, late);
      redis.sendCommand(['RL.TOKENBUCKET', 'bench:floor', CAPACITY, CAPACITY, '1']).then(
        (v) => {
          clearTimeout(timer);
          ok(v);
        },
        (e) => {
          clearTimeout(timer);
          fail(e);
        },
      );
    });
  const floor = () =>
    deadlined().catch((e) => {
      if (e !== late) throw e;
      floorLate += 1;
    });
  // A call Redis did not answer within the client's deadline (a loaded machine) is counted and
  // reported on stderr: its answer, the policy's, cost no round trip.
  let degraded = 0;
  const checked = async () => {
    const o = await client.check('bench:client', bucket);
    if (o.degraded !== undefined) degraded += 1;
    else if (!o.decision.allowed) throw new Error(`denied: ${JSON.stringify(o)}`);
  };
  // Warm both paths (and the JIT) before measuring.
  for (let i = 0; i < 5000; i++) {
    await raw();
    await floor();
    await checked();
  }
  if (client.mode !== 'module') throw new Error(`the module is not loaded (mode ${client.mode})`);
  for (const [mode, concurrency] of [['sequential', 1], ['concurrent64', CONCURRENCY]]) {
    const r = totals();
    const f = totals();
    const c = totals();
    while (r.calls < CALLS) {
      await block(r, concurrency, raw);
      await block(f, concurrency, floor);
      await block(c, concurrency, checked);
    }
    console.log(line(mode, 'raw', r));
    console.log(line(mode, 'floor', f));
    console.log(line(mode, 'client', c));
  }
  if (floorLate > 0) console.error(`client-cost lang=node: ${floorLate} floor calls past their deadline`);
  if (degraded > 0) console.error(`client-cost lang=node: ${degraded} client calls answered by the failure policy (not by Redis)`);
} finally {
  redis.destroy();
  await srv.stop();
}
