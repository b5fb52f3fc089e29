// index.d.ts is kept by hand: it must compile on its own (`tsc --strict`), and typed uses
// (test/types/: vitest in ESM, jest in CommonJS) must compile against it while the wrong uses
// marked there must not. The uses skip checking the runners' own .d.ts files, which would
// take ten seconds and hide nothing of ours (that is the first check).
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { test } from 'node:test'
import { root } from './support.mjs'

const tsc = (project) =>
  execFileSync(join(root, 'node_modules', '.bin', 'tsc'), ['-p', project], { cwd: root, stdio: 'inherit' })

test('index.d.ts compiles on its own', () => tsc('test/types/tsconfig.declarations.json'))

test('typed uses compile against it, and wrong ones do not (tsc --noEmit)', () => tsc('test/types/tsconfig.json'))
