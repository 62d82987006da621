/**
 * HTTP rate limiting without a framework: limits per route class and plan, the IETF
 * `RateLimit-Policy` and `RateLimit` response fields (draft-ietf-httpapi-ratelimit-headers),
 * optionally the older `RateLimit-Limit` / `-Remaining` / `-Reset`, 429 with `Retry-After` and a
 * problem+json body, `RateLimit-Degraded` when Redis could not decide, concurrency slots held
 * while a request is in flight, estimates settled with the actual cost, shadow policies, and
 * counters per limit. The Express middleware and the Fastify plugin are built on it.
 */

import { isIP } from 'node:net';

import { type Algorithm, type Limit, windowSecs } from '../algorithm.js';
import type { Client } from '../client.js';
import { DenyCache } from '../deny.js';
import type { Lease } from '../lease.js';
import { Metrics, type PromRegistry, exposeBreakerToPrometheus, exposeToPrometheus, renderBreakerGauge } from '../metrics.js';
import { Reservation } from '../reservation.js';
import type { Decision, Degraded, Mode, MultiOutcome } from '../types.js';

/** A named limit. */
export interface Policy {
  readonly name: string;
  readonly algorithm: Algorithm;
  /**
   * A shadow policy, for rolling a new limit out: evaluated on the requests that the route's
   * enforced policies admit, each in a call of its own after theirs, consuming as it would if
   * enforced; shown in the response fields and counted (`outcome="shadow_denied"` for the
   * requests it would have refused), but never refusing one. The enforced policies decide and
   * consume exactly as if it were not there.
   */
  readonly shadow?: boolean;
}

/** A policy named `name`; `{ shadow: true }` for a shadow policy. */
export function policy(name: string, algorithm: Algorithm, options: { shadow?: boolean } = {}): Policy {
  return { name, algorithm, shadow: options.shadow ?? false };
}

/** The request as the middleware sees it: a Node request (Express's and Fastify's raw one are). */
export interface RequestLike {
  readonly headers: Record<string, string | string[] | undefined>;
  readonly url?: string | undefined;
  readonly socket?: { readonly remoteAddress?: string | undefined } | undefined;
}

/**
 * What the middleware uses of the response: `node:http`'s `ServerResponse` (Express's `Response`
 * is one), described by its shape so that the declarations need no `@types/node`.
 */
export interface ResponseLike {
  statusCode: number;
  readonly headersSent: boolean;
  readonly writableEnded: boolean;
  readonly destroyed: boolean;
  setHeader(name: string, value: number | string | readonly string[]): unknown;
  writeHead(statusCode: number, ...rest: never[]): unknown;
  write(chunk: never, ...rest: never[]): boolean;
  end(...args: never[]): unknown;
  once(event: 'finish' | 'close', listener: () => void): unknown;
}

/**
 * What the options' functions see of a request by default in the Express middleware: Express's
 * request as far as its own fields go (`path`, the URL's path). Any other request type is given
 * by annotating a function's parameter (`(req: Request) => ...`, Express's `Request` or
 * `node:http`'s `IncomingMessage`) or as the type argument.
 */
export interface ExpressRequestLike extends RequestLike {
  /** The path of the request's URL (Express's `req.path`). */
  readonly path: string;
  readonly method?: string | undefined;
}

/**
 * The `RateLimit` fields' format: `'draft-11'` (`RateLimit-Policy` and `RateLimit` with `r` and
 * `t`) or `'draft-12'` (the next revision as its editors' text describes it: `a`, `w`, the cost
 * `c`, and `RateLimit-Partition`).
 */
export type HeaderFormat = 'draft-11' | 'draft-12';

/**
 * What a plan or a route class may be given as: a string, or a header's value as Node gives it
 * (a repeated header's values are joined with `, `; undefined is `'default'`).
 */
export type Label = string | readonly string[] | undefined;

function label(v: Label): string {
  if (v === undefined) return 'default';
  return typeof v === 'string' ? v : v.join(', ');
}

/**
 * Who a request is counted against: a header's value (an API key, a user id set by an
 * authentication layer), the client's IP (the peer address, or, when the peer is one of
 * `trustedProxies`, the rightmost address of `X-Forwarded-For` that is not a trusted proxy;
 * `X-Forwarded-For` from anyone else is ignored), or anything computed from the request.
 * Without a key the request counts against `anonymous`.
 */
export type KeySource<Req> =
  | { readonly header: string }
  | { readonly clientIp: { readonly trustedProxies?: readonly string[] } }
  | ((req: Req) => string | undefined);

/** The policies of a plan on a route class (`'*'` matches any). */
export interface LimitsEntry {
  readonly plan: string;
  readonly class: string;
  readonly policies: readonly Policy[];
}

export interface RateLimitOptions<Req> {
  /** Who requests are counted against (default: the client IP, no proxy trusted). */
  key?: KeySource<Req>;
  /**
   * Requests the middleware leaves alone: no decision, no fields, nothing counted (a `/metrics`
   * or health route mounted after the middleware).
   */
  skip?: (req: Req) => boolean;
  /** The route class of a request (default: `'default'` for every request). */
  routeClass?: (req: Req) => Label;
  /** The plan of the request's client, looked up on every request (default: `'default'`). */
  plan?: (req: Req) => Label;
  /**
   * The policies of (plan, class), looked up as (plan, class), ('*', class), (plan, '*'),
   * ('*', '*'); a later entry for the same pair replaces an earlier one. Or a function of them.
   * All the policies of a request apply at once (one `RL.ALL`); none: the request passes
   * untouched.
   */
  limits: readonly LimitsEntry[] | ((plan: string, routeClass: string) => readonly Policy[]);
  /**
   * Units a request of a route class (`'*'`: any class without its own) reserves from each of
   * its limits before the handler runs (default 1). A handler that reports its actual cost
   * (`setActualCost`) has the difference refunded or charged before the response leaves; with
   * no report the estimate stands.
   */
  estimates?: Readonly<Record<string, number>>;
  /** Also send `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (default false). */
  legacyHeaders?: boolean;
  /** The format of the `RateLimit` fields (default `'draft-11'`). */
  headerFormat?: HeaderFormat;
  /** Prefix of the Redis keys (default `rl`): `rl:{<key>}:<class>:<policy>`. */
  prefix?: string;
  /** Renew the concurrency leases of requests still in flight every this many ms (default never). */
  leaseKeepAliveMs?: number;
  /** Counters to share with another middleware (default: new ones). */
  metrics?: Metrics;
  /**
   * The counters through prom-client when it is installed: `true` (default) in its global
   * registry, a registry of your own, or `false`.
   */
  prometheus?: boolean | PromRegistry;
  /**
   * The deny cache (default on, {@link DENY_CACHE_ENTRIES} entries): a request denied by Redis
   * with `retryAfterMs` R is denied again in the process, without calling Redis, until R has
   * passed on the process's clock (counted `outcome="deny_cache"`). `false`: every request asks
   * Redis (the client's own deny cache is not used either). It counts down on the process's
   * clock: a test that moves the server's clock turns it off.
   */
  denyCache?: boolean;
  /** The deny cache's entries at most, the least recently used evicted first (default {@link DENY_CACHE_ENTRIES}). */
  denyCacheEntries?: number;
}

/** Entries of the middleware's deny cache unless `RateLimitOptions.denyCacheEntries` says otherwise. */
export const DENY_CACHE_ENTRIES = 10_000;

/** The header fields of a response, lower-case names in the order they are set. */
export type Fields = Array<[string, string]>;

function ceilSecs(ms: number): number {
  return Math.ceil(ms / 1000);
}

/** Policy names go into structured-field strings: keep them to safe characters. */
function sfString(name: string): string {
  let out = '';
  for (const c of name) {
    const code = c.codePointAt(0)!;
    out += code > 0x20 && code < 0x7f && c !== '"' && c !== '\\' ? c : '_';
  }
  return out;
}

/**
 * The response fields for these policies and their decisions: `RateLimit-Policy`, `RateLimit`,
 * the legacy fields when asked, `RateLimit-Degraded` when the answer did not come from Redis. A
 * concurrency limit's policy has the quota unit `qu="concurrent-requests"` and no window.
 */
export function rateLimitFields(
  policies: readonly Policy[],
  outcome: MultiOutcome,
  legacy: boolean,
  format: { readonly headerFormat?: HeaderFormat; readonly cost?: number } = {},
): Fields {
  const fields: Fields = [];
  const pairs = policies.map((p, i) => [p, outcome.decisions[i]!] as const);
  const draft12 = (format.headerFormat ?? 'draft-11') === 'draft-12';
  fields.push([
    'ratelimit-policy',
    pairs
      .map(([p, d]) =>
        p.algorithm.kind === 'concurrency'
          ? `"${sfString(p.name)}";q=${d.limit};qu="concurrent-requests"`
          : `"${sfString(p.name)}";q=${d.limit};w=${windowSecs(p.algorithm)}`,
      )
      .join(', '),
  ]);
  if (draft12) {
    // c: the units this request took from the policy: its cost where it was admitted and the
    // policy allowed it (1 for a concurrency slot), else 0.
    const cost = format.cost ?? 1;
    const took = (p: Policy, d: Decision): number => (outcome.allowed && d.allowed ? (p.algorithm.kind === 'concurrency' ? 1 : cost) : 0);
    fields.push([
      'ratelimit',
      pairs.map(([p, d]) => `"${sfString(p.name)}";a=${d.remaining};w=${ceilSecs(d.resetAfterMs)};c=${took(p, d)}`).join(', '),
    ]);
    fields.push(['ratelimit-partition', pairs.map(([p]) => `"${sfString(p.name)}";client_id`).join(', ')]);
  } else {
    fields.push(['ratelimit', pairs.map(([p, d]) => `"${sfString(p.name)}";r=${d.remaining};t=${ceilSecs(d.resetAfterMs)}`).join(', ')]);
  }
  const d = legacy ? tightest(policies, outcome) : undefined;
  if (d) {
    fields.push(['ratelimit-limit', String(d.limit)]);
    fields.push(['ratelimit-remaining', String(d.remaining)]);
    fields.push(['ratelimit-reset', String(ceilSecs(d.resetAfterMs))]);
  }
  if (outcome.degraded) fields.push(['ratelimit-degraded', outcome.degraded]);
  return fields;
}

/**
 * The limit that decided: the one that denied, else the enforced one with the fewest units left
 * (the first of them on a tie; shadow policies never decide).
 */
function tightest(policies: readonly Policy[], outcome: MultiOutcome): Decision | undefined {
  if (outcome.deniedBy > 0) return outcome.decisions[outcome.deniedBy - 1];
  let best: Decision | undefined;
  policies.forEach((p, i) => {
    const d = outcome.decisions[i]!;
    if (!p.shadow && (best === undefined || d.remaining < best.remaining)) best = d;
  });
  return best;
}

/** A response the middleware sends itself: a 429 or a 500. */
export interface Refusal {
  readonly status: number;
  readonly fields: Fields;
  readonly body: string;
}

function problem500(message: string): Refusal {
  const body = JSON.stringify({
    detail: `rate limiter: ${message}`,
    status: 500,
    title: 'Internal Server Error',
    type: 'about:blank',
  });
  return { status: 500, fields: [['content-type', 'application/problem+json']], body };
}

function tooMany(policies: readonly Policy[], outcome: MultiOutcome, fields: Fields): Refusal {
  const i = Math.max(outcome.deniedBy, 1) - 1;
  const d = outcome.decisions[i]!;
  const name = policies[i]!.name;
  const secs = Math.max(ceilSecs(d.retryAfterMs >= 0 ? d.retryAfterMs : d.resetAfterMs), 1);
  const body = JSON.stringify({
    detail: `rate limit '${name}' exceeded; retry in ${secs} s`,
    limit: name,
    retry_after: secs,
    status: 429,
    title: 'Too Many Requests',
    type: 'about:blank',
  });
  return {
    status: 429,
    fields: [['content-type', 'application/problem+json'], ['retry-after', String(secs)], ...fields],
    body,
  };
}

/** What the middleware knows of a request it let through (see `rateLimitInfo`). */
export interface RateLimitInfo {
  /** The shadow policies that would have refused the request, in the route's order. */
  readonly shadowDenials: readonly string[];
  /** Every policy answered for, in the route's order, with its decision. */
  readonly policies: readonly Policy[];
  readonly decisions: readonly Decision[];
  readonly degraded: Degraded | undefined;
  readonly mode: Mode | undefined;
}

/** A request let through: its fields now, and what to do once the handler has answered. */
export interface Admitted {
  readonly info: RateLimitInfo;
  readonly fields: Fields;
  readonly estimate: number;
  /** Whether `settle(actual)` would change anything (an actual cost other than the estimate). */
  needsSettlement(actual: number | undefined): boolean;
  /** Settles the estimate with the actual cost; the fields after settlement. */
  settle(actual: number): Promise<Fields>;
  /** Gives the request's concurrency slots back (once; later calls do nothing). */
  release(): void;
}

export type Admission = { kind: 'pass' } | { kind: 'refuse'; refusal: Refusal; info?: RateLimitInfo } | { kind: 'admit'; admitted: Admitted };

/** A peer address as the key and the trusted-proxy list read it (`::ffff:1.2.3.4` is `1.2.3.4`). */
export function canonicalIp(ip: string): string | undefined {
  const v = isIP(ip);
  if (v === 4) return ip;
  if (v !== 6) return undefined;
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  if (mapped && isIP(mapped[1]!) === 4) return mapped[1];
  return expandV6(ip);
}

/** An IPv6 address in its canonical text form (RFC 5952: lower case, the longest zero run as ::). */
function expandV6(ip: string): string {
  let s = ip.toLowerCase();
  const zone = s.indexOf('%');
  if (zone >= 0) s = s.slice(0, zone);
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s);
  if (v4) {
    const n = v4.slice(1).map(Number) as [number, number, number, number];
    s = s.slice(0, v4.index) + `${((n[0] << 8) | n[1]).toString(16)}:${((n[2] << 8) | n[3]).toString(16)}`;
  }
  const [head, tail] = s.includes('::') ? (s.split('::') as [string, string]) : [s, undefined];
  const a = head ? head.split(':') : [];
  const b = tail ? tail.split(':') : [];
  const groups = tail === undefined ? a : [...a, ...Array<string>(8 - a.length - b.length).fill('0'), ...b];
  const words = groups.map((g) => parseInt(g, 16).toString(16));
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (words[i] !== '0') {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && words[j] === '0') j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  if (best < 0) return words.join(':');
  return `${words.slice(0, best).join(':')}::${words.slice(best + bestLen).join(':')}`;
}

function headerValue(req: RequestLike, name: string): string | undefined {
  const v = req.headers[name.toLowerCase()];
  return Array.isArray(v) ? v.join(', ') : v;
}

function clientIp(req: RequestLike, trusted: readonly string[]): string | undefined {
  const raw = req.socket?.remoteAddress;
  const peer = raw === undefined ? undefined : canonicalIp(raw);
  if (peer === undefined) return undefined;
  if (!trusted.includes(peer)) return peer;
  const forwarded = headerValue(req, 'x-forwarded-for');
  const chain: string[] = [];
  if (forwarded !== undefined) {
    for (const part of forwarded.split(',')) {
      const ip = canonicalIp(part.trim());
      // One entry that is not an address makes the whole header worthless.
      if (ip === undefined) return peer;
      chain.push(ip);
    }
  }
  for (let i = chain.length - 1; i >= 0; i--) if (!trusted.includes(chain[i]!)) return chain[i];
  return peer;
}

function keyOf<Req extends RequestLike>(source: KeySource<Req>, req: Req, trusted: readonly string[]): string | undefined {
  if (typeof source === 'function') return source(req);
  if ('header' in source) {
    const v = headerValue(req, source.header);
    return v === undefined || v === '' ? undefined : v;
  }
  return clientIp(req, trusted);
}

/** The path of a request's URL, without its query. */
export function pathOf(req: RequestLike): string {
  const url = req.url ?? '/';
  const q = url.indexOf('?');
  return q < 0 ? url : url.slice(0, q);
}

/**
 * The decisions for the enforced limits, a lease when concurrency limits are among them; the
 * others through the middleware's deny cache, when it has one.
 */
async function decide(client: Client, limits: readonly Limit[], cost: number, denies: DenyCache | undefined): Promise<[MultiOutcome, Lease | undefined]> {
  if (limits.some(([, a]) => a.kind === 'concurrency')) {
    const o = await client.acquireAll(limits, cost);
    return [o.outcome, o.lease];
  }
  return [await client.checkAllWith(limits, cost, denies), undefined];
}

/** The framework-independent part of the middleware: one instance per middleware. */
export class RateLimitEngine<Req extends RequestLike> {
  readonly metrics: Metrics;
  private readonly key: KeySource<Req>;
  private readonly trusted: readonly string[];
  private readonly table = new Map<string, readonly Policy[]>();
  private readonly limitsFn: ((plan: string, cls: string) => readonly Policy[]) | undefined;
  private readonly prefix: string;
  private readonly legacy: boolean;
  /** The middleware's own deny cache (undefined when turned off). */
  private readonly denies: DenyCache | undefined;

  constructor(
    readonly client: Client,
    private readonly options: RateLimitOptions<Req>,
  ) {
    this.key = options.key ?? { clientIp: {} };
    const trusted = typeof this.key === 'object' && 'clientIp' in this.key ? (this.key.clientIp.trustedProxies ?? []) : [];
    this.trusted = trusted.map((t) => canonicalIp(t) ?? t);
    if (typeof options.limits === 'function') this.limitsFn = options.limits;
    else for (const e of options.limits) this.table.set(JSON.stringify([e.plan, e.class]), e.policies);
    this.prefix = options.prefix ?? 'rl';
    this.legacy = options.legacyHeaders ?? false;
    this.denies = (options.denyCache ?? true) ? new DenyCache(options.denyCacheEntries ?? DENY_CACHE_ENTRIES, client.timeoutMs) : undefined;
    this.metrics = options.metrics ?? new Metrics();
    const prometheus = options.prometheus ?? true;
    if (prometheus !== false) {
      // Without prom-client installed there is nothing to report to: the counters stay here.
      exposeToPrometheus(this.metrics, prometheus === true ? undefined : prometheus).catch(() => undefined);
      exposeBreakerToPrometheus(() => client.breakerOpen, prometheus === true ? undefined : prometheus).catch(() => undefined);
    }
  }

  /**
   * What to serve on `/metrics`: the counters ({@link Metrics.renderPrometheus}), then
   * `ratelimit_breaker_open`, 1 while the client's circuit breaker is open (Redis failed
   * repeatedly and the failure policy answers without asking it), else 0.
   */
  renderPrometheus(): string {
    return this.metrics.renderPrometheus() + renderBreakerGauge(this.client.breakerOpen);
  }

  /** The policies of (plan, class), as `RateLimitOptions.limits` says. */
  policiesFor(plan: string, cls: string): readonly Policy[] {
    if (this.limitsFn) return this.limitsFn(plan, cls);
    for (const [p, c] of [
      [plan, cls],
      ['*', cls],
      [plan, '*'],
      ['*', '*'],
    ]) {
      const v = this.table.get(JSON.stringify([p, c]));
      if (v) return v;
    }
    return [];
  }

  private estimateFor(cls: string): number {
    const e = this.options.estimates;
    return e?.[cls] ?? e?.['*'] ?? 1;
  }

  /** Decides a request before its handler runs. */
  async admit(req: Req): Promise<Admission> {
    if (this.options.skip?.(req) === true) return { kind: 'pass' };
    const who = keyOf(this.key, req, this.trusted) ?? 'anonymous';
    const cls = this.options.routeClass ? label(this.options.routeClass(req)) : 'default';
    const plan = this.options.plan ? label(this.options.plan(req)) : 'default';
    const policies = this.policiesFor(plan, cls);
    if (policies.length === 0) return { kind: 'pass' };
    const limits: Limit[] = policies.map((p) => [`${this.prefix}:{${who}}:${cls}:${p.name}`, p.algorithm]);
    const estimate = this.estimateFor(cls);
    const enforced: number[] = [];
    const shadows: number[] = [];
    policies.forEach((p, i) => (p.shadow ? shadows : enforced).push(i));
    const ePolicies = enforced.map((i) => policies[i]!);
    const eLimits = enforced.map((i) => limits[i]!);
    let outcome: MultiOutcome;
    let lease: Lease | undefined;
    try {
      [outcome, lease] =
        eLimits.length === 0
          ? [{ allowed: true, deniedBy: 0, decisions: [], degraded: undefined, mode: undefined, granted: estimate }, undefined]
          : await decide(this.client, eLimits, estimate, this.denies);
    } catch (e) {
      return { kind: 'refuse', refusal: problem500(e instanceof Error ? e.message : String(e)) };
    }
    ePolicies.forEach((p, i) => {
      const deniedHere = !outcome.allowed && outcome.deniedBy === i + 1;
      if (outcome.allowed || deniedHere) this.metrics.record(p.name, outcome.allowed, outcome.degraded !== undefined, outcome.answeredLocally);
    });
    const leases: Lease[] = lease ? [lease] : [];
    // Each shadow policy's answer: its index, its outcome, whether it consumed.
    const shadowed: Array<{ i: number; outcome: MultiOutcome; consumed: boolean }> = [];
    const denials: string[] = [];
    if (outcome.allowed) {
      for (const i of shadows) {
        let answer: [MultiOutcome, Lease | undefined];
        try {
          answer = await decide(this.client, [limits[i]!], estimate, this.denies);
        } catch {
          // A shadow limit that Redis refuses is left out; it never fails a request.
          continue;
        }
        const [o, l] = answer;
        const name = policies[i]!.name;
        this.metrics.recordShadow(name, o.allowed, o.degraded !== undefined);
        if (o.answeredLocally !== undefined) this.metrics.recordLocal(name, o.answeredLocally);
        if (!o.allowed) denials.push(name);
        if (l) leases.push(l);
        shadowed.push({ i, outcome: o, consumed: o.allowed });
      }
    } else if (shadows.length > 0) {
      try {
        const o = await this.client.checkAll(
          shadows.map((i) => limits[i]!),
          0,
        );
        shadows.forEach((i, k) => {
          const d = o.decisions[k]!;
          shadowed.push({
            i,
            outcome: { allowed: d.allowed, deniedBy: d.allowed ? 0 : 1, decisions: [d], degraded: o.degraded, mode: o.mode, granted: 0 },
            consumed: false,
          });
        });
      } catch {
        // Peeks for the fields only: without them the fields show the enforced policies.
      }
    }
    if (this.options.leaseKeepAliveMs !== undefined) for (const l of leases) l.keepAlive(this.options.leaseKeepAliveMs);

    const view = (): { info: RateLimitInfo; all: MultiOutcome; shown: Policy[] } => {
      // The fields list every policy answered for, in the route's order.
      const answers: Array<[number, Decision]> = enforced.map((i, k) => [i, outcome.decisions[k]!]);
      let degraded = outcome.degraded;
      for (const s of shadowed) {
        answers.push([s.i, s.outcome.decisions[0]!]);
        degraded ??= s.outcome.degraded;
      }
      answers.sort(([a], [b]) => a - b);
      const denier = outcome.deniedBy > 0 ? enforced[outcome.deniedBy - 1] : undefined;
      const shown = answers.map(([i]) => policies[i]!);
      const all: MultiOutcome = {
        allowed: outcome.allowed,
        deniedBy: denier === undefined ? 0 : answers.findIndex(([i]) => i === denier) + 1,
        decisions: answers.map(([, d]) => d),
        degraded,
        mode: outcome.mode,
        granted: outcome.granted,
      };
      const info: RateLimitInfo = {
        shadowDenials: denials,
        policies: shown,
        decisions: all.decisions,
        degraded,
        mode: outcome.mode,
      };
      return { info, all, shown };
    };

    const first = view();
    const format = { headerFormat: this.options.headerFormat ?? 'draft-11', cost: estimate } as const;
    const fields = rateLimitFields(first.shown, first.all, this.legacy, format);
    if (!outcome.allowed) {
      return { kind: 'refuse', refusal: tooMany(ePolicies, outcome, fields), info: first.info };
    }

    let released = false;
    const settleOne = async (ps: readonly Policy[], ls: readonly Limit[], o: MultiOutcome, actual: number): Promise<MultiOutcome> => {
      const settled = ls.map((_, k) => k).filter((k) => ls[k]![1].kind !== 'concurrency');
      // Admitted by fail-open: nothing was taken, nothing to settle.
      if (settled.length === 0 || !(o.degraded === undefined || o.degraded === 'local')) return o;
      const reservation = new Reservation(
        this.client,
        settled.map((k) => ls[k]!),
        estimate,
        o.degraded,
      );
      let s;
      try {
        s = await reservation.settle(actual);
      } catch {
        return o;
      }
      if (s.degraded !== o.degraded) return o;
      const ds = [...o.decisions];
      settled.forEach((k, j) => {
        ds[k] = s.decisions[j]!;
        this.metrics.recordSettled(ps[k]!.name, actual - estimate);
      });
      return { ...o, decisions: ds };
    };

    const admitted: Admitted = {
      info: first.info,
      fields,
      estimate,
      needsSettlement: (actual) => actual !== undefined && actual !== estimate,
      settle: async (actual) => {
        if (actual === estimate) return rateLimitFields(first.shown, first.all, this.legacy, format);
        outcome = await settleOne(ePolicies, eLimits, outcome, actual);
        for (const s of shadowed) {
          if (s.consumed) s.outcome = await settleOne([policies[s.i]!], [limits[s.i]!], s.outcome, actual);
        }
        const after = view();
        return rateLimitFields(after.shown, after.all, this.legacy, format);
      },
      release: () => {
        if (released) return;
        released = true;
        for (const l of leases) void l.release().catch(() => false);
      },
    };
    return { kind: 'admit', admitted };
  }
}

const actualCosts = new WeakMap<object, number>();
const infos = new WeakMap<object, RateLimitInfo>();

/**
 * What a request really cost, in the units of its route's limits: the handler calls it with its
 * response (Express's `res`, Fastify's `reply`) before the response's first byte, and the
 * middleware settles the route's estimate with it before the response leaves (set later, it is
 * settled once the response has been sent, and the fields show the estimate). Without it the
 * estimate stands.
 */
export function setActualCost(res: object, units: number): void {
  if (!Number.isSafeInteger(units) || units < 0) throw new RangeError(`units must be an integer from 0 to 2^53-1, not ${units}`);
  actualCosts.set(responseKey(res), units);
}

/** The actual cost set for a response, if any. */
export function actualCostOf(res: object): number | undefined {
  return actualCosts.get(responseKey(res));
}

/** What the middleware decided for a response it let through or refused (for an access log). */
export function rateLimitInfo(res: object): RateLimitInfo | undefined {
  return infos.get(responseKey(res));
}

/** @internal */
export function setRateLimitInfo(res: object, info: RateLimitInfo): void {
  infos.set(responseKey(res), info);
}

/** Fastify's reply and its raw response are one response here. */
function responseKey(res: object): object {
  const raw = (res as { raw?: unknown }).raw;
  return typeof raw === 'object' && raw !== null && 'setHeader' in raw ? raw : res;
}
