/**
 * Real servers for the tests, started here and killed at the end: `RL_REDIS_SERVER` names the
 * server binary (default `redis-server`; `make test-node` runs every server of the matrix) and
 * `RL_MODULE` the module (default the workspace's release build).
 */

import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { Socket, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Redis as IORedis } from 'ioredis';
import { createClient, createCluster } from 'redis';

import { type ClientOptions, type Connection, fromIORedis, fromNodeRedis } from '../src/index.js';

/** clients/node, whether run from tests/ or from build/tests/. */
export const PACKAGE_ROOT = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) dir = dirname(dir);
  return dir;
})();
export const REPO_ROOT = resolve(PACKAGE_ROOT, '..', '..');

export function serverBinary(): string {
  return process.env['RL_REDIS_SERVER'] || 'redis-server';
}

export function modulePath(): string {
  const p = process.env['RL_MODULE'] || join(REPO_ROOT, 'target', 'release', 'libredis_rate_limiter.so');
  if (!existsSync(p)) throw new Error(`${p} not found: build the module (make build) or set RL_MODULE`);
  return p;
}

/** The server's name and version, for test titles: `valkey-server 9.1.2`. */
export function serverVersion(): string {
  const out = spawnSync(serverBinary(), ['--version'], { encoding: 'utf8' }).stdout;
  const m = /^(\S+) server v=(\S+)/.exec(out);
  return m ? `${m[1]!.toLowerCase()} ${m[2]}` : out.trim();
}

/** A loopback port nobody listens on (now). */
export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once('error', fail);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => ok(port));
    });
  });
}

/** A port whose cluster bus port (+10000) is free too. */
export async function clusterPort(): Promise<number> {
  for (;;) {
    const p = await freePort();
    if (p >= 55_000) continue;
    const bus = await new Promise<boolean>((ok) => {
      const s = createServer();
      s.once('error', () => ok(false));
      s.listen(p + 10_000, '127.0.0.1', () => s.close(() => ok(true)));
    });
    if (bus) return p;
  }
}

/** Every server process still running: killed when the test process exits, whatever happened. */
const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of running) c.kill('SIGKILL');
});

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export interface ServerOptions {
  module?: boolean;
  testClock?: boolean;
  cluster?: boolean;
  port?: number;
  extra?: string[];
}

/** A redis-server of the tests, in a temporary directory of its own. */
export class Server {
  private child: ChildProcess | undefined;
  private exited: Promise<void> = Promise.resolve();
  readonly dir: string;

  private constructor(
    readonly port: number,
    private readonly options: ServerOptions,
  ) {
    this.dir = mkdtempSync(join(tmpdir(), 'rl-node-'));
  }

  /**
   * Starts a server. A port the harness chose (a pair for a cluster node) can be taken by another
   * process between the check and the server's bind: then it tries again on another one.
   */
  static async start(options: ServerOptions = {}): Promise<Server> {
    for (let attempt = 1; ; attempt++) {
      const port = options.port ?? (options.cluster ? await clusterPort() : await freePort());
      const s = new Server(port, options);
      try {
        await s.launch();
        return s;
      } catch (e) {
        const taken = s.log.includes('Address already in use');
        await s.stop();
        if (options.port !== undefined || !taken || attempt >= 5) throw e;
      }
    }
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  get log(): string {
    try {
      return readFileSync(join(this.dir, 'redis.log'), 'utf8');
    } catch {
      return '';
    }
  }

  /** Starts (again) on the same port. */
  async launch(): Promise<void> {
    const o = this.options;
    const args = ['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir, '--logfile', join(this.dir, 'redis.log'), '--save', '', '--appendonly', 'no'];
    if (o.module ?? true) {
      args.push('--loadmodule', modulePath());
      if (o.testClock) args.push('TESTCLOCK');
    }
    if (o.cluster) args.push('--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000');
    args.push(...(o.extra ?? []));
    const child = spawn(serverBinary(), args, { stdio: 'ignore' });
    this.child = child;
    running.add(child);
    child.once('exit', () => running.delete(child));
    let exitedEarly = false;
    this.exited = new Promise((r) => child.once('exit', () => { exitedEarly = true; r(); }));
    const deadline = Date.now() + 10_000;
    for (;;) {
      if (exitedEarly) throw new Error(`redis-server exited at start; log:\n${this.log}`);
      if (await this.ping()) return;
      if (Date.now() > deadline) {
        await this.kill();
        throw new Error(`redis-server did not start; log:\n${this.log}`);
      }
      await sleep(20);
    }
  }

  private ping(): Promise<boolean> {
    return new Promise((ok) => {
      const socket = new Socket();
      let buf = '';
      socket.setTimeout(500);
      socket.once('error', () => ok(false));
      socket.once('timeout', () => { socket.destroy(); ok(false); });
      socket.connect(this.port, '127.0.0.1', () => socket.write('PING\r\n'));
      socket.on('data', (d: Buffer) => {
        buf += d.toString();
        if (buf.includes('\r\n')) {
          socket.destroy();
          // PONG, or a refusal of a server that wants a password: it is up either way.
          ok(buf.startsWith('+PONG') || buf.startsWith('-NOAUTH'));
        }
      });
    });
  }

  /** Kills the server at once (no shutdown handshake), as a crash would. */
  async kill(): Promise<void> {
    const c = this.child;
    this.child = undefined;
    if (c && c.exitCode === null && c.signalCode === null) {
      c.kill('SIGKILL');
      await this.exited;
    }
  }

  /** Sends `signal` to the server: `SIGSTOP` freezes it (it answers nothing, its connections stay open), `SIGCONT` thaws it. */
  signal(signal: NodeJS.Signals): void {
    if (!this.child?.kill(signal)) throw new Error(`the server did not take ${signal}`);
  }

  /** Kills the server and removes its directory. */
  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** A node-redis connection of the test's own (admin commands). */
  async admin(): Promise<Admin> {
    const c = createClient({ url: this.url, RESP: 2, socket: { reconnectStrategy: false } });
    c.on('error', () => undefined);
    await c.connect();
    return c as unknown as Admin;
  }
}

/** What the tests use of a node-redis connection. */
export interface Admin {
  sendCommand(args: string[]): Promise<unknown>;
  destroy(): void;
}

/** Runs one command on `admin`, numbers as text. */
export function cmd(admin: Admin, ...args: Array<string | number>): Promise<unknown> {
  return admin.sendCommand(args.map(String));
}

export const T0 = 1_800_000_000_000_000;

/**
 * Client options for a test that is not about timeouts: the machine running the tests may be
 * loaded, and an answer later than the client's default 100 ms would be a spurious degraded one.
 */
export const PATIENT = { timeoutMs: 2000 } as const;

/** The client libraries the tests run the package with. */
export type Library = 'node-redis' | 'ioredis';
export const LIBRARIES: Library[] = ['node-redis', 'ioredis'];

/** node-redis's client as `createClient` makes it with the tests' options. */
type NodeRedisClient = ReturnType<typeof createClient<{}, {}, {}, 3, {}>>;

/** An open connection of a client library, and how to close it. */
export interface Opened {
  readonly connection: Connection;
  readonly raw: NodeRedisClient | IORedis;
  close(): Promise<void>;
}

/**
 * A connection of `library` to `port`, set up as docs/node.md recommends: commands fail at once
 * while the server is unreachable (no offline queue, nothing re-sent after a reconnect), and the
 * client library reconnects by itself; its protocol is the library's default (RESP3). It is not
 * waited for: a server that is down is the failure policy's business.
 */
export function open(library: Library, port: number): Opened {
  if (library === 'node-redis') {
    const c = createClient({
      url: `redis://127.0.0.1:${port}`,
      disableOfflineQueue: true,
      socket: { reconnectStrategy: (n: number) => Math.min(20 * n, 200), connectTimeout: 1000 },
    });
    c.on('error', () => undefined);
    c.connect().catch(() => undefined);
    return {
      connection: fromNodeRedis(c),
      raw: c,
      close: async () => {
        c.destroy();
      },
    };
  }
  const c = new IORedis(port, '127.0.0.1', {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    retryStrategy: (n: number) => Math.min(20 * n, 200),
  });
  c.on('error', () => undefined);
  return {
    connection: fromIORedis(c),
    raw: c,
    close: async () => {
      c.disconnect();
    },
  };
}

/** Waits until a connection answers (a client made for a running server, before a test starts). */
export async function ready(o: Opened): Promise<void> {
  const deadline = Date.now() + 5000;
  for (;;) {
    try {
      await o.connection.send(['PING'], undefined, new AbortController().signal);
      return;
    } catch (e) {
      if (Date.now() > deadline) throw e;
      await sleep(10);
    }
  }
}

/** Options for a client in a forced mode. */
export function forced(mode: 'module' | 'function' | 'script', extra: ClientOptions = {}): ClientOptions {
  return { mode, ...extra };
}

/** A 3-master cluster (module on every node or not), slots assigned by `redis-cli --cluster create`. */
export class Cluster {
  /** Replicas added with {@link Cluster.addReplica}. */
  readonly replicas: Server[] = [];

  private constructor(readonly nodes: Server[]) {}

  /** The master serving `slot` now, as `CLUSTER SLOTS` on a node that answers says. */
  async masterOf(slot: number): Promise<Server> {
    for (const n of [...this.nodes, ...this.replicas]) {
      let a: Admin | undefined;
      try {
        a = await n.admin();
        const ranges = (await cmd(a, 'CLUSTER', 'SLOTS')) as Array<[number, number, [string, number, ...unknown[]]]>;
        for (const [lo, hi, [, port]] of ranges) {
          if (slot >= lo && slot <= hi) {
            const m = [...this.nodes, ...this.replicas].find((x) => x.port === Number(port));
            if (m) return m;
          }
        }
      } catch {
        // a node that is down or frozen: ask the next
      } finally {
        a?.destroy();
      }
    }
    throw new Error(`no master of slot ${slot}`);
  }

  /** A new node, met by the cluster and made a replica of `master`, its link up. */
  async addReplica(master: Server): Promise<Server> {
    const r = await Server.start({ module: true, cluster: true });
    this.replicas.push(r);
    const a = await r.admin();
    const m = await master.admin();
    try {
      await cmd(a, 'CLUSTER', 'MEET', '127.0.0.1', master.port);
      const id = String(await cmd(m, 'CLUSTER', 'MYID'));
      const deadline = Date.now() + 30_000;
      for (;;) {
        try {
          await cmd(a, 'CLUSTER', 'REPLICATE', id);
          break;
        } catch (e) {
          // The master is not known to the new node yet.
          if (Date.now() > deadline) throw e;
          await sleep(50);
        }
      }
      while (!String(await cmd(a, 'INFO', 'replication')).includes('master_link_status:up')) {
        if (Date.now() > deadline) throw new Error('the replica never synced');
        await sleep(50);
      }
      for (const n of this.nodes) {
        const b = await n.admin();
        try {
          while (!String(await cmd(b, 'CLUSTER', 'INFO')).includes(`cluster_known_nodes:${this.nodes.length + this.replicas.length}`)) {
            if (Date.now() > deadline) throw new Error('the replica never became known');
            await sleep(50);
          }
        } finally {
          b.destroy();
        }
      }
    } finally {
      a.destroy();
      m.destroy();
    }
    return r;
  }

  static async start(module: boolean): Promise<Cluster> {
    const nodes: Server[] = [];
    for (let i = 0; i < 3; i++) nodes.push(await Server.start({ module, cluster: true }));
    const out = spawnSync(
      'redis-cli',
      ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '0', '--cluster-yes'],
      { encoding: 'utf8' },
    );
    if (out.status !== 0) throw new Error(`cluster create: ${out.stdout}${out.stderr}`);
    const deadline = Date.now() + 30_000;
    for (const n of nodes) {
      const a = await n.admin();
      for (;;) {
        const info = String(await cmd(a, 'CLUSTER', 'INFO'));
        if (info.includes('cluster_state:ok') && info.includes('cluster_known_nodes:3')) break;
        if (Date.now() > deadline) throw new Error('cluster never became ok');
        await sleep(50);
      }
      a.destroy();
    }
    return new Cluster(nodes);
  }

  /** A node-redis cluster client. */
  async nodeRedis(): Promise<{ connection: Connection; close(): Promise<void> }> {
    const c = createCluster({ rootNodes: this.nodes.map((n) => ({ url: n.url })) });
    c.on('error', () => undefined);
    await c.connect();
    return { connection: fromNodeRedis(c), close: async () => c.destroy() };
  }

  /** An ioredis cluster client, routing the module's commands itself with `Command` or through MOVED. */
  async ioredis(withCommand: boolean): Promise<{ connection: Connection; close(): Promise<void> }> {
    const { Cluster: IOCluster, Command } = await import('ioredis');
    const c = new IOCluster(this.nodes.map((n) => ({ host: '127.0.0.1', port: n.port })));
    c.on('error', () => undefined);
    await new Promise<void>((ok, fail) => {
      c.once('ready', () => ok());
      c.once('error', fail);
    });
    return {
      connection: fromIORedis(c, withCommand ? { Command } : {}),
      close: async () => c.disconnect(),
    };
  }

  async dbsizes(): Promise<number[]> {
    const out: number[] = [];
    for (const n of this.nodes) {
      const a = await n.admin();
      out.push(Number(await cmd(a, 'DBSIZE')));
      a.destroy();
    }
    return out;
  }

  async stop(): Promise<void> {
    for (const n of [...this.nodes, ...this.replicas]) await n.stop();
  }
}
