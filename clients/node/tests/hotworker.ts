/**
 * One process of tests/hot.test.ts's race: a client batching one hot key, `tasks` callers
 * checking it until Redis (or a batch) denies. Every admission is written to stdout as `a` at
 * once (a pipe is written synchronously on Linux), so that a process killed meanwhile has told
 * every admission it made; at the end the client is closed and its batch counts written as one
 * JSON line.
 */

import { Client, fixedWindow } from '../src/index.js';
import { type Library, open, ready } from './harness.js';

const [port, library, key, limit, tasks, maxBatch] = process.argv.slice(2);
const o = open(library as Library, Number(port));
await ready(o);
const client = new Client(o.connection, { timeoutMs: 2000, mode: 'module' }).withBatching({
  hotKeys: [key!],
  maxBatch: Number(maxBatch),
  leaseMs: 60_000,
});
const algorithm = fixedWindow(Number(limit), 3600);
let denied = false;
await Promise.all(
  Array.from({ length: Number(tasks) }, async () => {
    while (!denied) {
      const r = await client.check(key!, algorithm);
      if (r.degraded !== undefined) throw new Error(`degraded: ${r.degraded}`);
      if (r.decision.allowed) process.stdout.write('a');
      else denied = true;
    }
  }),
);
const returned = await client.close();
process.stdout.write(`\n${JSON.stringify({ ...client.batchStats(), closed: returned })}\n`);
await o.close();
