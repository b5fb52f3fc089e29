// The example suites under vitest and jest, each run in a subprocess with several files in
// parallel. Every example test checks its database is its own and labelled with its name
// (examples/check.cjs); here, afterwards, that every lease was given back, and that a failing
// test's was too.
import assert from 'node:assert/strict'
import { before, test } from 'node:test'
import { assertGivenBack, jestEsm, requireDaemon, runExamples } from './support.mjs'

before(requireDaemon)

// Examples/vitest: 3 files of 4 tests, 2 test.extend tests, a file database used by 2 tests
// (logged once): 15 leases.
for (const pool of ['threads', 'forks']) {
  test(`vitest (${pool}): 16 tests in 5 files at once, each on its own database, all given back`, async () => {
    const run = await runExamples('vitest', ['run', '--dir', 'examples/vitest', '--pool', pool])
    assert.equal(run.status, 0, run.output)
    assert.match(run.output, /Test Files\s+5 passed \(5\)/, run.output)
    assert.match(run.output, /Tests\s+16 passed \(16\)/, run.output)
    assert.equal(run.leases.length, 15, JSON.stringify(run.leases))
    assert.equal(new Set(run.leases.map((l) => l.database)).size, 15, 'a database handed out twice')
    await assertGivenBack(run)
  })
}

test('jest (ES modules, 4 workers): 17 tests in 5 files, each on its own database, all given back', async () => {
  const run = await runExamples('jest', ['--config', 'examples/jest/jest.config.mjs', '-w', '4'], jestEsm)
  assert.equal(run.status, 0, run.output)
  assert.match(run.output, /Tests:\s+17 passed, 17 total/, run.output)
  assert.equal(run.leases.length, 16, JSON.stringify(run.leases))
  assert.equal(new Set(run.leases.map((l) => l.database)).size, 16, 'a database handed out twice')
  await assertGivenBack(run)
})

test('jest (CommonJS, 4 workers): require() works the same', async () => {
  const run = await runExamples('jest', ['--config', 'examples/jest-cjs/jest.config.cjs', '-w', '4'])
  assert.equal(run.status, 0, run.output)
  assert.match(run.output, /Tests:\s+6 passed, 6 total/, run.output)
  assert.equal(run.leases.length, 6)
  await assertGivenBack(run)
})

test('vitest: failing tests still give their databases back (nothing kept without keepFailed)', async () => {
  const run = await runExamples('vitest', ['run', '--dir', 'examples/failing/vitest'], { PGLEASE_KEEP_FAILED: '' })
  assert.equal(run.status, 1, run.output)
  assert.match(run.output, /Tests\s+2 failed \| 2 passed \(4\)/, run.output)
  assert.doesNotMatch(run.output, /is kept as the test left it/)
  assert.equal(run.leases.length, 3)
  await assertGivenBack(run)
})

test('jest: failing tests still give their databases back (nothing kept without keepFailed)', async () => {
  const run = await runExamples('jest', ['--config', 'examples/failing/jest/jest.config.mjs', '-w', '2'], {
    ...jestEsm,
    PGLEASE_KEEP_FAILED: '',
  })
  assert.equal(run.status, 1, run.output)
  assert.match(run.output, /Tests:\s+2 failed, 2 passed, 4 total/, run.output)
  assert.doesNotMatch(run.output, /is kept as the test left it/)
  assert.equal(run.leases.length, 3)
  await assertGivenBack(run)
})
