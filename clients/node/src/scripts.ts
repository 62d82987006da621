/**
 * The Lua twins of lua-reference/, bundled at build time (src/lua.generated.ts), with their
 * SHA-1 for `EVALSHA`, and the Functions library.
 */

import { createHash } from 'node:crypto';

import type { Algorithm } from './algorithm.js';
import { LUA } from './lua.generated.js';

/** A script and the SHA-1 that `EVALSHA` names it by. */
export interface Script {
  readonly source: string;
  readonly sha: string;
}

function script(file: string): Script {
  const source = LUA[file];
  if (source === undefined) throw new Error(`ratelimit-client: bundled script missing: ${file}`);
  return { source, sha: createHash('sha1').update(source).digest('hex') };
}

const BY_KIND: Record<Algorithm['kind'], Script> = {
  token_bucket: script('token_bucket.lua'),
  leaky_bucket: script('leaky_bucket.lua'),
  fixed_window: script('fixed_window.lua'),
  sliding_window: script('sliding_window.lua'),
  sliding_log: script('sliding_log.lua'),
  gcra: script('gcra.lua'),
  concurrency: script('acquire.lua'),
};

export const ALL_SCRIPT = script('all.lua');
export const RELEASE_SCRIPT = script('release.lua');
export const SETTLE_SCRIPT = script('settle.lua');

/** The twin of an algorithm's command (`acquire.lua` for a concurrency limit). */
export function scriptFor(a: Algorithm): Script {
  return BY_KIND[a.kind];
}

/** The Functions library's name (`#!lua name=ratelimit`). */
export const LIBRARY_NAME = 'ratelimit';

/**
 * The Functions library `ratelimit` (lua-reference/ratelimit.lua): one function per command
 * (`rl_tokenbucket`, `rl_all`...), loaded once with `FUNCTION LOAD REPLACE`.
 */
export const LIBRARY: string = script('ratelimit.lua').source;

/** Every bundled script by its file name in lua-reference/, as the build carried it. */
export const BUNDLED_SCRIPTS: Readonly<Record<string, string>> = LUA;

/** A command's function in the library: `RL.TOKENBUCKET` is `rl_tokenbucket`. */
export function functionName(command: string): string {
  return command.toLowerCase().replace('.', '_');
}
