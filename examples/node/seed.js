// A token bucket of 10 refilling at 5 per second, from Node.js with node-redis.
//
// Uses RL.TOKENBUCKET when the module is loaded, else the Lua twin
// (lua-reference/token_bucket.lua) through EVALSHA: both decide alike on the same key.
//
//     REDIS_URL=redis://127.0.0.1:6379 node seed.js
import { readFileSync } from 'node:fs';
import { createClient } from 'redis';

const r = createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });
await r.connect();
const key = 'example:node';
await r.del(key);

// COMMAND INFO answers [nil] for a command the server does not have.
const [info] = await r.sendCommand(['COMMAND', 'INFO', 'RL.TOKENBUCKET']);
const hasModule = info !== null;
const script = readFileSync(new URL('../../lua-reference/token_bucket.lua', import.meta.url), 'utf8');
const sha = hasModule ? null : await r.scriptLoad(script);

// [allowed, remaining, retry_after_ms, reset_after_ms, limit]
const take = () =>
  hasModule
    ? r.sendCommand(['RL.TOKENBUCKET', key, '10', '5'])
    : r.evalSha(sha, { keys: [key], arguments: ['10', '5'] });

console.log(`path: ${hasModule ? 'module' : 'lua'}`);
const burst = [];
for (let i = 0; i < 12; i++) burst.push(await take());
console.log(`burst: ${burst.filter((x) => x[0] === 1).length} of 12 allowed`);
const retry = burst.find((x) => x[0] === 0)[2];
console.log(
  retry > 100 && retry <= 200
    ? 'first denial: retry in about 200 ms'
    : `first denial: retry in ${retry} ms`,
);
await new Promise((done) => setTimeout(done, 1000));
let allowed = 0;
for (let i = 0; i < 8; i++) allowed += (await take())[0];
console.log(`after 1 s: ${allowed} of 8 allowed`);
await r.quit();
