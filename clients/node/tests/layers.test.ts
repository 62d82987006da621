/**
 * The package's layers: docs/architecture.md's table (`<!-- layers: node -->`) against every
 * import of `src/`. A file missing from the table, an import its row does not name or that goes
 * up the table, and a circle of imports each fail, naming the files.
 */

import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join, posix, relative } from 'node:path';
import { test } from 'node:test';

import { PACKAGE_ROOT, REPO_ROOT } from './harness.js';

interface Row {
  readonly layer: string;
  readonly mayUse: ReadonlySet<string>;
}

/** The rows of the table after `<!-- layers: node -->`, lowest first. */
export function layerTable(doc: string): Row[] {
  const marker = '<!-- layers: node -->';
  const at = doc.indexOf(marker);
  assert.ok(at >= 0, `docs/architecture.md has no '${marker}'`);
  const lines = doc.slice(at + marker.length).split('\n').slice(1);
  const rows: Row[] = [];
  for (const line of lines) {
    if (!line.startsWith('|')) break;
    const cells = line.split('|').map((c) => c.trim());
    const [layer, uses] = [cells[1]!, cells[2]!];
    if (layer === 'layer' || layer.startsWith('---')) continue;
    const names = (s: string): string[] => [...s.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    rows.push({ layer: names(layer)[0] ?? layer, mayUse: new Set(uses === 'nothing' ? [] : names(uses)) });
  }
  return rows;
}

/** Every `.ts` file under `dir` (declarations aside), as a layer name: its path without `.ts`. */
function sources(dir: string, root = dir): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...sources(p, root));
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) out.push(relative(root, p).split('\\').join('/').slice(0, -3));
  }
  return out.sort();
}

/**
 * The relative modules a file's text imports: `import ... from`, `export ... from`, `import '...'`
 * and `import('...')`, type-only ones too, comments left out. Named as layers, from `layer`.
 */
export function importsOf(layer: string, text: string): string[] {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');
  const specs = [
    ...code.matchAll(/\b(?:import|export)\s+(?:type\s+)?[\w$*{}\s,]*?\bfrom\s*['"]([^'"]+)['"]/g),
    ...code.matchAll(/\bimport\s*['"]([^'"]+)['"]/g),
    ...code.matchAll(/\bimport\s*\(\s*['"]([^'"]+)['"]\s*\)/g),
  ].map((m) => m[1]!);
  const out = new Set<string>();
  for (const spec of specs) {
    if (!spec.startsWith('.')) continue;
    out.add(posix.normalize(posix.join(posix.dirname(layer), spec)).replace(/\.js$/, ''));
  }
  return [...out].sort();
}

/** What is wrong with `graph` (a layer's imports) against `rows`: one line per fault. */
export function faults(rows: readonly Row[], graph: ReadonlyMap<string, readonly string[]>): string[] {
  const out: string[] = [];
  const rank = new Map(rows.map((r, i) => [r.layer, i]));
  for (const r of rows) {
    if (!graph.has(r.layer)) out.push(`${r.layer} is in the table and not in src/`);
    for (const u of r.mayUse) {
      if (!rank.has(u)) out.push(`${r.layer} may use ${u}, which the table does not list`);
      else if (rank.get(u)! >= rank.get(r.layer)!) out.push(`${r.layer} may use ${u}, which is not below it`);
    }
  }
  for (const [layer, imports] of graph) {
    const row = rows.find((r) => r.layer === layer);
    if (!row) {
      out.push(`src/${layer}.ts is not in the table`);
      continue;
    }
    for (const i of imports) {
      if (!graph.has(i)) out.push(`${layer} imports ${i}, which is not a file of src/`);
      else if (!row.mayUse.has(i)) out.push(`${layer} imports ${i}, which its row does not name`);
      else if (rank.get(i)! >= rank.get(layer)!) out.push(`${layer} imports ${i}, an upward import`);
    }
  }
  // Circles, found on the imports themselves whatever the table says.
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (n: string): void => {
    if (state.get(n) === 'done') return;
    if (state.get(n) === 'open') {
      out.push(`a circle: ${[...path.slice(path.indexOf(n)), n].join(' -> ')}`);
      return;
    }
    state.set(n, 'open');
    path.push(n);
    for (const m of graph.get(n) ?? []) if (graph.has(m)) visit(m);
    path.pop();
    state.set(n, 'done');
  };
  for (const n of [...graph.keys()].sort()) visit(n);
  return out;
}

test("every import of src/ goes down docs/architecture.md's table, and none closes a circle", () => {
  const rows = layerTable(readFileSync(join(REPO_ROOT, 'docs', 'architecture.md'), 'utf8'));
  const src = join(PACKAGE_ROOT, 'src');
  const files = sources(src);
  assert.ok(files.includes('client') && files.includes('http/core') && files.includes('index'), files.join(' '));
  const graph = new Map(files.map((f) => [f, importsOf(f, readFileSync(join(src, `${f}.ts`), 'utf8'))]));
  assert.deepEqual(faults(rows, graph), []);
  // The client reaches its leases and reservations; they do not reach it back.
  assert.deepEqual(graph.get('lease'), ['algorithm', 'types']);
  assert.deepEqual(graph.get('reservation'), ['algorithm', 'types']);
  assert.ok(graph.get('client')!.includes('lease') && graph.get('client')!.includes('reservation'));
});

test('the check fails on an upward import, an import its row does not name, a circle and a file not in the table', () => {
  const rows = layerTable(
    [
      '<!-- layers: node -->',
      '| layer | may use | what it holds |',
      '|---|---|---|',
      '| `a` | nothing | |',
      '| `b` | `a` | |',
      '| `c` | `a`, `b` | |',
      '',
    ].join('\n'),
  );
  assert.deepEqual(
    rows.map((r) => [r.layer, [...r.mayUse]]),
    [
      ['a', []],
      ['b', ['a']],
      ['c', ['a', 'b']],
    ],
  );
  assert.deepEqual(faults(rows, new Map([['a', []], ['b', ['a']], ['c', ['a', 'b']]])), []);
  assert.deepEqual(faults(rows, new Map([['a', ['c']], ['b', ['a']], ['c', ['a', 'b']]])), [
    'a imports c, which its row does not name',
    'a circle: a -> c -> a',
    'a circle: a -> c -> b -> a',
  ]);
  assert.deepEqual(faults(rows, new Map([['a', []], ['b', ['c']], ['c', ['b']]])), [
    'b imports c, which its row does not name',
    'a circle: b -> c -> b',
  ]);
  assert.deepEqual(faults(rows, new Map([['a', []], ['b', ['a']], ['c', []], ['d', ['a']]])), ['src/d.ts is not in the table']);
  const upward = layerTable('<!-- layers: node -->\n| layer | may use | x |\n|---|---|---|\n| `a` | `b` | |\n| `b` | nothing | |\n');
  assert.deepEqual(faults(upward, new Map([['a', ['b']], ['b', []]])), ['a may use b, which is not below it', 'a imports b, an upward import']);
  // The reader: multi-line and type-only imports, re-exports, dynamic imports; comments and packages left out.
  const text = [
    "import type { A } from './a.js';",
    'import {',
    '  type B,',
    '  b,',
    "} from '../b.js';",
    "export { c } from './c.js';",
    "// import { d } from './d.js';",
    "/* import { e } from './e.js'; */",
    "import { f } from 'node:fs';",
    "const g = await import('./g.js');",
  ].join('\n');
  assert.deepEqual(importsOf('http/x', text), ['b', 'http/a', 'http/c', 'http/g']);
});
