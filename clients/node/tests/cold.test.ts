/**
 * A cold start under a burst: a fresh client, made as docs/node.md starts one (its default
 * options, a connection of node-redis or ioredis started as the docs start it), takes 200 calls
 * at once on one key of capacity 50 as its very first calls, while a CPU burner keeps both cores
 * busy. In each mode (the module; the Functions library on a server without the module; the
 * scripts on a server with neither, flushed before each round) exactly 50 are admitted, none is
 * answered by the failure policy, and the server saw one `COMMAND INFO`, at most one `FUNCTION
 * LIST` and one `SCRIPT LOAD`. The same through the Express middleware and the Fastify plugin:
 * 200 first requests at once over TCP.
 *
 * `COLD_ROUNDS` rounds per case (default 2), in the modes of `COLD_MODES` (default all three);
 * `make test-node-cold` runs 20 rounds and prints each case's figures.
 */

import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import { Redis } from 'ioredis';
import { createClient } from 'redis';

import { Client, type ConnectionSource, LIBRARY, type Mode, fixedWindow, policy, tokenBucket } from '../src/index.js';
import { type Framework, Gates, send, startApp } from './apps.js';
import { type Admin, LIBRARIES, type Library, Server, cmd } from './harness.js';

const ROUNDS = Math.max(1, Number(process.env['COLD_ROUNDS'] ?? 2));
const CALLS = 200;
const CAPACITY = 50;
const MODES: Mode[] = (['module', 'function', 'script'] as const).filter((m) => (process.env['COLD_MODES'] ?? m).split(',').includes(m));

/** Both cores kept busy by processes that only spin, stopped at the end. */
class Burner {
  private readonly children: ChildProcess[] = [];
  start(n = 2): void {
    for (let i = 0; i < n; i++) {
      const c = spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' });
      this.children.push(c);
    }
  }
  async stop(): Promise<void> {
    await Promise.all(
      this.children.map(
        (c) =>
          new Promise<void>((ok) => {
            if (c.exitCode !== null || c.signalCode !== null) return ok();
            c.once('exit', () => ok());
            c.kill('SIGKILL');
          }),
      ),
    );
    this.children.length = 0;
  }
}

/** The connection as docs/node.md starts it, and how to close it. */
function documentedStart(library: Library, port: number): { redis: ConnectionSource; close(): void } {
  const url = `redis://127.0.0.1:${port}`;
  if (library === 'node-redis') {
    const redis = createClient({ url, disableOfflineQueue: true });
    redis.on('error', () => undefined);
    redis.connect().catch(() => undefined);
    return { redis, close: () => redis.destroy() };
  }
  const redis = new Redis(url, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
  });
  redis.on('error', () => undefined);
  return { redis, close: () => redis.disconnect() };
}

/** The calls of `name` (`command|info`, `script|load`, `evalsha`) since the last CONFIG RESETSTAT. */
function calls(stats: string, name: string): number {
  const m = new RegExp(`^cmdstat_${name.replace(/[.|]/g, (c) => `\\${c}`)}:calls=(\\d+)`, 'm').exec(stats);
  return m ? Number(m[1]) : 0;
}

/** What the server saw of one round. */
interface Seen {
  commandInfo: number;
  functionList: number;
  functionLoad: number;
  scriptLoad: number;
  eval: number;
}

async function seen(admin: Admin): Promise<Seen> {
  const s = String(await cmd(admin, 'INFO', 'commandstats'));
  return {
    commandInfo: calls(s, 'command|info'),
    functionList: calls(s, 'function|list'),
    functionLoad: calls(s, 'function|load'),
    scriptLoad: calls(s, 'script|load'),
    eval: calls(s, 'eval') + calls(s, 'eval_ro'),
  };
}

/** Per round: admitted, degraded, what the server saw, ms to the first decision. */
interface Round {
  admitted: number;
  degraded: number;
  seen: Seen;
  firstMs: number;
}

function summary(label: string, rounds: Round[]): string {
  const range = (xs: number[]): string => {
    const lo = Math.min(...xs);
    const hi = Math.max(...xs);
    return lo === hi ? String(lo) : `${lo}-${hi}`;
  };
  const first = rounds.map((r) => r.firstMs).sort((a, b) => a - b);
  const exact = rounds.filter((r) => r.admitted === CAPACITY && r.degraded === 0).length;
  return (
    `cold ${label}: rounds=${rounds.length} exact=${exact} degraded_per_round=${rounds.map((r) => r.degraded).join(',')} ` +
    `admitted=${range(rounds.map((r) => r.admitted))} ` +
    `degraded=${range(rounds.map((r) => r.degraded))} command_info=${range(rounds.map((r) => r.seen.commandInfo))} ` +
    `function_list=${range(rounds.map((r) => r.seen.functionList))} script_load=${range(rounds.map((r) => r.seen.scriptLoad))} ` +
    `eval=${range(rounds.map((r) => r.seen.eval))} first_decision_ms_p50=${first[Math.floor(first.length / 2)]!.toFixed(1)} ` +
    `max=${first[first.length - 1]!.toFixed(1)}`
  );
}

/** What each round must show, mode by mode: one detection, one load of the one script. */
function expected(mode: Mode): Seen {
  return {
    commandInfo: 1,
    functionList: mode === 'module' ? 0 : 1,
    functionLoad: 0,
    scriptLoad: mode === 'script' ? 1 : 0,
    eval: 0,
  };
}

describe(`a cold client under a burst (${CALLS} first calls, capacity ${CAPACITY}, both cores busy)`, () => {
  const servers = new Map<Mode, Server>();
  const admins = new Map<Mode, Admin>();
  const burner = new Burner();
  before(async () => {
    for (const mode of MODES) {
      const s = await Server.start({ module: mode === 'module' });
      servers.set(mode, s);
      const a = await s.admin();
      admins.set(mode, a);
      if (mode === 'function') await cmd(a, 'FUNCTION', 'LOAD', 'REPLACE', LIBRARY);
    }
    burner.start();
  });
  after(async () => {
    await burner.stop();
    for (const a of admins.values()) a.destroy();
    for (const s of servers.values()) await s.stop();
  });

  /** The server made ready for a round: the key gone, the scripts flushed, the counters at 0. */
  async function fresh(mode: Mode, key: string): Promise<Admin> {
    const admin = admins.get(mode)!;
    await cmd(admin, 'DEL', key);
    await cmd(admin, 'SCRIPT', 'FLUSH');
    await cmd(admin, 'CONFIG', 'RESETSTAT');
    return admin;
  }

  function check(mode: Mode, rounds: Round[]): void {
    for (const [i, r] of rounds.entries()) {
      assert.deepEqual([r.admitted, r.degraded], [CAPACITY, 0], `round ${i + 1}: admitted, degraded`);
      assert.deepEqual(r.seen, expected(mode), `round ${i + 1}: what the server saw`);
    }
  }

  for (const library of LIBRARIES) {
    for (const mode of MODES) {
      test(`${library}, ${mode}: exactly ${CAPACITY} admitted, none degraded, one detection, one script load`, async (t) => {
        {
          const rounds: Round[] = [];
          for (let round = 0; round < ROUNDS; round++) {
            const key = `cold:${library}:${mode}`;
            const admin = await fresh(mode, key);
            const t0 = performance.now();
            const start = documentedStart(library, servers.get(mode)!.port);
            try {
              const limiter = new Client(start.redis);
              let firstMs = Number.NaN;
              const outs = await Promise.all(
                Array.from({ length: CALLS }, () =>
                  limiter.check(key, tokenBucket(CAPACITY, 0.0001)).then((o) => {
                    if (Number.isNaN(firstMs)) firstMs = performance.now() - t0;
                    return o;
                  }),
                ),
              );
              rounds.push({
                admitted: outs.filter((o) => o.decision.allowed).length,
                degraded: outs.filter((o) => o.degraded !== undefined).length,
                seen: await seen(admin),
                firstMs,
              });
            } finally {
              start.close();
            }
          }
          t.diagnostic(summary(`${library} ${mode}`, rounds));
          check(mode, rounds);
        }
      });
    }
  }

  const FRAMEWORKS: Array<[Framework, Library]> = [
    ['express', 'node-redis'],
    ['fastify', 'ioredis'],
  ];
  for (const [framework, library] of FRAMEWORKS) {
    for (const mode of MODES) {
      test(`${framework} (${library}), ${mode}: ${CALLS} first requests over TCP, exactly ${CAPACITY} get 200`, async (t) => {
        {
          const rounds: Round[] = [];
          for (let round = 0; round < ROUNDS; round++) {
            const key = `rl:{cold-${framework}}:default:minute`;
            const admin = await fresh(mode, key);
            const start = documentedStart(library, servers.get(mode)!.port);
            const limiter = new Client(start.redis);
            const app = await startApp(
              framework,
              limiter,
              { key: { header: 'x-api-key' }, limits: [{ plan: '*', class: '*', policies: [policy('minute', fixedWindow(CAPACITY, 3600))] }] },
              new Gates(),
            );
            try {
              const t0 = performance.now();
              let firstMs = Number.NaN;
              const replies = await Promise.all(
                Array.from({ length: CALLS }, () =>
                  send(app.port, { headers: { 'x-api-key': `cold-${framework}` } }).then((r) => {
                    if (Number.isNaN(firstMs)) firstMs = performance.now() - t0;
                    return r;
                  }),
                ),
              );
              const statuses = replies.map((r) => r.status);
              assert.equal(statuses.filter((s) => s !== 200 && s !== 429).length, 0, `statuses: ${statuses.join(' ')}`);
              rounds.push({
                admitted: statuses.filter((s) => s === 200).length,
                degraded: replies.filter((r) => r.headers['ratelimit-degraded'] !== undefined).length,
                seen: await seen(admin),
                firstMs,
              });
            } finally {
              await app.close();
              start.close();
            }
          }
          t.diagnostic(summary(`${framework} ${library} ${mode}`, rounds));
          check(mode, rounds);
        }
      });
    }
  }
});
