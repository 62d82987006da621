/**
 * Counters of the HTTP middleware's decisions per limit, in Prometheus's text format, and the
 * same counters through prom-client when it is installed.
 */

/** The counts of one limit. */
export interface Counts {
  allowed: number;
  denied: number;
  degraded: number;
  /** Requests a shadow limit would have refused (and let through). */
  shadowDenied: number;
  /** Whether the limit has been evaluated as a shadow limit. */
  shadow: boolean;
  /** Units given back by settlements (an actual cost below the estimate). */
  refunded: number;
  /** Units taken by settlements (an actual cost above the estimate). */
  charged: number;
  /** Admissions answered from a leased batch, without a call to Redis (among `allowed`). */
  batch: number;
  /** Denials answered by the deny cache, without a call to Redis (among `denied`, or `shadowDenied`). */
  denyCache: number;
}

/** An answer made in the process: from a leased batch, or by the deny cache. */
export type LocalLabel = 'batch' | 'deny_cache';

const DECISIONS_HELP =
  'Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).';
const SETTLED_HELP =
  'Units given back (refunded) or taken (charged) when reservations were settled with their actual cost.';

function escape(s: string): string {
  return s.replaceAll('\\', '\\\\').replaceAll('"', '\\"').replaceAll('\n', '\\n');
}

/** Byte order of UTF-8, as the other clients sort limit names. */
function byBytes(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

export class Metrics {
  private readonly byLimit = new Map<string, Counts>();

  private entry(limit: string): Counts {
    let c = this.byLimit.get(limit);
    if (!c) {
      c = { allowed: 0, denied: 0, degraded: 0, shadowDenied: 0, shadow: false, refunded: 0, charged: 0, batch: 0, denyCache: 0 };
      this.byLimit.set(limit, c);
    }
    return c;
  }

  /** An enforced limit's answer; `local` when it was made in the process (a batch, the deny cache). */
  record(limit: string, allowed: boolean, degraded: boolean, local?: LocalLabel): void {
    const c = this.entry(limit);
    if (allowed) c.allowed += 1;
    else c.denied += 1;
    if (degraded) c.degraded += 1;
    if (local !== undefined) this.recordLocal(limit, local);
  }

  /** An answer made in the process for `limit` (counted besides `allowed`, `denied` or `shadow_denied`). */
  recordLocal(limit: string, local: LocalLabel): void {
    const c = this.entry(limit);
    if (local === 'batch') c.batch += 1;
    else c.denyCache += 1;
  }

  /** A shadow limit's answer: admissions count as allowed, refusals as shadow_denied, never as denied. */
  recordShadow(limit: string, allowed: boolean, degraded: boolean): void {
    const c = this.entry(limit);
    c.shadow = true;
    if (allowed) c.allowed += 1;
    else c.shadowDenied += 1;
    if (degraded) c.degraded += 1;
  }

  /** A settlement of `delta` units on `limit`: below 0 refunded, above 0 charged. */
  recordSettled(limit: string, delta: number): void {
    const c = this.entry(limit);
    if (delta < 0) c.refunded += -delta;
    else c.charged += delta;
  }

  counts(limit: string): Counts {
    const c = this.byLimit.get(limit);
    return c ? { ...c } : { allowed: 0, denied: 0, degraded: 0, shadowDenied: 0, shadow: false, refunded: 0, charged: 0, batch: 0, denyCache: 0 };
  }

  /** Every limit with its counts, in byte order of the names. */
  entries(): Array<[string, Counts]> {
    return [...this.byLimit.entries()].sort(([a], [b]) => byBytes(a, b)).map(([n, c]) => [n, { ...c }]);
  }

  /**
   * `ratelimit_decisions_total{limit="...",outcome="allowed|denied|degraded"}`, for a limit
   * evaluated as a shadow limit also `outcome="shadow_denied"`, `outcome="batch"` once the limit
   * has had an admission answered from a batch and `outcome="deny_cache"` once it has had a denial
   * answered by the deny cache, then, once a settlement changed
   * something, `ratelimit_settled_units_total{limit="...",direction="refunded|charged"}`.
   */
  renderPrometheus(): string {
    const entries = this.entries();
    let out = `# HELP ratelimit_decisions_total ${DECISIONS_HELP}\n# TYPE ratelimit_decisions_total counter\n`;
    for (const [name, c] of entries) {
      const n = escape(name);
      for (const [outcome, v] of [
        ['allowed', c.allowed],
        ['denied', c.denied],
        ['degraded', c.degraded],
      ] as const) {
        out += `ratelimit_decisions_total{limit="${n}",outcome="${outcome}"} ${v}\n`;
      }
      if (c.shadow) out += `ratelimit_decisions_total{limit="${n}",outcome="shadow_denied"} ${c.shadowDenied}\n`;
      // Admissions and denials among the above that were answered in the process.
      for (const [outcome, v] of [
        ['batch', c.batch],
        ['deny_cache', c.denyCache],
      ] as const) {
        if (v > 0) out += `ratelimit_decisions_total{limit="${n}",outcome="${outcome}"} ${v}\n`;
      }
    }
    const settled = entries.filter(([, c]) => c.refunded > 0 || c.charged > 0);
    if (settled.length > 0) {
      out += `# HELP ratelimit_settled_units_total ${SETTLED_HELP}\n# TYPE ratelimit_settled_units_total counter\n`;
    }
    for (const [name, c] of settled) {
      const n = escape(name);
      out += `ratelimit_settled_units_total{limit="${n}",direction="refunded"} ${c.refunded}\n`;
      out += `ratelimit_settled_units_total{limit="${n}",direction="charged"} ${c.charged}\n`;
    }
    return out;
  }
}

const BREAKER_HELP =
  "Whether the client's circuit breaker is open: Redis failed repeatedly and the failure policy answers without asking it.";

/**
 * The gauge `ratelimit_breaker_open` in Prometheus's text format: 1 while `open` (the breaker of
 * the client a middleware decides with), else 0. A middleware's `renderPrometheus()` is its
 * counters followed by this.
 */
export function renderBreakerGauge(open: boolean): string {
  return `# HELP ratelimit_breaker_open ${BREAKER_HELP}\n# TYPE ratelimit_breaker_open gauge\nratelimit_breaker_open ${open ? 1 : 0}\n`;
}

/** What is used of prom-client: its `Counter` and a registry. */
interface PromCounter {
  reset(): void;
  inc(labels: Record<string, string>, value: number): void;
}
interface PromGauge {
  set(value: number): void;
}
interface PromClient {
  Gauge: new (config: { name: string; help: string; registers: unknown[]; collect: (this: PromGauge) => void }) => PromGauge;
  Counter: new (config: {
    name: string;
    help: string;
    labelNames: string[];
    registers: unknown[];
    collect: (this: PromCounter) => void;
  }) => PromCounter;
  register: PromRegistry;
}
/** A prom-client registry (`new Registry()`, or prom-client's global `register`). */
export interface PromRegistry {
  getSingleMetric(name: string): unknown;
}

/** The metrics each registry reports, summed over every middleware attached to it. */
const attached = new WeakMap<PromRegistry, Set<Metrics>>();
/** The breakers each registry reports: the gauge is 1 while any of them is open. */
const breakers = new WeakMap<PromRegistry, Set<() => boolean>>();

/** prom-client, loaded (rejects when it is not installed). */
async function promClient(): Promise<PromClient> {
  const imported = (await import('prom-client')) as unknown as PromClient & { default?: PromClient };
  return imported.Counter ? imported : imported.default!;
}

/**
 * Reports `ratelimit_breaker_open` through prom-client, in `registry` (default: prom-client's
 * global one): 1 while `open()` is true for any of the breakers given to the same registry, else
 * 0, read at every scrape. Rejects when prom-client is not installed.
 */
export async function exposeBreakerToPrometheus(open: () => boolean, registry?: PromRegistry): Promise<void> {
  const prom = await promClient();
  const reg = registry ?? prom.register;
  let set = breakers.get(reg);
  if (!set) {
    set = new Set();
    breakers.set(reg, set);
  }
  set.add(open);
  const all = set;
  if (!reg.getSingleMetric('ratelimit_breaker_open')) {
    new prom.Gauge({
      name: 'ratelimit_breaker_open',
      help: BREAKER_HELP,
      registers: [reg],
      collect(this: PromGauge) {
        this.set([...all].some((f) => f()) ? 1 : 0);
      },
    });
  }
}

/**
 * Reports `metrics` through prom-client, in `registry` (default: prom-client's global one):
 * counters `ratelimit_decisions_total{limit,outcome}` and `ratelimit_settled_units_total{limit,
 * direction}`, read from `metrics` at every scrape (summed over every `Metrics` attached to
 * the same registry). Rejects when prom-client is not installed.
 */
export async function exposeToPrometheus(metrics: Metrics, registry?: PromRegistry): Promise<void> {
  const prom = await promClient();
  const reg = registry ?? prom.register;
  let set = attached.get(reg);
  if (!set) {
    set = new Set();
    attached.set(reg, set);
  }
  set.add(metrics);
  const all = set;
  const sum = (): Map<string, Counts> => {
    const total = new Map<string, Counts>();
    for (const m of all) {
      for (const [name, c] of m.entries()) {
        const t = total.get(name);
        if (!t) total.set(name, c);
        else {
          t.allowed += c.allowed;
          t.denied += c.denied;
          t.degraded += c.degraded;
          t.shadowDenied += c.shadowDenied;
          t.shadow ||= c.shadow;
          t.refunded += c.refunded;
          t.charged += c.charged;
          t.batch += c.batch;
          t.denyCache += c.denyCache;
        }
      }
    }
    return total;
  };
  if (!reg.getSingleMetric('ratelimit_decisions_total')) {
    new prom.Counter({
      name: 'ratelimit_decisions_total',
      help: DECISIONS_HELP,
      labelNames: ['limit', 'outcome'],
      registers: [reg],
      collect(this: PromCounter) {
        this.reset();
        for (const [limit, c] of sum()) {
          this.inc({ limit, outcome: 'allowed' }, c.allowed);
          this.inc({ limit, outcome: 'denied' }, c.denied);
          this.inc({ limit, outcome: 'degraded' }, c.degraded);
          if (c.shadow) this.inc({ limit, outcome: 'shadow_denied' }, c.shadowDenied);
          if (c.batch > 0) this.inc({ limit, outcome: 'batch' }, c.batch);
          if (c.denyCache > 0) this.inc({ limit, outcome: 'deny_cache' }, c.denyCache);
        }
      },
    });
  }
  if (!reg.getSingleMetric('ratelimit_settled_units_total')) {
    new prom.Counter({
      name: 'ratelimit_settled_units_total',
      help: SETTLED_HELP,
      labelNames: ['limit', 'direction'],
      registers: [reg],
      collect(this: PromCounter) {
        this.reset();
        for (const [limit, c] of sum()) {
          if (c.refunded === 0 && c.charged === 0) continue;
          this.inc({ limit, direction: 'refunded' }, c.refunded);
          this.inc({ limit, direction: 'charged' }, c.charged);
        }
      },
    });
  }
}
