/**
 * The package as `npm pack` makes it (what `make dist` ships), installed into a clean directory
 * with node-redis, ioredis and Express from npm, then used there: imported as an ES module and
 * required as CommonJS against a real server, and its type declarations checked by a strict
 * TypeScript program of both kinds.
 */

import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { PACKAGE_ROOT, REPO_ROOT, Server } from './harness.js';

const npm = process.env['npm_execpath'] && process.env['npm_execpath'].endsWith('.js') ? [process.execPath, process.env['npm_execpath']] : ['npm'];
const pkg = JSON.parse(readFileSync(join(PACKAGE_ROOT, 'package.json'), 'utf8')) as {
  name: string;
  version: string;
  devDependencies: Record<string, string>;
};

function run(cmd: string[], cwd: string, env: Record<string, string> = {}): string {
  const r = spawnSync(cmd[0]!, cmd.slice(1), { cwd, encoding: 'utf8', env: { ...process.env, ...env } });
  assert.equal(r.status, 0, `${cmd.join(' ')} in ${cwd}:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

let dir: string;
let tarball: string;
let server: Server;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rl-node-pack-'));
  const out = run([...npm, 'pack', '--json', '--pack-destination', dir], PACKAGE_ROOT);
  const packed = JSON.parse(out) as Array<{ filename: string; files: Array<{ path: string }> }>;
  tarball = join(dir, packed[0]!.filename);
  server = await Server.start();
});

after(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

test('the tarball holds both builds with their declarations, and nothing of the sources or tests', () => {
  const files = execFileSync('tar', ['-tzf', tarball], { encoding: 'utf8' }).trim().split('\n').sort();
  for (const f of [
    'package/package.json',
    'package/README.md',
    'package/LICENSE',
    'package/dist/esm/index.js',
    'package/dist/esm/index.d.ts',
    'package/dist/esm/lua.generated.js',
    'package/dist/cjs/index.js',
    'package/dist/cjs/index.d.ts',
    'package/dist/cjs/package.json',
  ]) {
    assert.ok(files.includes(f), `${f} in ${tarball}`);
  }
  assert.deepEqual(files.filter((f) => !f.startsWith('package/dist/') && !['package/package.json', 'package/README.md', 'package/LICENSE'].includes(f)), []);
  assert.equal(files.some((f) => f.endsWith('.ts') && !f.endsWith('.d.ts')), false);
});

test('installed in a clean directory: imported, required and type-checked there', () => {
  const app = join(dir, 'app');
  run(['mkdir', '-p', app], dir);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'consumer', version: '1.0.0', private: true, type: 'module' }));
  const deps = ['redis', 'ioredis', 'express', '@types/express', '@types/node'].map((d) => `${d}@${pkg.devDependencies[d]}`);
  run([...npm, 'install', '--prefer-offline', '--no-audit', '--no-fund', tarball, ...deps], app);

  writeFileSync(
    join(app, 'esm.mjs'),
    `import { createClient } from 'redis';
import { Client, tokenBucket, redisRateLimit, rateLimit, RateLimitStore } from 'ratelimit-client';
const redis = createClient({ url: process.env.REDIS_URL, RESP: 2, disableOfflineQueue: true });
await redis.connect();
const client = new Client(redis, { timeoutMs: 2000 });
const outs = [];
for (let i = 0; i < 3; i++) outs.push(await client.check('esm', tokenBucket(2, 0.001)));
console.log(JSON.stringify({ outs: outs.map((o) => [o.decision.allowed, o.decision.remaining, o.mode]), middleware: typeof redisRateLimit, alias: rateLimit === redisRateLimit, store: typeof RateLimitStore }));
redis.destroy();
`,
  );
  writeFileSync(
    join(app, 'cjs.cjs'),
    `const { Redis } = require('ioredis');
const { Client, fixedWindow } = require('ratelimit-client');
(async () => {
  const redis = new Redis(process.env.REDIS_URL, { protocol: 2, enableReadyCheck: false, enableOfflineQueue: false, maxRetriesPerRequest: 0 });
  await new Promise((r) => redis.once('ready', r));
  const client = await Client.open(redis, { mode: 'auto', timeoutMs: 2000 });
  const o = await client.checkAll([['{c}:a', fixedWindow(1, 60)], ['{c}:b', fixedWindow(5, 60)]], 1);
  const again = await client.checkAll([['{c}:a', fixedWindow(1, 60)], ['{c}:b', fixedWindow(5, 60)]], 1);
  console.log(JSON.stringify([client.mode, o.allowed, again.allowed, again.deniedBy]));
  redis.disconnect();
})();
`,
  );
  const env = { REDIS_URL: server.url };
  assert.equal(
    run([process.execPath, 'esm.mjs'], app, env).trim(),
    JSON.stringify({ outs: [[true, 1, 'module'], [true, 0, 'module'], [false, 0, 'module']], middleware: 'function', alias: true, store: 'function' }),
  );
  assert.equal(run([process.execPath, 'cjs.cjs'], app, env).trim(), JSON.stringify(['module', true, false, 1]));

  // The declarations, strictly, from an ES module and from a CommonJS module.
  writeFileSync(
    join(app, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', strict: true, noEmit: true, skipLibCheck: false, types: ['node'], lib: ['es2022', 'esnext.disposable'] },
      files: ['typed.mts', 'typed.cts'],
    }),
  );
  writeFileSync(
    join(app, 'typed.mts'),
    `import express from 'express';
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { Client, type Decision, type Outcome, RejectedError, concurrency, policy, redisRateLimit, setActualCost, slidingWindow, tokenBucket } from 'ratelimit-client';
const fromNodeRedis: Client = new Client(createClient({ RESP: 2 }), { policy: 'local', instances: 2 });
const fromIORedis: Client = new Client(new Redis({ lazyConnect: true }));
export async function use(): Promise<number> {
  const o: Outcome = await fromNodeRedis.check('k', tokenBucket(10, 5), 2, { signal: AbortSignal.timeout(50) });
  const d: Decision = o.decision;
  await using lease = (await fromIORedis.acquire('jobs', concurrency(3, 30))).lease;
  const app = express();
  app.use(redisRateLimit(fromIORedis, {
    key: { header: 'x-api-key' },
    plan: (req) => req.headers['x-plan'] ?? 'free',
    routeClass: (req) => (req.path.startsWith('/login') ? 'login' : 'api'),
    limits: [{ plan: '*', class: '*', policies: [policy('hourly', slidingWindow(100, 3600))] }],
    headerFormat: 'draft-12',
  }));
  app.get('/', (_req, res) => { setActualCost(res, 3); res.send('ok'); });
  try { await fromIORedis.top(10); } catch (e) { if (e instanceof RejectedError) return e.code.length; }
  return d.remaining + (lease ? 1 : 0);
}
`,
  );
  writeFileSync(
    join(app, 'typed.cts'),
    `import ratelimit = require('ratelimit-client');
const c: ratelimit.Client = new ratelimit.Client({ send: async () => [1, 9, 0, 200, 10] }, { mode: 'module' });
export const limiter: ratelimit.Limiter = c.limiter(ratelimit.gcra(9, 1, 1));
export const store: { increment(key: string): Promise<ratelimit.ClientRateLimitInfo> } = new ratelimit.RateLimitStore({ client: c });
`,
  );
  run([process.execPath, join(PACKAGE_ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], app);
});

test('the declarations stand alone: a project with only TypeScript and the package type-checks strictly', () => {
  const bare = join(dir, 'bare');
  run(['mkdir', '-p', bare], dir);
  writeFileSync(join(bare, 'package.json'), JSON.stringify({ name: 'bare', version: '1.0.0', private: true, type: 'module' }));
  run([...npm, 'install', '--prefer-offline', '--no-audit', '--no-fund', tarball, `typescript@${pkg.devDependencies['typescript']}`], bare);
  // Nothing brings Node's types: the package has no dependency, TypeScript none.
  assert.equal(existsSync(join(bare, 'node_modules', '@types')), false);
  writeFileSync(
    join(bare, 'tsconfig.json'),
    JSON.stringify({ compilerOptions: { strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext', skipLibCheck: false }, files: ['use.mts', 'use.cts'] }),
  );
  writeFileSync(
    join(bare, 'use.mts'),
    `import { Client, type Lease, type Outcome, type RateLimitMiddleware, fastifyRateLimit, fixedWindow, policy, redisRateLimit } from 'ratelimit-client';
export async function use(client: Client, lease?: Lease): Promise<Outcome> {
  const middleware: RateLimitMiddleware = redisRateLimit(client, {
    routeClass: (req) => (req.path.startsWith('/login') ? 'login' : 'api'),
    limits: [{ plan: '*', class: '*', policies: [policy('m', fixedWindow(60, 60))] }],
  });
  await lease?.[Symbol.asyncDispose]();
  void middleware.metrics.renderPrometheus();
  void fastifyRateLimit;
  return client.check('k', fixedWindow(1, 1));
}
`,
  );
  writeFileSync(
    join(bare, 'use.cts'),
    `import ratelimit = require('ratelimit-client');
export const limiter: ratelimit.Limiter = new ratelimit.Client({ send: async () => null }).limiter(ratelimit.gcra(9, 1, 1));
`,
  );
  // TypeScript's default libraries (the DOM's among them), and the language's alone.
  writeFileSync(
    join(bare, 'tsconfig.es2022.json'),
    JSON.stringify({ extends: './tsconfig.json', compilerOptions: { lib: ['es2022'], target: 'es2022' } }),
  );
  for (const config of ['tsconfig.json', 'tsconfig.es2022.json']) {
    const r = spawnSync(process.execPath, [join(bare, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', config], { cwd: bare, encoding: 'utf8' });
    assert.equal(`${r.stdout}${r.stderr}`, '', config);
    assert.equal(r.status, 0, config);
  }
});

test('publishable: not private, its license shipped, every entry point with its types in the tarball', () => {
  const manifest = JSON.parse(readFileSync(join(PACKAGE_ROOT, 'package.json'), 'utf8')) as Record<string, unknown>;
  assert.equal(manifest['private'], undefined);
  assert.equal(manifest['license'], 'MIT');
  assert.deepEqual(manifest['engines'], { node: '>=20' });
  assert.deepEqual(manifest['files'], ['dist/esm', 'dist/cjs', 'README.md', 'LICENSE']);
  assert.equal(manifest['dependencies'], undefined);
  const files = execFileSync('tar', ['-tzf', tarball], { encoding: 'utf8' }).trim().split('\n');
  assert.equal(execFileSync('tar', ['-xzOf', tarball, 'package/LICENSE'], { encoding: 'utf8' }), readFileSync(join(REPO_ROOT, 'LICENSE'), 'utf8'));
  const exports = manifest['exports'] as Record<string, Record<string, Record<string, string>> | string>;
  const targets = [manifest['main'], manifest['types']] as string[];
  for (const [cond, entry] of Object.entries(exports['.'] as Record<string, Record<string, string>>)) {
    // The types condition first, as TypeScript reads the conditions in order.
    assert.deepEqual(Object.keys(entry), ['types', 'default'], cond);
    targets.push(entry['types']!, entry['default']!);
  }
  for (const t of targets) assert.ok(files.includes(`package/${t.replace(/^\.\//, '')}`), t);
});
