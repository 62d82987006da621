/**
 * The durable lane: connections of their own for admitting writes that must be acknowledged by
 * replicas (`WAIT n timeout` after the call). `WAIT` waits for the writes of the connection it
 * is sent on, and holds that connection until the replicas answer, so every durable call takes
 * an idle connection of the lane (or opens one) and puts it back when done: the client's shared
 * connection never waits. On a cluster the `WAIT` is routed by the call's key, to the master the
 * call went to.
 */

import { type Connection, type ConnectionSource, RedisReplyError, toConnection } from './connection.js';
import type { Durability, DurabilityStats } from './types.js';

/** Idle connections kept for the next durable calls; more are opened under load and closed when they come back to a full lane. */
const IDLE_KEPT = 64;

/** A connection of the lane, and what it was made from (to close it). */
export interface LaneConnection {
  readonly connection: Connection;
  readonly source: unknown;
}

export class Lane {
  private readonly idle: LaneConnection[] = [];
  private readonly stats: DurabilityStats = { acknowledged: 0, short: 0 };
  /** Set when the server answered that it has no `WAITAOF`: `WAIT` from then on. */
  private noWaitaof = false;

  constructor(readonly durability: Durability) {}

  /** An idle connection of the lane, or a new one. */
  async take(): Promise<LaneConnection> {
    const c = this.idle.pop();
    if (c !== undefined) return c;
    const source = await this.durability.connect();
    return { connection: toConnection(source as ConnectionSource), source };
  }

  /** Puts back a connection whose calls all answered. */
  put(c: LaneConnection): void {
    if (this.idle.length < IDLE_KEPT) this.idle.push(c);
    else this.drop(c);
  }

  /** Closes a connection that failed (or is one too many). */
  drop(c: LaneConnection): void {
    void Promise.resolve()
      .then(() => this.durability.close?.(c.source))
      .catch(() => undefined);
  }

  /** Closes the idle connections. */
  async closeAll(): Promise<void> {
    const all = this.idle.splice(0);
    await Promise.allSettled(all.map((c) => Promise.resolve().then(() => this.durability.close?.(c.source))));
  }

  /**
   * `WAIT replicas timeout` (or `WAITAOF 0 replicas timeout`) on `c`, after its write to `key`:
   * whether enough replicas acknowledged it (counted either way).
   */
  async acknowledged(c: LaneConnection, key: string, signal: AbortSignal): Promise<boolean> {
    const aof = (this.durability.aof ?? false) && !this.noWaitaof;
    let acks: number;
    try {
      acks = await this.wait(c.connection, key, aof, signal);
    } catch (e) {
      // A server before WAITAOF: the write is still this connection's last, so WAIT waits for it as well.
      if (!(aof && e instanceof RedisReplyError && e.reply.startsWith('ERR') && e.reply.includes('unknown command'))) throw e;
      this.noWaitaof = true;
      acks = await this.wait(c.connection, key, false, signal);
    }
    const enough = acks >= this.durability.replicas;
    if (enough) this.stats.acknowledged += 1;
    else this.stats.short += 1;
    return enough;
  }

  /** How many replicas acknowledged this connection's last write, by `WAIT` or `WAITAOF`. */
  private async wait(c: Connection, key: string, aof: boolean, signal: AbortSignal): Promise<number> {
    const d = this.durability;
    const ms = String(Math.max(Math.trunc(d.timeoutMs), 1));
    const args = aof ? ['WAITAOF', '0', String(d.replicas), ms] : ['WAIT', String(d.replicas), ms];
    const reply = await c.send(args, key, signal);
    if (aof) {
      // [fsynced locally, replicas that fsynced]
      if (!Array.isArray(reply) || typeof reply[1] !== 'number') throw new Error(`unexpected reply to WAITAOF: ${JSON.stringify(reply)}`);
      return reply[1];
    }
    if (typeof reply !== 'number') throw new Error(`unexpected reply to WAIT: ${JSON.stringify(reply)}`);
    return reply;
  }

  durabilityStats(): DurabilityStats {
    return { ...this.stats };
  }
}
