// The package's build: the Lua twins bundled from lua-reference/, then the ES module build
// (dist/esm) and the CommonJS build (dist/cjs, marked as such by its own package.json), each
// with its type declarations. `node scripts/build.mjs test` also compiles the tests (build/).
import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');

function run(...args) {
  const r = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
  if (r.status !== 0) process.exit(r.status ?? 1);
}

run(join(root, 'scripts', 'bundle-lua.mjs'));
rmSync(join(root, 'dist'), { recursive: true, force: true });
run(tsc, '-p', 'tsconfig.esm.json');
run(tsc, '-p', 'tsconfig.cjs.json');
mkdirSync(join(root, 'dist', 'cjs'), { recursive: true });
writeFileSync(join(root, 'dist', 'cjs', 'package.json'), '{"type":"commonjs"}\n');
if (process.argv[2] === 'test') {
  rmSync(join(root, 'build'), { recursive: true, force: true });
  run(tsc, '-p', 'tsconfig.test.json');
}
