// A lease in an `await using` block of the runtime's own (Node 24 and later), against a real
// server: both slots given back when the block ends. Skipped where the syntax does not exist
// (Node 20: the package's Symbol.asyncDispose still serves TypeScript's compiled `await using`,
// which tests/client.test.ts runs).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Client, concurrency } from '../dist/esm/index.js';
import { PATIENT, Server, cmd, open, ready } from '../build/tests/harness.js';

function hasAwaitUsing() {
  try {
    new (async function () {}).constructor('await using x = null;');
    return true;
  } catch {
    return false;
  }
}

test(`await using, natively in Node ${process.versions.node}`, { skip: hasAwaitUsing() ? false : 'no await using in this runtime' }, async () => {
  const { holdTwo } = await import('./native/await-using.mjs');
  const server = await Server.start();
  const admin = await server.admin();
  const o = open('node-redis', server.port);
  try {
    await ready(o);
    const c = new Client(o.connection, PATIENT);
    const two = concurrency(2, 30);
    await holdTwo(c, 'native', two, async (first, second) => {
      assert.deepEqual([first.holdsSlot, second.holdsSlot], [true, true]);
      assert.equal(Number(await cmd(admin, 'ZCARD', 'native')), 2);
      assert.equal((await c.acquire('native', two)).lease, undefined);
    });
    assert.equal(Number(await cmd(admin, 'EXISTS', 'native')), 0);
  } finally {
    await o.close();
    admin.destroy();
    await server.stop();
  }
});
