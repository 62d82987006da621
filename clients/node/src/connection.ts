/**
 * The connection side: what the client needs of a Redis client library (one command at a time,
 * routed by its key on a cluster), and adapters for node-redis (`redis`), ioredis and the
 * `sendCommand` functions that rate-limit-redis takes.
 */

/** A reply as the client libraries give it: integers, strings, arrays, null. */
export type Reply = unknown;

/**
 * What the client sends commands through. `key` is the key the command works on (the first of
 * several), for a cluster to route it; undefined for a command about the server (`COMMAND
 * INFO`). A Redis error reply must reject with a {@link RedisReplyError} (or an error an adapter
 * below recognises); any other rejection means Redis did not answer.
 */
export interface Connection {
  /**
   * `signal`, when given, aborts when the call is given up (its deadline, the caller's abort):
   * a command still waiting in the library's queue then need not be sent. The client passes one
   * only when {@link Connection.queues} says a command may wait there (every time for a
   * connection without that method), or the caller gave one; it does not wait for the promise of
   * a call it gave up, and ignores what it answers later.
   */
  send(args: readonly string[], key: string | undefined, signal?: AbortSignal): Promise<Reply>;
  /**
   * Whether a command sent now may wait in the client library's own queue before it is written
   * (the connection is not ready): the client then passes `send` a signal that aborts at the
   * call's deadline. While it answers false, no signal is made for the call (it costs an abort
   * listener per command in node-redis). Without this method, every call gets a signal.
   */
  queues?(): boolean;
  /**
   * Called after a `READONLY` answer (the address now names a replica, as after a failover):
   * drops the connection so that the next command connects anew.
   */
  reconnect?(): void | Promise<void>;
  /**
   * While the client library is making the connection (it was started and is not ready yet): a
   * promise that resolves once the connection is ready and rejects when this attempt fails, or
   * when `signal` aborts; rejected at once between two attempts (the last one failed). Undefined
   * when commands can be sent now, or when the library is not connecting (a command then fails
   * at once, as it would).
   */
  ready?(signal: AbortSignal): Promise<void> | undefined;
  /**
   * On a cluster: reads the slots from the nodes again. A master that froze (stopped, or cut off
   * without its connections closing) answers nothing, so no redirection comes and the library
   * would keep its slot map: the client calls this after a call got no answer in time.
   */
  rediscover?(): Promise<void>;
}

/** An error reply of Redis (`ERR ...`, `NOPERM ...`), with its text as Redis sent it. */
export class RedisReplyError extends Error {
  override name = 'RedisReplyError';
  constructor(readonly reply: string) {
    super(reply);
  }
}

/**
 * Whether `e` is an error reply of Redis as a client library reports it: node-redis's
 * `ErrorReply` (and its subclasses), ioredis's `ReplyError`, or ours.
 */
export function isReplyError(e: unknown): e is Error {
  if (!(e instanceof Error)) return false;
  if (e instanceof RedisReplyError || e.name === 'ReplyError') return true;
  for (let p: unknown = Object.getPrototypeOf(e); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const ctor = (p as { constructor?: { name?: string } }).constructor;
    if (ctor?.name === 'ErrorReply') return true;
  }
  return false;
}

/** Rejects with a {@link RedisReplyError} for an error reply, and passes anything else on. */
function normalise(e: unknown): never {
  if (isReplyError(e) && !(e instanceof RedisReplyError)) throw new RedisReplyError(e.message);
  throw e;
}

/** A client library's connection events, as far as they are used here. */
interface Events {
  on?(event: 'error' | 'ready' | 'reconnecting', listener: (e?: unknown) => void): unknown;
  off?(event: string, listener: (e?: unknown) => void): unknown;
}

/**
 * The end of a connection attempt under way: `ready`, or one of `failures` (the attempt's error,
 * the connection closed), or the abort of `signal`; the listeners are removed at once.
 */
function attempt(client: Events, failures: readonly string[], signal: AbortSignal): Promise<void> {
  const on = client.on as ((event: string, listener: (e?: unknown) => void) => unknown) | undefined;
  const off = client.off;
  if (on === undefined || off === undefined) return Promise.resolve();
  return new Promise((ok, fail) => {
    const done = (): void => {
      off.call(client, 'ready', onReady);
      for (const f of failures) off.call(client, f, onFailure);
      signal.removeEventListener('abort', onAbort);
    };
    const onReady = (): void => {
      done();
      ok();
    };
    const onFailure = (e?: unknown): void => {
      done();
      if (isReplyError(e)) fail(new RedisReplyError(e.message));
      else fail(e instanceof Error ? e : new Error('the connection closed while it was being made'));
    };
    const onAbort = (): void => {
      done();
      fail(signal.reason);
    };
    on.call(client, 'ready', onReady);
    for (const f of failures) on.call(client, f, onFailure);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * The refusal that keeps a connection from being made, if that is why: a client library whose
 * handshake the server refused (`WRONGPASS`, `NOAUTH`, `NOPERM` at `HELLO` or `AUTH`) reports
 * it only as an `'error'` event and then fails every command as unconnected; the client must
 * throw that refusal, not answer with its failure policy as for a server that is down. The latest
 * event decides: any other error (a refused connection) or `'ready'` clears it.
 */
function handshakeRefusal(client: Events): () => string | undefined {
  let refusal: string | undefined;
  client.on?.('error', (e) => {
    refusal = isReplyError(e) && /^(WRONGPASS|NOAUTH|NOPERM)\b/.test(e.message) ? e.message : undefined;
  });
  client.on?.('ready', () => {
    refusal = undefined;
  });
  return () => refusal;
}

/** Why the latest connection attempt failed: the server's refusal of its handshake, if that was it. */
function failedAttempt(refusal: () => string | undefined, library: string): Error {
  const r = refusal();
  return r !== undefined ? new RedisReplyError(r) : new Error(`the connection failed; ${library} tries again later`);
}

/** A command's failure: a refused handshake when there is one and this is not a reply of Redis. */
function failure(refused: () => string | undefined): (e: unknown) => never {
  return (e) => {
    const r = refused();
    if (r !== undefined && !isReplyError(e)) throw new RedisReplyError(r);
    return normalise(e);
  };
}

/** node-redis's client (`createClient`), as far as it is used here. */
export interface NodeRedisClientLike extends Events {
  sendCommand(args: string[], options?: { abortSignal?: AbortSignal }): Promise<unknown>;
  /** Whether `connect()` was called (and the client not closed since). */
  readonly isOpen?: boolean;
  /** Whether the connection is made and commands are sent. */
  readonly isReady?: boolean;
}

/** node-redis's cluster (`createCluster`), as far as it is used here. */
export interface NodeRedisClusterLike {
  sendCommand(
    firstKey: string | undefined,
    isReadonly: boolean | undefined,
    args: string[],
    options?: { abortSignal?: AbortSignal },
  ): Promise<unknown>;
  readonly masters: unknown;
  /** The connection of the master of `key`'s slot (node-redis 6 has it; without it, `WAIT` goes through the cluster's own routing). */
  getNodeClientForKey?(key: string, isReadonly?: boolean): Promise<{ sendCommand(args: string[], options?: { abortSignal?: AbortSignal }): Promise<unknown> }>;
}

/**
 * Commands about the connection they are sent on (`WAIT` counts the replicas that have its
 * writes): on a cluster they go to the master of their key, on the connection its calls took.
 */
const OF_THE_CONNECTION = new Set(['WAIT', 'WAITAOF']);

/** ioredis's `Redis` or `Cluster`, as far as it is used here. */
export interface IORedisLike extends Events {
  call(command: string, ...args: string[]): Promise<unknown>;
  readonly isCluster: boolean;
  disconnect(reconnect?: boolean): void;
  /** `'connecting'`, `'connect'`, `'ready'`, `'reconnecting'`, `'end'`... */
  readonly status?: string;
  /** A `Cluster`'s: reads the slots again (the callback gets the error when no node answered). */
  refreshSlotsCache?(callback?: (e?: Error | null) => void): void;
}

/**
 * ioredis's `Command` class (`import { Command } from 'ioredis'`), to route module commands on an
 * ioredis `Cluster` by their key: made with the command's name, its arguments and a UTF-8 reply,
 * its `promise` answers. (Its slot, which ioredis declares private, is set before it is sent.)
 */
export interface IORedisCommandClass {
  new (name: string, args: string[], options: { replyEncoding: 'utf8' }): { readonly promise: Promise<unknown> };
}

/** A node-redis client or cluster (`redis` v4 and later). */
export function fromNodeRedis(client: NodeRedisClientLike | NodeRedisClusterLike): Connection {
  if ('masters' in client && client.masters !== undefined) {
    const cluster = client as NodeRedisClusterLike;
    // The cluster's own queues (a node being connected) are not visible from here: every call
    // gets its deadline's signal.
    // node-redis's cluster sends `WAIT` to every shard (its request policy), so it goes to the
    // connection of the key's master itself, where the call it follows went.
    return {
      send: (args, key, signal) => {
        const options = signal === undefined ? undefined : { abortSignal: signal };
        if (key !== undefined && OF_THE_CONNECTION.has(args[0]!) && cluster.getNodeClientForKey !== undefined) {
          return cluster
            .getNodeClientForKey(key, false)
            .then((node) => node.sendCommand(args as string[], options))
            .catch(normalise);
        }
        return cluster.sendCommand(key, false, args as string[], options).catch(normalise);
      },
    };
  }
  const single = client as NodeRedisClientLike;
  const refusal = handshakeRefusal(single);
  const refused = failure(refusal);
  // Between two attempts: the latest failed (`error`), the next has not begun (`reconnecting`).
  let waitingToRetry = false;
  single.on?.('error', () => {
    if (single.isReady === false) waitingToRetry = true;
  });
  single.on?.('reconnecting', () => {
    waitingToRetry = false;
  });
  single.on?.('ready', () => {
    waitingToRetry = false;
  });
  return {
    // node-redis writes a command at once while the connection is ready (its arguments are not
    // changed, so the client's array is passed as it is); while not, a command may wait in its
    // offline queue, and gets the deadline's signal.
    send: (args, _key, signal) =>
      single.sendCommand(args as string[], signal === undefined ? undefined : { abortSignal: signal }).catch(refused),
    queues: () => single.isReady !== true,
    // Connecting: `connect()` called (not awaited) and not ready yet.
    ready: (signal) => {
      if (single.isOpen !== true || single.isReady !== false) return undefined;
      if (waitingToRetry) return Promise.reject(failedAttempt(refusal, 'node-redis'));
      return attempt(single, ['error'], signal);
    },
  };
}

/** The states of an ioredis connection in which an attempt to make it is under way. */
const IOREDIS_CONNECTING = new Set(['connecting', 'connect']);

/**
 * An ioredis `Redis` or `Cluster`. On a `Cluster`, pass ioredis's `Command` class so that the
 * module's commands (unknown to ioredis) go straight to the master of their key; without it they
 * reach it through a `MOVED` redirection.
 */
export function fromIORedis(client: IORedisLike, options: { Command?: IORedisCommandClass } = {}): Connection {
  const Command = options.Command;
  const cluster = client.isCluster;
  const sender = client as unknown as { sendCommand(c: unknown): unknown };
  const refusal = cluster ? () => undefined : handshakeRefusal(client);
  const refused = cluster ? normalise : failure(refusal);
  return {
    send(args, key) {
      if (cluster && Command && key !== undefined) {
        const cmd = new Command(args[0]!, args.slice(1), { replyEncoding: 'utf8' });
        (cmd as { slot?: number | null }).slot = keySlot(key);
        sender.sendCommand(cmd);
        return cmd.promise.catch(normalise);
      }
      return client.call(args[0]!, ...args.slice(1)).catch(refused);
    },
    // ioredis takes no signal: there is nothing to abort.
    queues: () => false,
    // A cluster follows its own redirections, and reads its slots again when asked; a single
    // connection is made again.
    ...(cluster
      ? {
          rediscover: () =>
            new Promise<void>((ok, fail) => {
              if (client.refreshSlotsCache === undefined) ok();
              else client.refreshSlotsCache((e) => (e ? fail(e) : ok()));
            }),
        }
      : { reconnect: () => client.disconnect(true) }),
    ready: (signal) => {
      const status = client.status;
      if (status === 'reconnecting') return Promise.reject(failedAttempt(refusal, 'ioredis'));
      return status !== undefined && IOREDIS_CONNECTING.has(status) ? attempt(client, ['error', 'close', 'end'], signal) : undefined;
    },
  };
}

/** rate-limit-redis's `sendCommand`: `(...args) => client.sendCommand(args)` or `client.call(...args)`. */
export type SendCommandFn = (...args: string[]) => Promise<unknown>;

/** rate-limit-redis's `sendCommandCluster`, given the key of each command. */
export type SendCommandClusterFn = (details: {
  key: string | undefined;
  isReadOnly: boolean;
  command: string[];
}) => Promise<unknown>;

export function fromSendCommand(fn: SendCommandFn): Connection {
  return { send: (args) => fn(...args).catch(normalise), queues: () => false };
}

export function fromSendCommandCluster(fn: SendCommandClusterFn): Connection {
  return { send: (args, key) => fn({ key, isReadOnly: false, command: [...args] }).catch(normalise), queues: () => false };
}

/** Anything the client accepts as its connection. */
export type ConnectionSource = Connection | NodeRedisClientLike | NodeRedisClusterLike | IORedisLike;

/** The {@link Connection} for a client of node-redis or ioredis, or a connection as it is. */
export function toConnection(source: ConnectionSource): Connection {
  if ('send' in source && typeof source.send === 'function') return source;
  if ('call' in source && typeof source.call === 'function' && 'isCluster' in source) {
    return fromIORedis(source);
  }
  if ('sendCommand' in source && typeof source.sendCommand === 'function') {
    return fromNodeRedis(source as NodeRedisClientLike | NodeRedisClusterLike);
  }
  throw new TypeError('not a node-redis or ioredis client, nor a Connection');
}

const CRC16_TABLE = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    t[i] = c;
  }
  return t;
})();

/** The cluster slot of `key` (CRC16 of its hash tag, if any, modulo 16384). */
export function keySlot(key: string): number {
  let bytes = Buffer.from(key);
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const b of bytes) crc = ((crc << 8) & 0xffff) ^ CRC16_TABLE[((crc >> 8) ^ b) & 0xff]!;
  return crc & 0x3fff;
}
