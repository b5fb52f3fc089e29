// Keeping a failed test's database: `DELETE /leases/{id}?keep=SECS` and `GET /kept`. Needs a
// daemon that has them (older ones answer the keep with 400; hooks.test.mjs covers that).
import assert from 'node:assert/strict'
import { afterEach, before, test } from 'node:test'
import pg from 'pg'
import { assertGivenBack, client, jestEsm, leasesLabelled, requireDaemon, runExamples } from './support.mjs'

before(requireDaemon)

// The daemon keeps 8 databases at most (--max-kept): each test drops what it kept.
const keptHere = []
afterEach(async () => {
  for (const id of keptHere.splice(0)) await client.dropKept(id).catch(() => {})
})

async function totals(url) {
  const connection = new pg.Client({ connectionString: url })
  await connection.connect()
  try {
    return (await connection.query('SELECT total_cents::int AS total FROM orders')).rows.map((r) => r.total)
  } finally {
    await connection.end()
  }
}

test('client: release with keepSecs keeps the database as it was; kept() lists it; dropKept drops it', async () => {
  const lease = await client.lease({ template: 'app', label: 'keep test: client' })
  const connection = new pg.Client(lease.config)
  await connection.connect()
  await connection.query('INSERT INTO orders (customer_id, total_cents) VALUES (1, 31337)')
  await connection.end()
  await client.release(lease.id, { keepSecs: 120 })
  keptHere.push(lease.id)
  const kept = (await client.kept()).find((k) => k.id === lease.id)
  assert.ok(kept, 'listed by GET /kept')
  assert.equal(kept.label, 'keep test: client')
  assert.equal(kept.database, lease.database)
  assert.deepEqual(await totals(kept.url), [31337])
  await client.dropKept(lease.id)
  assert.equal((await client.kept()).find((k) => k.id === lease.id), undefined)
})

for (const runner of ['vitest', 'jest']) {
  test(`${runner} keepFailed: a failed test's database kept as it left it and its URL printed; the passing one dropped`, async () => {
    const run = runner === 'vitest'
      ? await runExamples('vitest', ['run', '--dir', 'examples/failing/vitest'], { PGLEASE_KEEP_FAILED: '120' })
      : await runExamples('jest', ['--config', 'examples/failing/jest/jest.config.mjs', '-w', '2'], {
        ...jestEsm,
        PGLEASE_KEEP_FAILED: '120',
      })
    const [failed] = leasesLabelled(run, ' > breaks on purpose')
    const [file] = leasesLabelled(run, '/file.test.js').concat(leasesLabelled(run, '/file.test.mjs'))
    assert.ok(failed && file, JSON.stringify(run.leases))
    keptHere.push(failed.id, file.id)
    assert.equal(run.status, 1, run.output)
    await assertGivenBack(run, { kept: [failed.id, file.id] })

    const kept = await client.kept()
    const keptTest = kept.find((k) => k.id === failed.id)
    assert.equal(keptTest.label, failed.label)
    assert.ok(run.output.includes(`${failed.label} failed: its database ${keptTest.database} is kept as the test left it for up to 120 s (pglease kept lists it): ${keptTest.url}`), run.output)
    assert.deepEqual(await totals(keptTest.url), [4242])
    // The file's database, shared by a passing and a failing test, is kept too.
    assert.deepEqual(await totals(kept.find((k) => k.id === file.id).url), [4343])
  })
}
