/**
 * The conformance table (clients/conformance/cases.json), replayed through this package against
 * a real server under the test clock, in the module, Functions and script modes, with node-redis
 * and with ioredis: every call of the client and every request through the HTTP middleware
 * (Express, and Fastify, over TCP) must give exactly the answer the table records. The format is
 * in clients/conformance/README.md.
 *
 * `CONFORMANCE_CASE=<text>` replays only the cases whose name contains it;
 * `CONFORMANCE_LIBRARIES=node-redis` (or `ioredis`) and `CONFORMANCE_FRAMEWORKS=express` (or
 * `fastify`) narrow the runs; `CONFORMANCE_HTTP=all` replays the HTTP cases with every library
 * behind every framework (by default node-redis behind Express and ioredis behind Fastify).
 */

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import {
  type Algorithm,
  type Batching,
  Client,
  type ClientOptions,
  type Concurrency,
  type Decision,
  type Degraded,
  type Lease,
  LIBRARY,
  type Limit,
  type LocalAnswer,
  type Mode,
  RejectedError,
  type Reservation,
  UnavailableError,
  UnsupportedError,
  concurrency,
  fixedWindow,
  gcra,
  leakyBucket,
  policy,
  slidingLog,
  slidingWindow,
  tokenBucket,
  type Policy,
  type RateLimitOptions,
  type RequestLike,
  pathOf,
} from '../src/index.js';
import { type App, type Framework, Gates, type HttpReply, send, startApp } from './apps.js';
import {
  type Admin,
  type Library,
  type Opened,
  REPO_ROOT,
  Server,
  cmd,
  freePort,
  open,
  ready,
  serverVersion,
  sleep,
} from './harness.js';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type Obj = { [k: string]: Json };

const MODES: Mode[] = ['module', 'function', 'script'];

const table = JSON.parse(readFileSync(join(REPO_ROOT, 'clients', 'conformance', 'cases.json'), 'utf8')) as Obj;
const only = process.env['CONFORMANCE_CASE'];
const libraries = (process.env['CONFORMANCE_LIBRARIES'] ?? 'node-redis,ioredis').split(',') as Library[];
const frameworks = (process.env['CONFORMANCE_FRAMEWORKS'] ?? 'express,fastify').split(',') as Framework[];

function num(v: Json | undefined, field: string): number {
  const x = (v as Obj | undefined)?.[field];
  if (typeof x !== 'number') throw new Error(`${field} missing in ${JSON.stringify(v)}`);
  return x;
}

function algorithm(v: Json): Algorithm {
  const o = v as Obj;
  switch (o['algorithm']) {
    case 'token_bucket':
      return tokenBucket(num(o, 'capacity'), num(o, 'refill_per_sec'));
    case 'leaky_bucket':
      return leakyBucket(num(o, 'capacity'), num(o, 'leak_per_sec'));
    case 'fixed_window':
      return fixedWindow(num(o, 'limit'), num(o, 'window_sec'));
    case 'sliding_window':
      return slidingWindow(num(o, 'limit'), num(o, 'window_sec'));
    case 'sliding_log':
      return slidingLog(num(o, 'limit'), num(o, 'window_sec'));
    case 'gcra':
      return gcra(num(o, 'max_burst'), num(o, 'count_per_period'), num(o, 'period_sec'));
    case 'concurrency':
      return concurrency(num(o, 'limit'), num(o, 'lease_sec'));
    default:
      throw new Error(`unknown algorithm ${JSON.stringify(o['algorithm'])}`);
  }
}

function options(c: Obj, mode: Mode): ClientOptions {
  const o = (c['options'] ?? {}) as Obj;
  const policies: Record<string, ClientOptions['policy']> = {
    fail_open: 'fail-open',
    fail_closed: 'fail-closed',
    local: 'local',
  };
  const p = (o['policy'] as string | undefined) ?? 'fail_open';
  if (!(p in policies)) throw new Error(`unknown policy ${p}`);
  const out: ClientOptions = { mode, policy: policies[p]! };
  if (p === 'local') out.instances = num(o, 'instances');
  // A case without `timeout_ms` gets a long one rather than the client's 100 ms: no expectation
  // depends on it (an unreachable or stopped server refuses at once), and on a loaded machine a
  // late answer would otherwise turn into a spurious degraded one.
  out.timeoutMs = typeof o['timeout_ms'] === 'number' ? o['timeout_ms'] : 2000;
  if (typeof o['fail_closed_retry_ms'] === 'number') out.failClosedRetryMs = o['fail_closed_retry_ms'];
  const breaker: NonNullable<ClientOptions['breaker']> = {};
  if (typeof o['breaker_failures'] === 'number') breaker.failures = o['breaker_failures'];
  if (typeof o['breaker_cooldown_ms'] === 'number') breaker.cooldownMs = o['breaker_cooldown_ms'];
  out.breaker = breaker;
  return out;
}

/** The client of a case: its options, and the deny cache (`deny_cache: {entries}`) when it has one. */
function clientOf(connection: Opened['connection'], c: Obj, mode: Mode): Client {
  const client = new Client(connection, options(c, mode));
  const dc = ((c['options'] ?? {}) as Obj)['deny_cache'] as Obj | undefined;
  if (dc !== undefined) client.withDenyCache(num(dc, 'entries'));
  const b = ((c['options'] ?? {}) as Obj)['batching'] as Obj | undefined;
  if (b !== undefined) {
    const batching: Batching = {};
    if (Array.isArray(b['hot_keys'])) batching.hotKeys = b['hot_keys'] as string[];
    if (typeof b['initial'] === 'number') batching.initial = b['initial'];
    if (typeof b['max_batch'] === 'number') batching.maxBatch = b['max_batch'];
    if (typeof b['remaining_share'] === 'number') batching.remainingShare = b['remaining_share'];
    if (typeof b['lease_ms'] === 'number') batching.leaseMs = b['lease_ms'];
    if (typeof b['detect_per_sec'] === 'number') batching.detectPerSec = b['detect_per_sec'];
    client.withBatching(batching);
  }
  return client;
}

function decision(d: Decision): Json {
  return [d.allowed ? 1 : 0, d.remaining, d.retryAfterMs, d.resetAfterMs, d.limit];
}

function error(e: unknown): Json {
  if (e instanceof RejectedError) return { error: 'rejected', message: e.reply };
  if (e instanceof UnsupportedError) return { error: 'unsupported' };
  if (e instanceof UnavailableError) return { error: 'unavailable' };
  throw e;
}

/** The HTTP middleware's options of a case's `layer`. */
function layerOptions(c: Obj): RateLimitOptions<RequestLike> {
  const l = c['layer'] as Obj;
  const limits = c['limits'] as Obj;
  const out: RateLimitOptions<RequestLike> = { limits: [] };
  const key = l['key'] as Obj | undefined;
  if (key && typeof key['header'] === 'string') out.key = { header: key['header'] };
  else if (key && Array.isArray(key['client_ip'])) out.key = { clientIp: { trustedProxies: key['client_ip'] as string[] } };
  const plan = l['plan'] as Obj | undefined;
  if (plan && typeof plan['header'] === 'string') {
    const h = plan['header'];
    const dflt = (plan['default'] as string | undefined) ?? 'default';
    out.plan = (req) => {
      const v = req.headers[h];
      return typeof v === 'string' ? v : dflt;
    };
  }
  const rc = l['route_class'];
  if (rc === 'path') out.routeClass = (req) => pathOf(req).replace(/^\/+/, '');
  else if (rc && typeof rc === 'object' && !Array.isArray(rc)) {
    const prefixes = (rc['prefixes'] as string[][]).map(([p, cls]) => [p!, cls!] as const);
    const dflt = (rc['default'] as string | undefined) ?? 'default';
    out.routeClass = (req) => prefixes.find(([p]) => pathOf(req).startsWith(p))?.[1] ?? dflt;
  }
  out.limits = (l['limits'] as Obj[]).map((e) => ({
    plan: e['plan'] as string,
    class: e['class'] as string,
    policies: (e['policies'] as Obj[]).map(
      (p): Policy => policy(p['name'] as string, algorithm(limits[p['limit'] as string]!), { shadow: p['shadow'] === true }),
    ),
  }));
  if (l['estimates']) out.estimates = l['estimates'] as Record<string, number>;
  out.legacyHeaders = l['legacy_headers'] === true;
  // Off unless the case turns it on: it counts down on the process's clock, which the test clock does not move.
  out.denyCache = l['deny_cache'] === true;
  const format = l['header_format'];
  if (format !== undefined) {
    if (format !== 'draft-11' && format !== 'draft-12') throw new Error(`unknown header_format ${JSON.stringify(format)}`);
    out.headerFormat = format;
  }
  return out;
}

/** `expect` matches `got`: equal, where a `[min, max]` stands for a number in that range. */
function matches(expect: Json, got: Json | undefined): boolean {
  if (Array.isArray(expect) && typeof got === 'number' && expect.length === 2 && expect.every((x) => typeof x === 'number')) {
    return (expect[0] as number) <= got && got <= (expect[1] as number);
  }
  if (Array.isArray(expect)) return Array.isArray(got) && expect.length === got.length && expect.every((x, i) => matches(x, got[i]));
  if (expect !== null && typeof expect === 'object') {
    if (got === null || typeof got !== 'object' || Array.isArray(got)) return false;
    const ek = Object.keys(expect);
    return ek.length === Object.keys(got).length && ek.every((k) => k in got && matches(expect[k]!, got[k]));
  }
  return expect === got;
}

/** A step's expectation in `mode`: its own when the table gives one per mode. */
function expectation(step: Obj, mode: Mode): Json | undefined {
  const e = step['expect'];
  if (e && typeof e === 'object' && !Array.isArray(e) && MODES.some((m) => m in e)) return e[mode] ?? null;
  return e;
}

const OPS = [
  'check', 'peek', 'check_all', 'check_upto', 'check_all_upto', 'flush', 'close', 'acquire', 'acquire_all', 'renew', 'release', 'release_id', 'reserve', 'reserve_all',
  'settle', 'settle_delta', 'top', 'reset_top', 'redis', 'request', 'finish', 'wait_leases', 'metrics', 'keys', 'calls',
  'stop_redis',
];

function stepOp(step: Obj): string {
  const op = OPS.find((o) => o in step);
  if (!op) throw new Error(`a step without an operation: ${JSON.stringify(step)}`);
  return op;
}

/** The replay's server: the module under the test clock, the Functions library loaded. */
class Harness {
  server: Server | undefined;
  admin: Admin | undefined;
  async up(): Promise<{ server: Server; admin: Admin }> {
    if (!this.server) this.server = await Server.start({ testClock: true });
    if (!this.admin) {
      this.admin = await this.server.admin();
      // The library as the package bundles it (tests/bundle.test.ts holds it to lua-reference/).
      assert.equal(await cmd(this.admin, 'FUNCTION', 'LOAD', 'REPLACE', LIBRARY), 'ratelimit');
    }
    return { server: this.server, admin: this.admin };
  }

  /** An empty server at `startUs`: no keys, counters, cached scripts; RL.TOP empty. */
  async reset(startUs: number): Promise<{ server: Server; admin: Admin }> {
    const up = await this.up();
    for (const args of [
      ['FLUSHALL'],
      ['SCRIPT', 'FLUSH'],
      ['CONFIG', 'SET', 'ratelimit.top-slots', '128'],
      ['RL.TOP', 'RESET'],
      ['CONFIG', 'RESETSTAT'],
      ['RL.TESTCLOCK', 'SET', String(startUs)],
    ]) {
      await up.admin.sendCommand(args);
    }
    return up;
  }

  async kill(): Promise<void> {
    this.admin?.destroy();
    this.admin = undefined;
    await this.server?.kill();
  }

  /** A server killed by a case comes back (same port, empty) for the next run. */
  async revive(): Promise<void> {
    if (this.server && !this.admin) await this.server.launch();
  }

  async stop(): Promise<void> {
    this.admin?.destroy();
    await this.server?.stop();
  }
}

/** One run of a case: a mode, a library, for an HTTP case a framework. */
class Run {
  readonly leases = new Map<string, Lease>();
  readonly reservations = new Map<string, Reservation>();
  readonly held = new Map<string, Promise<HttpReply>>();
  readonly gates = new Gates();
  readonly problems: string[] = [];
  app: App | undefined;

  constructor(
    readonly c: Obj,
    readonly mode: Mode,
    readonly client: Client,
    readonly harness: Harness,
  ) {}

  get admin(): Admin {
    if (!this.harness.admin) throw new Error('the server is stopped');
    return this.harness.admin;
  }

  algorithm(name: Json): Algorithm {
    const limits = this.c['limits'] as Obj;
    const v = limits[name as string];
    if (v === undefined) throw new Error(`no limit ${JSON.stringify(name)}`);
    return algorithm(v);
  }

  limits(v: Json): Limit[] {
    return (v as Json[][]).map((p) => [p[0] as string, this.algorithm(p[1]!)] as const);
  }

  concurrency(name: Json): Concurrency {
    const a = this.algorithm(name);
    if (a.kind !== 'concurrency') throw new Error('a concurrency limit');
    return a;
  }

  /** Adds `degraded` when the answer did not come from Redis; else checks the run's mode answered. */
  provenance(obs: Obj, degraded: Degraded | undefined, mode: Mode | undefined, local?: LocalAnswer): Obj {
    if (local !== undefined) obs['answered_locally'] = local;
    if (degraded !== undefined) obs['degraded'] = degraded;
    else if (mode !== this.mode) this.problems.push(`answered by ${mode ?? 'none'} in ${this.mode} mode`);
    return obs;
  }

  /** A check's `granted`: its cost when admitted, 0 when denied (fail-open grants what was asked). */
  granted(got: number, allowed: boolean, cost: number): void {
    if (got !== (allowed ? cost : 0)) this.problems.push(`granted ${got}, not ${allowed ? cost : 0}`);
  }

  holdLease(arg: Obj, admitted: boolean, lease: Lease | undefined, obs: Obj): void {
    if ((lease !== undefined) !== admitted) this.problems.push(`a lease ${admitted ? 'missing with' : 'without'} an admission`);
    if (!lease) return;
    if (!lease.holdsSlot) obs['holds_slot'] = false;
    const name = (arg['lease'] ?? arg['id']) as string | undefined;
    if (name === undefined) throw new Error('a name for the lease');
    if (typeof arg['id'] === 'string' && (lease.id !== arg['id'] || lease.key !== ((arg['key'] as string | undefined) ?? lease.key))) {
      this.problems.push(`lease ${lease.id} on ${lease.key}`);
    }
    this.leases.set(name, lease);
  }

  holdReservation(arg: Obj, admitted: boolean, r: Reservation | undefined): void {
    if ((r !== undefined) !== admitted) this.problems.push('a reservation without an admission, or none with one');
    if (r) this.reservations.set(arg['reservation'] as string, r);
  }

  async step(op: string, arg: Json): Promise<Json> {
    const a = (arg ?? {}) as Obj;
    try {
      return await this.stepOrThrow(op, a, arg);
    } catch (e) {
      return error(e);
    }
  }

  private async stepOrThrow(op: string, a: Obj, arg: Json): Promise<Json> {
    switch (op) {
      case 'check':
      case 'peek': {
        const key = a['key'] as string;
        const algo = this.algorithm(a['limit']!);
        const o =
          op === 'peek'
            ? await this.client.limiter(algo).peek(key)
            : await this.client.check(key, algo, (a['cost'] as number | undefined) ?? 1);
        this.granted(o.granted, o.decision.allowed, op === 'peek' ? 0 : ((a['cost'] as number | undefined) ?? 1));
        return this.provenance({ decision: decision(o.decision) }, o.degraded, o.mode, o.answeredLocally);
      }
      case 'check_all': {
        const cost = (a['cost'] as number | undefined) ?? 1;
        const o = await this.client.checkAll(this.limits(a['limits']!), cost);
        this.granted(o.granted, o.allowed, cost);
        return this.provenance({ allowed: o.allowed, denied_by: o.deniedBy, decisions: o.decisions.map(decision) }, o.degraded, o.mode, o.answeredLocally);
      }
      case 'check_upto': {
        const o = await this.client.checkUpto(a['key'] as string, this.algorithm(a['limit']!), a['upto'] as number);
        return this.provenance({ decision: decision(o.decision), granted: o.granted }, o.degraded, o.mode, o.answeredLocally);
      }
      case 'check_all_upto': {
        const o = await this.client.checkAllUpto(this.limits(a['limits']!), a['upto'] as number);
        return this.provenance(
          { allowed: o.allowed, denied_by: o.deniedBy, decisions: o.decisions.map(decision), granted: o.granted },
          o.degraded,
          o.mode,
          o.answeredLocally,
        );
      }
      case 'acquire': {
        const key = a['key'] as string;
        const c = this.concurrency(a['limit']!);
        const o = typeof a['id'] === 'string' ? await this.client.acquireAs(key, c, a['id']) : await this.client.acquire(key, c);
        const obs = this.provenance({ decision: decision(o.outcome.decision) }, o.outcome.degraded, o.outcome.mode);
        this.holdLease(a, o.outcome.decision.allowed, o.lease, obs);
        return obs;
      }
      case 'acquire_all': {
        const cost = (a['cost'] as number | undefined) ?? 1;
        const o = await this.client.acquireAll(this.limits(a['limits']!), cost);
        const out = o.outcome;
        const obs = this.provenance({ allowed: out.allowed, denied_by: out.deniedBy, decisions: out.decisions.map(decision) }, out.degraded, out.mode);
        this.holdLease(a, out.allowed && cost > 0, o.lease, obs);
        return obs;
      }
      case 'renew': {
        const lease = this.leases.get(arg as string);
        if (!lease) return { no_lease: true };
        const o = await lease.renew();
        if (lease.lastRenewal !== o) this.problems.push('lastRenewal is not the renewal');
        return this.provenance({ decision: decision(o.decision) }, o.degraded, o.mode);
      }
      case 'release': {
        const lease = this.leases.get(arg as string);
        if (!lease) return { no_lease: true };
        this.leases.delete(arg as string);
        return { released: await lease.release() };
      }
      case 'release_id':
        return { released: await this.client.release(a['key'] as string, a['id'] as string) };
      case 'reserve': {
        const o = await this.client.reserve(a['key'] as string, this.algorithm(a['limit']!), a['estimate'] as number);
        const obs = this.provenance({ decision: decision(o.outcome.decision) }, o.outcome.degraded, o.outcome.mode);
        this.holdReservation(a, o.outcome.decision.allowed, o.reservation);
        return obs;
      }
      case 'reserve_all': {
        const o = await this.client.reserveAll(this.limits(a['limits']!), a['estimate'] as number);
        const out = o.outcome;
        const obs = this.provenance({ allowed: out.allowed, denied_by: out.deniedBy, decisions: out.decisions.map(decision) }, out.degraded, out.mode);
        this.holdReservation(a, out.allowed, o.reservation);
        return obs;
      }
      case 'settle': {
        const name = a['reservation'] as string;
        const r = this.reservations.get(name);
        if (!r) return { no_reservation: true };
        this.reservations.delete(name);
        const s = await r.settle(a['actual'] as number);
        return this.provenance({ decisions: s.decisions.map(decision) }, s.degraded, s.mode);
      }
      case 'settle_delta': {
        const s = await this.client.settle(this.limits(a['limits']!), a['delta'] as number);
        return this.provenance({ decisions: s.decisions.map(decision) }, s.degraded, s.mode);
      }
      case 'flush':
        return { returned: await this.client.flush() };
      case 'close':
        return { returned: await this.client.close() };
      case 'top': {
        const entries = await this.client.top(arg as number);
        return { entries: entries.map((e) => [e.key, e.denied, e.error, e.command, e.firstDeniedMs, e.lastDeniedMs]) };
      }
      case 'reset_top':
        await this.client.resetTop();
        return {};
      case 'redis': {
        const args = (arg as Json[]).map((x) => (typeof x === 'string' ? x : JSON.stringify(x)));
        try {
          return { reply: (await this.admin.sendCommand(args)) as Json };
        } catch (e) {
          return { error: (e as Error).message };
        }
      }
      case 'request': {
        if (!this.app) throw new Error('a case with a layer');
        const headers: Record<string, string> = { ...((a['headers'] as Record<string, string> | undefined) ?? {}) };
        if (typeof a['used'] === 'number') headers['x-used'] = String(a['used']);
        const hold = a['hold'] as string | undefined;
        if (hold !== undefined) headers['x-hold'] = hold;
        const sent = send(this.app.port, {
          path: a['path'] as string,
          headers,
          peer: (a['peer'] as string | undefined) ?? '127.0.0.1',
          stream: a['stream'] === true,
        });
        if (hold !== undefined) {
          sent.catch(() => undefined);
          this.held.set(hold, sent);
          // In the handler, or answered without reaching it.
          const reached = await Promise.race([
            this.gates.reached(hold).then(() => true),
            sent.then(() => true, () => true),
            sleep(5000).then(() => false),
          ]);
          if (!reached) this.problems.push(`${hold} never reached its handler`);
          return null;
        }
        return httpJson(await sent);
      }
      case 'finish': {
        const name = arg as string;
        this.gates.release(name);
        const held = this.held.get(name);
        if (!held) throw new Error(`no held request ${name}`);
        this.held.delete(name);
        return httpJson(await held);
      }
      case 'wait_leases': {
        const deadline = Date.now() + 5000;
        for (;;) {
          const n = Number(await cmd(this.admin, 'ZCARD', a['key'] as string));
          if (n === a['count']) return null;
          if (Date.now() > deadline) return { leases: n };
          await sleep(2);
        }
      }
      case 'metrics':
        if (!this.app) throw new Error('a case with a layer');
        return this.app.metrics.renderPrometheus();
      case 'keys':
        return ((await cmd(this.admin, 'KEYS', '*')) as string[]).sort();
      case 'calls': {
        const info = String(await cmd(this.admin, 'INFO', 'commandstats'));
        const out: Obj = {};
        for (const c of ((a[this.mode] as string[] | undefined) ?? [])) {
          const m = new RegExp(`^cmdstat_${c.replace('.', '\\.')}:calls=(\\d+)`, 'm').exec(info);
          out[c] = m ? Number(m[1]) : 0;
        }
        return out;
      }
      default:
        throw new Error(`unknown step ${op}`);
    }
  }
}

function httpJson(r: HttpReply): Json {
  const o: Obj = { status: r.status, headers: r.headers };
  if (r.body !== undefined) o['body'] = r.body;
  if (r.shadowDenials !== undefined) o['shadow_denials'] = r.shadowDenials;
  return o;
}

/**
 * The runs of a case: each mode with each library; an HTTP case with node-redis behind Express and
 * ioredis behind Fastify (each library and each framework on every case), or every pair of them
 * with `CONFORMANCE_HTTP=all`.
 */
function runsOf(c: Obj): Array<{ mode: Mode; library: Library; framework: Framework | undefined }> {
  const modes = Array.isArray(c['modes']) ? MODES.filter((m) => (c['modes'] as Json[]).includes(m)) : MODES;
  let pairs: Array<[Library, Framework | undefined]> = libraries.map((l) => [l, undefined]);
  if (c['layer']) {
    const all = process.env['CONFORMANCE_HTTP'] === 'all';
    pairs = libraries.flatMap((l) => frameworks.map((f): [Library, Framework] => [l, f]));
    if (!all && libraries.length === 2 && frameworks.length === 2) pairs = [['node-redis', 'express'], ['ioredis', 'fastify']];
  }
  return pairs.flatMap(([library, framework]) => modes.map((mode) => ({ mode, library, framework })));
}

/** The features a case may require (`requires` in the table) that this package implements. */
const SUPPORTED: ReadonlySet<string> = new Set<string>(['partial_grants', 'deny_cache', 'batches']);

test(`the conformance table on ${serverVersion()}`, async (t) => {
  const startUs = table['clock_start_us'] as number;
  const harness = new Harness();
  let replayed = 0;
  try {
    for (const c of table['cases'] as Obj[]) {
      const name = c['name'] as string;
      if (only !== undefined && !name.includes(only)) continue;
      const missing = ((c['requires'] as Json[] | undefined) ?? []).filter((r) => !SUPPORTED.has(r as string));
      if (missing.length > 0) {
        await t.test(name, { skip: `requires ${missing.join(', ')}, not implemented by this package` }, () => {});
        continue;
      }
      replayed += 1;
      await t.test(name, async () => {
        const failures: string[] = [];
        for (const { mode, library, framework } of runsOf(c)) {
          const label = `[${mode}, ${library}${framework ? `, ${framework}` : ''}]`;
          await harness.revive();
          const { server } = await harness.reset(startUs);
          const unreachable = c['redis'] === 'unreachable';
          const opened: Opened = open(library, unreachable ? await freePort() : server.port);
          if (!unreachable) await ready(opened);
          const client = clientOf(opened.connection, c, mode);
          const run = new Run(c, mode, client, harness);
          try {
            if (c['layer']) run.app = await startApp(framework!, client, layerOptions(c), run.gates);
            const steps = c['steps'] as Obj[];
            for (const [si, step] of steps.entries()) {
              if (typeof step['advance_us'] === 'number' && step['advance_us'] !== 0) {
                await cmd(run.admin, 'RL.TESTCLOCK', 'ADVANCE', step['advance_us']);
              }
              const op = stepOp(step);
              let obs: Json;
              if (op === 'stop_redis') {
                await harness.kill();
                obs = null;
              } else obs = await run.step(op, step[op]!);
              for (const p of run.problems.splice(0)) failures.push(`${label} step ${si} (${op}): ${p}`);
              const expect = expectation(step, mode);
              const fine = expect === undefined || expect === null ? obs === null : matches(expect, obs);
              if (!fine) failures.push(`${label} step ${si} (${op}): expected ${JSON.stringify(expect)}, got ${JSON.stringify(obs)}`);
            }
          } finally {
            // Requests still held are let go before the next run.
            run.gates.releaseAll();
            await Promise.allSettled(run.held.values());
            await run.app?.close();
            await opened.close();
          }
        }
        assert.deepEqual(failures, []);
      });
    }
  } finally {
    await harness.stop();
  }
  assert.ok(replayed > 0, 'no case matched');
});
