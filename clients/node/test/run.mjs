// The package's test suite, against a real daemon (PGLEASE_URL) serving the template `app`
// of clients/testdata/migrations: example suites in vitest (threads) and jest (4 workers)
// whose every test checks its database is its own, then what must hold after them, a
// failing test's database kept, the errors, and the types. `npm test` runs it.
import { execFileSync, spawnSync } from 'node:child_process'
import assert from 'node:assert/strict'
import { fileURLToPath } from 'node:url'
import { dirname, join } from 'node:path'
import pg from 'pg'
import { PgleaseClient, PgleaseError, PgleaseUnavailableError, cleanLabel } from '../index.js'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
if (!process.env.PGLEASE_URL) {
  console.error('PGLEASE_URL is not set: these tests need a real daemon serving template `app`:\n' +
    '  pglease serve --listen 127.0.0.1:55483 --template app=migrations:$PWD/../testdata/migrations &\n' +
    '  PGLEASE_URL=http://127.0.0.1:55483 npm test')
  process.exit(1)
}
const client = new PgleaseClient()
const bin = (name) => join(root, 'node_modules', '.bin', name)
// Plain text to match against: CI=true makes the runners colour their output.
const plain = (text) => text.replace(/\x1b\[[0-9;]*m/g, '')
const run = (program, args, env = {}) => {
  const out = spawnSync(program, args, {
    cwd: root,
    env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0', ...env },
    encoding: 'utf8',
  })
  return { ...out, stdout: plain(out.stdout ?? ''), stderr: plain(out.stderr ?? '') }
}
const openLeases = async (part) =>
  (await client.status()).leases.filter((l) => (l.label ?? '').includes(part))
let checks = 0
const check = async (name, fn) => {
  await fn()
  checks++
  console.log(`ok ${checks} - ${name}`)
}

await check('vitest: 12 tests in 3 files, in parallel, each on its own database', async () => {
  const out = run(bin('vitest'), ['run', '--dir', 'examples/vitest', '--pool', 'threads'])
  assert.equal(out.status, 0, out.stdout + out.stderr)
  assert.match(out.stdout, /Tests\s+12 passed/)
  assert.deepEqual(await openLeases('isolated'), [], 'every lease released')
})

await check('jest: 8 tests in 2 files on 4 workers, each on its own database', async () => {
  const out = run(bin('jest'), ['--rootDir', 'examples/jest', '-w', '4', '--testMatch', '**/*.test.mjs'], {
    NODE_OPTIONS: '--experimental-vm-modules',
  })
  assert.equal(out.status, 0, out.stdout + out.stderr)
  assert.match(out.stderr, /Tests:\s+8 passed/)
  assert.deepEqual(await openLeases('jest isolated'), [], 'every lease released')
})

await check('a failing test releases its database, kept as it was with keepFailed', async () => {
  const out = run(bin('vitest'), ['run', '--dir', 'examples/failing'], { PGLEASE_KEEP_FAILED: '90' })
  assert.notEqual(out.status, 0, 'the example fails on purpose')
  assert.match(out.stdout + out.stderr, /its database \w+ is kept as the test left it for up to 90 s \(pglease kept lists it\): postgres:\/\//)
  assert.deepEqual(await openLeases('breaks on purpose'), [], 'no lease left open')
  const kept = (await client.kept()).filter((k) => (k.label ?? '').includes('breaks on purpose'))
  assert.equal(kept.length, 1, JSON.stringify(kept))
  const db = new pg.Client({ connectionString: kept[0].url })
  await db.connect()
  const orders = await db.query('SELECT total_cents FROM orders')
  await db.end()
  assert.deepEqual(orders.rows.map((r) => Number(r.total_cents)), [4242])
  const drop = await fetch(`${client.url}/kept/${kept[0].id}`, { method: 'DELETE' })
  assert.equal(drop.status, 204)
})

await check('an unknown template is a PgleaseError with its code', async () => {
  await assert.rejects(client.lease({ template: 'nope' }), (error) => {
    assert.ok(error instanceof PgleaseError)
    assert.equal(error.status, 404)
    assert.equal(error.code, 'unknown_template')
    return true
  })
})

await check('no daemon is an error that names the URL and what to do', async () => {
  const none = new PgleaseClient({ url: 'http://127.0.0.1:9' })
  await assert.rejects(none.lease(), (error) => {
    assert.ok(error instanceof PgleaseUnavailableError)
    assert.match(error.message, /no pglease daemon answers at http:\/\/127\.0\.0\.1:9.*pglease serve/)
    return true
  })
})

await check('labels are cut to their last 256 characters, control characters removed', async () => {
  assert.equal(cleanLabel('a\u0000b\nc'), 'abc')
  assert.equal(cleanLabel('x'.repeat(300) + 'end').length, 256)
  assert.ok(cleanLabel('x'.repeat(300) + 'end').endsWith('end'))
})

await check('the types check (tsc --noEmit)', async () => {
  execFileSync(bin('tsc'), ['--noEmit', '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext', 'test/types.ts'], {
    cwd: root,
    stdio: 'inherit',
  })
})

console.log(`1..${checks}`)
