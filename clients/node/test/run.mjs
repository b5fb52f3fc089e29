// The test entry point, for `npm test` and for callers that run `node test/run.mjs`
// (tests/it/helpers.rs): Node's test runner over test/*.test.mjs, one file at a time, since
// several files start runners with 4 workers each and the machine may have 2 cores.
import { spawnSync } from 'node:child_process'
import { readdirSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const files = readdirSync(here).filter((name) => name.endsWith('.test.mjs')).sort().map((name) => join(here, name))
const run = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-reporter=spec', ...files], {
  cwd: join(here, '..'),
  stdio: 'inherit',
})
process.exit(run.status ?? 1)
