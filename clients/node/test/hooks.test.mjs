// useDatabase() and useFileDatabase() driven by hand: the hooks they register are called here as
// a runner would call them (vitest's arguments, or jest's none), against the real daemon. The
// runners themselves run the examples in suites.test.mjs and keep.test.mjs.
import assert from 'node:assert/strict'
import { afterEach, before, beforeEach, describe, test } from 'node:test'
import { PgleaseClient, useDatabase, useFileDatabase } from '../index.js'
import hooksModule from '../lib/hooks.cjs'
import { client, proxy, requireDaemon } from './support.mjs'

const { keepFailedSecs } = hooksModule

before(requireDaemon)
afterEach(() => delete process.env.PGLEASE_KEEP_FAILED)

/** Hooks that record what is registered, to be called by the test. */
function recordingHooks() {
  const registered = {}
  const hook = (name) => (fn, timeout) => {
    registered[name] = { fn, timeout }
  }
  return {
    hooks: { beforeEach: hook('beforeEach'), afterEach: hook('afterEach'), beforeAll: hook('beforeAll'), afterAll: hook('afterAll') },
    call: (name, ...args) => registered[name].fn(...args),
    registered,
  }
}

/** What vitest gives beforeEach/afterEach: the test's context, its task, its outcome. */
function vitestContext(name, state = 'run') {
  const file = { type: 'suite', name: 'src/orders.test.js', tasks: [] }
  file.file = file
  const suite = { type: 'suite', name: 'refunds', file, suite: file, tasks: [] }
  const task = { type: 'test', name, file, suite, result: { state } }
  return { task }
}

async function openLease(id) {
  return (await client.status()).leases.find((lease) => lease.id === id)
}

test('the hooks lease before and release after; the label is the test\'s full name', async () => {
  const runner = recordingHooks()
  const db = useDatabase({ template: 'app', hooks: runner.hooks })
  assert.equal(runner.registered.beforeEach.timeout, 120_000, 'a hook timeout long enough to wait for a clone')
  for (const name of ['beforeEach', 'afterEach']) {
    // jest would take a declared parameter for a `done` callback and wait for it forever.
    assert.equal(runner.registered[name].fn.length, 0, `${name} declares no parameter`)
  }
  const context = vitestContext('pays back')
  await runner.call('beforeEach', context)
  const id = db.id
  assert.match(db.url, /^postgresql:\/\/.*sslmode=disable$/)
  assert.equal((await openLease(id))?.label, 'src/orders.test.js > refunds > pays back')
  await runner.call('afterEach', context)
  assert.equal(await openLease(id), undefined)
  assert.throws(() => db.url, /db\.url was read when no database is leased: useDatabase\(\) leases in beforeEach/)
})

test('reading the database outside a test throws instead of handing pg an empty config', () => {
  const db = useDatabase({ template: 'app', hooks: recordingHooks().hooks })
  assert.throws(() => db.config, /@pglease\/client: db\.config was read when no database is leased/)
  assert.ok(Object.isFrozen(db))
})

test('a second test starting while the first holds the database (test.concurrent) is refused', async () => {
  const runner = recordingHooks()
  const db = useDatabase({ template: 'app', hooks: runner.hooks })
  const first = vitestContext('first')
  const second = vitestContext('second')
  await runner.call('beforeEach', first)
  const id = db.id
  try {
    await assert.rejects(runner.call('beforeEach', second), /another test still holds this file's database .*test\.concurrent/)
    // The refused test's afterEach leaves the first test's lease alone.
    await runner.call('afterEach', second)
    assert.ok(await openLease(id))
  } finally {
    await runner.call('afterEach', first)
  }
  assert.equal(await openLease(id), undefined)
})

test('useFileDatabase leases in beforeAll, releases in afterAll, labelled with the file', async () => {
  const runner = recordingHooks()
  const db = useFileDatabase({ template: 'app', hooks: runner.hooks })
  const suite = vitestContext('x').task.file
  await runner.call('beforeAll', suite)
  const id = db.id
  assert.equal((await openLease(id))?.label, 'src/orders.test.js')
  await runner.call('afterAll', suite)
  assert.equal(await openLease(id), undefined)
})

test('without hooks or globals, the error says what to pass', () => {
  assert.throws(() => useDatabase({ template: 'app' }), /useDatabase\(\) found no beforeEach\/afterEach: pass the runner's, useDatabase\(\{ hooks: \{ beforeEach, afterEach \} \}\)/)
  assert.throws(() => useFileDatabase({ hooks: { beforeEach() {}, afterEach() {} } }), /found no beforeAll\/afterAll/)
})

test('keepFailed: seconds, true for an hour, PGLEASE_KEEP_FAILED; anything else is a clear error', () => {
  assert.equal(keepFailedSecs(600), 600)
  assert.equal(keepFailedSecs(true), 3600)
  assert.equal(keepFailedSecs(false), 0)
  assert.equal(keepFailedSecs(undefined), 0)
  process.env.PGLEASE_KEEP_FAILED = '90'
  assert.equal(keepFailedSecs(undefined), 90)
  assert.equal(keepFailedSecs(false), 0, 'the option wins over the environment')
  process.env.PGLEASE_KEEP_FAILED = '0'
  assert.equal(keepFailedSecs(undefined), 0)
  process.env.PGLEASE_KEEP_FAILED = 'yes'
  assert.throws(() => useDatabase({ hooks: recordingHooks().hooks }), /PGLEASE_KEEP_FAILED="yes": give the seconds to keep a failed test's database, 1 to 86400, or 0 for off/)
  for (const bad of [-1, 1.5, 100_000, '60']) {
    assert.throws(() => keepFailedSecs(bad), /keepFailed: .*give the seconds/)
  }
})

test('a daemon too old to keep: the failed test\'s database is dropped with a warning', async () => {
  const older = await proxy({ refuseKeep: true })
  const warnings = []
  const warn = console.warn
  console.warn = (message) => warnings.push(message)
  try {
    const runner = recordingHooks()
    const db = useDatabase({ template: 'app', keepFailed: 60, client: new PgleaseClient({ url: older.url }), hooks: runner.hooks })
    const context = vitestContext('fails')
    await runner.call('beforeEach', context)
    const id = db.id
    context.task.result.state = 'fail'
    await runner.call('afterEach', context)
    assert.equal(await openLease(id), undefined, 'released all the same')
    assert.deepEqual(older.requests.filter((r) => r.method === 'DELETE').map((r) => r.url), [`/leases/${id}?keep=60`, `/leases/${id}`])
    assert.equal(warnings.length, 1, warnings.join('\n'))
    assert.match(warnings[0], /did not keep the database of src\/orders\.test\.js > refunds > fails \(400 malformed_request: .*keep.*\): it is too old to keep databases; dropping it instead/)
  } finally {
    console.warn = warn
    await older.close()
  }
})

test('keepFailed under a runner that cannot tell a failure: dropped, said once', async () => {
  const warnings = []
  const warn = console.warn
  console.warn = (message) => warnings.push(message)
  try {
    const runner = recordingHooks()
    const db = useDatabase({ template: 'app', keepFailed: 60, hooks: runner.hooks })
    for (let i = 0; i < 2; i++) {
      await runner.call('beforeEach')
      const id = db.id
      await runner.call('afterEach')
      assert.equal(await openLease(id), undefined)
    }
    assert.equal(warnings.length, 1)
    assert.match(warnings[0], /this runner does not say whether a test failed/)
  } finally {
    console.warn = warn
  }
})

test('a lease that expired during its test: afterEach says it outlived its time to live', async () => {
  const runner = recordingHooks()
  const db = useDatabase({ template: 'app', ttlSecs: 1, hooks: runner.hooks })
  const context = vitestContext('runs long')
  await runner.call('beforeEach', context)
  const id = db.id
  // The daemon ends the lease when its second is up; wait for that, not a fixed time.
  for (const deadline = Date.now() + 15_000; await openLease(id); ) {
    assert.ok(Date.now() < deadline, 'the lease did not expire within 15 s')
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  await assert.rejects(runner.call('afterEach', context), /the lease of src\/orders\.test\.js > refunds > runs long had ended before afterEach gave it back: it outlived its time to live .*ttlSecs/)
})

// node:test's own hooks, given as its users give them: each test's lease is labelled with the
// file, the describe and the test, as under vitest and jest (not "node test").
describe('under node:test', () => {
  const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

  test('the label is the file, the describe and the test', async () => {
    const label = (await openLease(db.id))?.label
    assert.match(label ?? '', /hooks\.test\.mjs > under node:test > the label is the file, the describe and the test$/)
  })
})
