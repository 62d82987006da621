/**
 * The documentation's code, as it is written: every ```js, ```ts, ```javascript and ```typescript
 * block of README.md, docs/node.md, docs/clients.md, docs/client.md and the package's README.md is
 * read from the Markdown, compiled by `tsc --strict` against the built package (imported by its
 * name, `ratelimit-client`), then run against a server with the module, and what it did is
 * checked: a call decided by the module, a middleware answering requests. A block is wrapped in a
 * function whose parameters are the names the text around it defines (`client`, `redis`, `app`...)
 * and which returns the names it defines; its own imports stay at the top. The one change made to
 * a block is the server's address (`redis://127.0.0.1:6379` becomes the test server's). A block
 * that no entry below describes fails the test, and so does an entry whose block is gone.
 */

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, test } from 'node:test';

import express from 'express';
import { Redis as IORedis } from 'ioredis';
import { createClient } from 'redis';

import { Client, Metrics, type LimitsEntry, fixedWindow, policy, tokenBucket } from '../src/index.js';
import { type Admin, Cluster, PACKAGE_ROOT, PATIENT, REPO_ROOT, Server, cmd, sleep } from './harness.js';

const DOCS = ['README.md', 'docs/node.md', 'docs/clients.md', 'docs/client.md', 'clients/node/README.md'];
const LANGS = new Set(['js', 'ts', 'javascript', 'typescript']);
const DOCUMENTED_URL = 'redis://127.0.0.1:6379';

interface Block {
  readonly file: string;
  readonly line: number;
  readonly text: string;
}

/** Every code block in one of `LANGS` of the documents. */
function blocks(): Block[] {
  const out: Block[] = [];
  for (const file of DOCS) {
    const lines = readFileSync(join(REPO_ROOT, file), 'utf8').split('\n');
    for (let i = 0; i < lines.length; i++) {
      const open = /^(\s*)```(\w+)\s*$/.exec(lines[i]!);
      if (!open) continue;
      const body: string[] = [];
      let j = i + 1;
      for (; j < lines.length && !/^\s*```\s*$/.test(lines[j]!); j++) body.push(lines[j]!.slice(open[1]!.length));
      if (LANGS.has(open[2]!)) out.push({ file, line: i + 1, text: body.join('\n') });
      i = j;
    }
  }
  return out;
}

/** What the test gives a block, and reads back. */
type Env = {
  server: Server;
  admin: Admin;
  redis: ReturnType<typeof createClient>;
  client: Client;
};

interface Entry {
  readonly name: string;
  readonly file: string;
  /** A line of the block, which names it. */
  readonly has: string;
  /** Imports for the names the text around the block defines. */
  readonly prelude?: string;
  /** The wrapper's parameter: the names the block uses and does not define, with their types. */
  readonly params?: string;
  /** The names the block defines that the check reads. */
  readonly returns: readonly string[];
  /** The block is an ES module import and its CommonJS twin, one line each: each compiled on its own. */
  readonly pair?: boolean;
  /** Runs the compiled block (its `run`) and checks what it did. */
  readonly check: (run: (ctx: Record<string, unknown>) => Promise<Record<string, unknown>>, env: Env, compiled: string) => Promise<void>;
}

async function listen(app: express.Express): Promise<{ url: string; close(): Promise<void> }> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((ok) => server.once('listening', () => ok()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((ok) => {
        server.closeAllConnections();
        server.close(() => ok());
      }),
  };
}

async function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; body: string }> {
  const r = await fetch(url, { headers });
  return { status: r.status, headers: r.headers, body: await r.text() };
}

const ENTRIES: Entry[] = [
  {
    name: 'readme_start',
    file: 'README.md',
    has: "const client = new Client(redis, { policy: 'local', instances: 4 });",
    prelude: "import { createClient } from 'redis';\nimport { Client, fixedWindow, policy, redisRateLimit, tokenBucket } from 'ratelimit-client';\nimport type { Express } from 'express';",
    params: '{ app }: { app: Express }',
    returns: ['redis', 'client', 'out'],
    async check(run) {
      const app = express();
      const r = await run({ app });
      const redis = r['redis'] as ReturnType<typeof createClient>;
      try {
        const out = r['out'] as Awaited<ReturnType<Client['check']>>;
        // Decided by the module, the start not awaited: the client waited for the connection.
        assert.deepEqual([out.decision.allowed, out.decision.remaining, out.mode, out.degraded], [true, 9, 'module', undefined]);
        app.get('/', (_req, res) => {
          res.send('ok');
        });
        const http = await listen(app);
        try {
          const first = await get(`${http.url}/`, { 'x-api-key': 'readme' });
          assert.deepEqual([first.status, first.body, first.headers.get('ratelimit-policy')], [200, 'ok', '"per-minute";q=60;w=60']);
          assert.match(first.headers.get('ratelimit') ?? '', /^"per-minute";r=59;t=\d+$/);
        } finally {
          await http.close();
        }
      } finally {
        redis.destroy();
      }
    },
  },
  {
    name: 'package_readme',
    file: 'clients/node/README.md',
    has: "const { decision, degraded } = await limiter.check('user:42', tokenBucket(10, 5));",
    returns: ['redis', 'decision', 'degraded'],
    async check(run, env) {
      const r = await run({});
      (r['redis'] as ReturnType<typeof createClient>).destroy();
      assert.deepEqual([r['decision'], r['degraded']], [{ allowed: true, remaining: 9, retryAfterMs: 0, resetAfterMs: 200, limit: 10 }, undefined]);
      assert.equal(await cmd(env.admin, 'EXISTS', 'user:42'), 1);
    },
  },
  {
    name: 'import_pair',
    file: 'docs/node.md',
    has: "import { Client, tokenBucket } from 'ratelimit-client';          // ES module",
    pair: true,
    returns: ['Client', 'tokenBucket'],
    async check(run, env, compiled) {
      const esm = await run({});
      const cjs = await (createRequire(import.meta.url)(join(compiled, 'import_pair_cjs.cjs')) as { run: typeof run }).run({});
      for (const m of [esm, cjs]) {
        const C = m['Client'] as typeof Client;
        const tb = m['tokenBucket'] as typeof tokenBucket;
        const o = await new C(env.redis, PATIENT).check(`pair:${m === esm ? 'esm' : 'cjs'}`, tb(10, 5));
        assert.deepEqual([o.decision.allowed, o.decision.remaining, o.mode], [true, 9, 'module']);
      }
      // Two builds of one package: the ES module's and the CommonJS one's.
      assert.notEqual(esm['Client'], cjs['Client']);
    },
  },
  {
    name: 'node_redis_connection',
    file: 'docs/node.md',
    has: "const redis = createClient({ url: 'redis://127.0.0.1:6379', disableOfflineQueue: true });",
    returns: ['redis'],
    async check(run) {
      const redis = (await run({}))['redis'] as ReturnType<typeof createClient>;
      try {
        for (let i = 0; i < 200 && !redis.isReady; i++) await sleep(10);
        assert.equal(await redis.sendCommand(['PING']), 'PONG');
      } finally {
        redis.destroy();
      }
    },
  },
  {
    name: 'ioredis_connection',
    file: 'docs/node.md',
    has: "const redis = new Redis('redis://127.0.0.1:6379', {",
    returns: ['redis'],
    async check(run) {
      const redis = (await run({}))['redis'] as IORedis;
      try {
        for (let i = 0; i < 200 && redis.status !== 'ready'; i++) await sleep(10);
        assert.equal(await redis.call('PING'), 'PONG');
        // No offline queue: a command while disconnected fails at once.
        redis.disconnect();
        await assert.rejects(redis.call('PING'));
      } finally {
        redis.disconnect();
      }
    },
  },
  {
    name: 'the_client',
    file: 'docs/node.md',
    has: "const limiter = new Client(redis, { policy: 'local', instances: 4 });",
    prelude: "import type { createClient } from 'redis';",
    params: '{ redis }: { redis: ReturnType<typeof createClient> }',
    returns: ['limiter', 'out'],
    async check(run, env) {
      const r = await run({ redis: env.redis });
      const out = r['out'] as Awaited<ReturnType<Client['check']>>;
      assert.deepEqual([out.decision.allowed, out.decision.remaining, out.mode, out.degraded], [true, 9, 'module', undefined]);
      assert.equal(await cmd(env.admin, 'EXISTS', 'user:42'), 1);
      assert.equal((r['limiter'] as Client).breakerOpen, false);
    },
  },
  {
    name: 'several_limits',
    file: 'docs/node.md',
    has: "const o = await client.checkAll([['{u42}:route', tokenBucket(3, 0.1)], ['{u42}:client', fixedWindow(100, 60)]], 1);",
    prelude: "import { type Client, concurrency, fixedWindow, tokenBucket } from 'ratelimit-client';",
    params:
      '{ client, admin, work, callTheModel, console }: { client: Client; admin: Client; work: () => Promise<string>; callTheModel: () => Promise<number>; console: { log(...args: unknown[]): void } }',
    returns: ['o', 'outcome', 'result', 'reservation'],
    async check(run, env) {
      const admin = new Client(env.redis, PATIENT);
      // A denial for RL.TOP to list.
      for (let i = 0; i < 2; i++) await env.client.check('hot', fixedWindow(1, 60));
      const logged: unknown[][] = [];
      let worked = 0;
      const r = await run({
        client: env.client,
        admin,
        work: async () => {
          worked++;
          assert.equal(Number(await cmd(env.admin, 'ZCARD', 'exports:acme')), 1);
          return 'exported';
        },
        callTheModel: async () => 5200,
        console: { log: (...args: unknown[]) => logged.push(args) },
      });
      const o = r['o'] as Awaited<ReturnType<Client['checkAll']>>;
      assert.deepEqual([o.allowed, o.deniedBy, o.decisions.map((d) => d.remaining)], [true, 0, [2, 99]]);
      assert.deepEqual([(r['outcome'] as { decision: { allowed: boolean } }).decision.allowed, r['result'], worked], [true, 'exported', 1]);
      // Reserved 4000, used 5200: 1200 more charged.
      assert.ok(r['reservation']);
      const left = (await env.client.check('llm:42', tokenBucket(10_000, 100), 0)).decision.remaining;
      assert.ok(left >= 10_000 - 5200 && left < 10_000 - 5200 + 100, String(left));
      // Every slot given back: the `await using` block's and withLease's.
      assert.equal(Number(await cmd(env.admin, 'ZCARD', 'exports:acme')), 0);
      assert.deepEqual(
        logged.map((l) => l.slice(0, 3)),
        [['hot', 1, 0]],
      );
    },
  },
  {
    name: 'cluster',
    file: 'docs/node.md',
    has: 'const client = new Client(fromIORedis(new Cluster(nodes), { Command }));',
    params: "{ nodes }: { nodes: Array<{ host: string; port: number }> }",
    returns: ['client'],
    async check(_run, _env, compiled) {
      // In a process of its own, which exits: the block keeps no handle on its cluster connection.
      const cluster = await Cluster.start(true);
      try {
        const driver = join(compiled, 'cluster_driver.mjs');
        writeFileSync(
          driver,
          `import { tokenBucket } from 'ratelimit-client';
import { run } from './cluster.mjs';
const { client } = await run({ nodes: JSON.parse(process.env.NODES) });
const seen = [];
for (const key of ['{a}:k', '{b}:k', '{c}:k']) for (let i = 0; i < 3; i++) {
  const o = await client.check(key, tokenBucket(2, 0.001));
  seen.push([o.decision.allowed, o.mode, o.degraded ?? null]);
}
console.log(JSON.stringify(seen));
process.exit(0);
`,
        );
        const nodes = cluster.nodes.map((n) => ({ host: '127.0.0.1', port: n.port }));
        const r = spawnSync(process.execPath, [driver], { encoding: 'utf8', env: { ...process.env, NODES: JSON.stringify(nodes) }, timeout: 60_000 });
        assert.equal(r.status, 0, r.stderr);
        const one = [
          [true, 'module', null],
          [true, 'module', null],
          [false, 'module', null],
        ];
        assert.deepEqual(JSON.parse(r.stdout.trim()), [...one, ...one, ...one]);
        // Each key on the master of its slot.
        let held = 0;
        for (const n of cluster.nodes) {
          const a = await n.admin();
          held += Number(await cmd(a, 'DBSIZE'));
          a.destroy();
        }
        assert.equal(held, 3);
      } finally {
        await cluster.stop();
      }
    },
  },
  {
    name: 'express',
    file: 'docs/node.md',
    has: 'const limits = redisRateLimit(client, {',
    prelude: "import type { Client as TheClient } from 'ratelimit-client';",
    params: '{ client }: { client: TheClient }',
    returns: ['app', 'limits'],
    async check(run, env) {
      const r = await run({ client: env.client });
      const http = await listen(r['app'] as express.Express);
      try {
        // The scrapes go first: never counted, never refused.
        const scrapes: Array<[number, string | null]> = [];
        for (let i = 0; i < 100; i++) {
          const m = await get(`${http.url}/metrics`);
          scrapes.push([m.status, m.headers.get('ratelimit')]);
        }
        assert.deepEqual(scrapes.filter(([status]) => status !== 200).length, 0, 'scrapes refused');
        assert.deepEqual(scrapes, Array.from({ length: 100 }, () => [200, null]));
        const free = await get(`${http.url}/reports`, { 'x-api-key': 'k1' });
        assert.deepEqual(
          [free.status, free.headers.get('ratelimit-policy'), free.headers.get('ratelimit-limit'), free.headers.get('ratelimit-remaining')],
          [404, '"per-minute";q=60;w=60', '60', '59'],
        );
        const pro = await get(`${http.url}/reports`, { 'x-api-key': 'k2', 'x-plan': 'pro' });
        assert.deepEqual([pro.status, pro.headers.get('ratelimit-policy')], [404, '"burst";q=20;w=4, "hourly";q=10000;w=3600']);
        assert.match(pro.headers.get('ratelimit') ?? '', /^"burst";r=19;t=\d+, "hourly";r=9999;t=\d+$/);
        // The login class: GCRA, a burst of 2 on top of the one request per 10 s.
        const logins: number[] = [];
        for (let i = 0; i < 4; i++) logins.push((await get(`${http.url}/login`, { 'x-api-key': 'k3' })).status);
        assert.deepEqual(logins, [404, 404, 404, 429]);
        const metrics = (await get(`${http.url}/metrics`)).body;
        for (const line of [
          'ratelimit_decisions_total{limit="burst",outcome="allowed"} 1',
          'ratelimit_decisions_total{limit="login",outcome="allowed"} 3',
          'ratelimit_decisions_total{limit="login",outcome="denied"} 1',
          'ratelimit_decisions_total{limit="per-minute",outcome="allowed"} 1',
        ]) {
          assert.ok(metrics.split('\n').includes(line), `${line} in\n${metrics}`);
        }
      } finally {
        await http.close();
      }
    },
  },
  {
    name: 'fastify',
    file: 'docs/node.md',
    has: 'await app.register(fastifyRateLimit, { client, key: { header: \'x-api-key\' }, limits, metrics });',
    prelude: "import type { Client, LimitsEntry, Metrics } from 'ratelimit-client';",
    params: '{ client, limits, metrics, answer }: { client: Client; limits: LimitsEntry[]; metrics: Metrics; answer: { text: string } }',
    returns: ['app'],
    async check(run, env) {
      const metrics = new Metrics();
      const limits: LimitsEntry[] = [{ plan: '*', class: '*', policies: [policy('tokens', tokenBucket(10_000, 1))] }];
      const r = await run({ client: env.client, limits, metrics, answer: { text: 'done' } });
      const app = r['app'] as { inject(o: object): Promise<{ statusCode: number; body: string; headers: Record<string, unknown> }>; close(): Promise<void> };
      try {
        const res = await app.inject({ method: 'GET', url: '/complete', headers: { 'x-api-key': 'f1' } });
        assert.deepEqual([res.statusCode, res.body, res.headers['ratelimit-policy']], [200, '{"text":"done"}', '"tokens";q=10000;w=10000']);
        // Reserved 1 (the default estimate), cost 1200: settled before the reply left.
        assert.match(String(res.headers['ratelimit']), /^"tokens";r=8800;t=\d+$/);
        assert.ok(metrics.renderPrometheus().includes('ratelimit_settled_units_total{limit="tokens",direction="charged"} 1199'));
      } finally {
        await app.close();
      }
    },
  },
  {
    name: 'express_rate_limit_store',
    file: 'docs/node.md',
    has: 'store: new RateLimitStore({ sendCommand: (...args) => redis.sendCommand(args) }),  // was: new RedisStore({...})',
    prelude: "import type { Express } from 'express';\nimport type { createClient } from 'redis';",
    params: '{ app, redis }: { app: Express; redis: ReturnType<typeof createClient> }',
    returns: [],
    async check(run, env) {
      const app = express();
      await run({ app, redis: env.redis });
      app.get('/', (_req, res) => {
        res.send('ok');
      });
      const http = await listen(app);
      try {
        const statuses: number[] = [];
        for (let i = 0; i < 101; i++) statuses.push((await get(`${http.url}/`)).status);
        assert.deepEqual([statuses.filter((s) => s === 200).length, statuses[100]], [100, 429]);
        const keys = (await cmd(env.admin, 'KEYS', 'rl:store:*')) as string[];
        assert.equal(keys.length, 1);
      } finally {
        await http.close();
      }
    },
  },
];

/** A block as a module: its imports, the prelude, then the rest inside `run`, which returns `returns`. */
function moduleOf(e: Entry, text: string): string {
  const lines = text.split('\n').map((l) => l.split(`'${DOCUMENTED_URL}'`).join('DOCS_URL'));
  return [
    ...lines.filter((l) => /^import\s/.test(l)),
    e.prelude ?? '',
    'declare const DOCS_URL: string;',
    `export async function run(${e.params ?? ''}) {`,
    ...lines.filter((l) => !/^import\s/.test(l)).map((l) => `  ${l}`),
    `  return { ${e.returns.join(', ')} };`,
    '}',
    '',
  ].join('\n');
}

let server: Server;
let admin: Admin;
let redis: ReturnType<typeof createClient>;
const compiledDir = join(PACKAGE_ROOT, 'build', 'docs');

before(async () => {
  server = await Server.start();
  admin = await server.admin();
  redis = createClient({ url: server.url, disableOfflineQueue: true });
  redis.on('error', () => undefined);
  await redis.connect();
});

after(async () => {
  redis?.destroy();
  admin?.destroy();
  await server?.stop();
});

test('every block of code in the documents is one of this test, once', () => {
  const found = blocks();
  const unclaimed = found.filter((b) => ENTRIES.filter((e) => e.file === b.file && b.text.includes(e.has)).length !== 1);
  assert.deepEqual(unclaimed.map((b) => `${b.file}:${b.line}`), []);
  const missing = ENTRIES.filter((e) => found.filter((b) => b.file === e.file && b.text.includes(e.has)).length !== 1);
  assert.deepEqual(missing.map((e) => `${e.file}: ${e.has}`), []);
  assert.equal(found.length, ENTRIES.length);
});

test('every block compiles with tsc --strict and does what its text says against a server with the module', async (t) => {
  const found = blocks();
  rmSync(compiledDir, { recursive: true, force: true });
  mkdirSync(compiledDir, { recursive: true });
  const names: string[] = [];
  for (const e of ENTRIES) {
    const b = found.find((x) => x.file === e.file && x.text.includes(e.has));
    assert.ok(b, e.name);
    if (e.pair) {
      const [esm, cjs] = b.text.split('\n').filter((l) => l.trim() !== '');
      assert.ok(esm!.startsWith('import ') && cjs!.includes('require('), b.text);
      writeFileSync(join(compiledDir, `${e.name}.mts`), moduleOf(e, esm!));
      writeFileSync(join(compiledDir, `${e.name}_cjs.cts`), `${cjs}\nexport async function run() {\n  return { ${e.returns.join(', ')} };\n}\n`);
      names.push(`${e.name}.mts`, `${e.name}_cjs.cts`);
    } else {
      writeFileSync(join(compiledDir, `${e.name}.mts`), moduleOf(e, b.text));
      names.push(`${e.name}.mts`);
    }
  }
  writeFileSync(
    join(compiledDir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        strict: true,
        module: 'nodenext',
        moduleResolution: 'nodenext',
        target: 'es2022',
        lib: ['es2022', 'esnext.disposable'],
        types: ['node'],
        skipLibCheck: false,
        rootDir: '.',
        outDir: '.',
      },
      files: names,
    }),
  );
  const tsc = spawnSync(process.execPath, [join(PACKAGE_ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(compiledDir, 'tsconfig.json')], {
    encoding: 'utf8',
  });
  assert.equal(tsc.status, 0, `tsc --strict on the documents' blocks:\n${tsc.stdout}${tsc.stderr}`);

  for (const e of ENTRIES) {
    await t.test(`${e.file}: ${e.name}`, async () => {
      await cmd(admin, 'FLUSHALL');
      const client = new Client(redis, PATIENT);
      const file = join(compiledDir, `${e.name}.mjs`);
      // The address: the one substitution, `DOCS_URL` in the compiled module.
      writeFileSync(file, `const DOCS_URL = ${JSON.stringify(server.url)};\n${readFileSync(file, 'utf8')}`);
      const mod = (await import(pathToFileURL(file).href)) as { run: (ctx: Record<string, unknown>) => Promise<Record<string, unknown>> };
      await e.check(mod.run, { server, admin, redis, client }, compiledDir);
    });
  }
});
