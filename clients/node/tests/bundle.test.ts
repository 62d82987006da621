/**
 * The one copy of the Lua twins is lua-reference/: the build bundles it (scripts/bundle-lua.mjs).
 * These tests fail when what the built package carries, in its ES module and its CommonJS
 * build, differs from lua-reference/ by a byte, or misses or adds a script (rebuild:
 * `npm run build`).
 */

import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { test } from 'node:test';
import { pathToFileURL } from 'node:url';

import { PACKAGE_ROOT, REPO_ROOT } from './harness.js';

const reference = process.env['LUA_REFERENCE_DIR'] || join(REPO_ROOT, 'lua-reference');

function referenceScripts(): Map<string, Buffer> {
  const files = readdirSync(reference).filter((f) => f.endsWith('.lua')).sort();
  assert.ok(files.length >= 12, `the scripts of ${reference}`);
  return new Map(files.map((f) => [f, readFileSync(join(reference, f))]));
}

function sameScripts(bundled: Readonly<Record<string, string>>, build: string): void {
  const expected = referenceScripts();
  assert.deepEqual(Object.keys(bundled).sort(), [...expected.keys()], `${build}: the bundled scripts are lua-reference/'s`);
  for (const [file, bytes] of expected) {
    const got = Buffer.from(bundled[file]!, 'utf8');
    assert.ok(got.equals(bytes), `${build}: ${file} differs from lua-reference/${file} (run npm run build)`);
  }
}

test('the ES module build carries lua-reference/ byte for byte', async () => {
  const esm = (await import(pathToFileURL(join(PACKAGE_ROOT, 'dist', 'esm', 'index.js')).href)) as {
    BUNDLED_SCRIPTS: Record<string, string>;
    LIBRARY: string;
  };
  sameScripts(esm.BUNDLED_SCRIPTS, 'dist/esm');
  assert.equal(esm.LIBRARY, readFileSync(join(reference, 'ratelimit.lua'), 'utf8'));
});

test('the CommonJS build carries lua-reference/ byte for byte', () => {
  const require = createRequire(import.meta.url);
  const cjs = require(join(PACKAGE_ROOT, 'dist', 'cjs', 'index.js')) as { BUNDLED_SCRIPTS: Record<string, string> };
  sameScripts(cjs.BUNDLED_SCRIPTS, 'dist/cjs');
});

test('the build the tests run carries lua-reference/ byte for byte', async () => {
  const src = await import('../src/index.js');
  sameScripts(src.BUNDLED_SCRIPTS, 'src (build/)');
});
