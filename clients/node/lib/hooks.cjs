'use strict'
// useDatabase() and useFileDatabase(): register a runner's hooks that lease a database before
// each test (or before a file's tests) and give it back after, kept for a look when the test
// failed and keepFailed asks for it. The HTTP is in client.cjs.

const { PgleaseClient, PgleaseError } = require('./client.cjs')

/**
 * Registers hooks that lease a database before each test and release it after; returns an
 * object whose fields (`url`, `config`, `id`, …) are the current test's database.
 * Works with vitest and jest: pass their `beforeEach`/`afterEach` (and vitest's
 * `onTestFailed`), or rely on the globals.
 */
function useDatabase(options = {}) {
  return register(options, 'each')
}

/** Like useDatabase, one database for all the tests of a file (beforeAll/afterAll). */
function useFileDatabase(options = {}) {
  return register(options, 'all')
}

function register(options, scope) {
  const hooks = options.hooks ?? globalThis
  const before = scope === 'each' ? hooks.beforeEach : hooks.beforeAll
  const after = scope === 'each' ? hooks.afterEach : hooks.afterAll
  if (typeof before !== 'function' || typeof after !== 'function') {
    throw new Error('@pglease/client: no beforeEach/afterEach: pass {hooks: {beforeEach, afterEach}} or enable the globals')
  }
  const client = options.client ?? new PgleaseClient(options)
  const keepFailed = options.keepFailed ?? (process.env.PGLEASE_KEEP_FAILED ? Number(process.env.PGLEASE_KEEP_FAILED) : undefined)
  const current = {}
  let lease
  let failed = false
  // Hooks take `...args`, not `(context)`: jest reads a declared parameter as a `done`
  // callback and would wait for it; vitest passes its test context as the first argument.
  before(async (...args) => {
    const context = args[0]
    failed = false
    // vitest gives the test's context: its failure is known when the test ends.
    context?.onTestFailed?.(() => {
      failed = true
    })
    const label = options.label ?? currentTestName(context) ?? 'node test'
    lease = await client.lease({ ...options, label })
    Object.assign(current, lease)
  }, options.timeoutMs ?? 120_000)
  after(async (...args) => {
    const context = args[0]
    if (!lease) return
    const done = lease
    lease = undefined
    for (const key of Object.keys(current)) delete current[key]
    // vitest tells a hook whether the test failed; jest's afterEach cannot tell (see README).
    if (keepFailed && (failed || context?.task?.result?.state === 'fail')) {
      try {
        await client.release(done.id, { keepSecs: keepFailed })
        console.warn(`pglease: ${done.label ?? 'a failed test'}: its database is kept for up to ${keepFailed} s: ${done.url}`)
        return
      } catch (error) {
        if (!(error instanceof PgleaseError) || error.status >= 500 || error.code === 'lease_not_found') throw error
        console.warn(`pglease: the daemon at ${client.url} is too old to keep databases (${error.code}); dropping it`)
      }
    }
    await client.release(done.id)
  }, options.timeoutMs ?? 120_000)
  return current
}

function currentTestName(context) {
  if (context?.task?.name) {
    const names = []
    for (let task = context.task; task; task = task.suite) if (task.name) names.unshift(task.name)
    const file = context.task.file?.name
    return [file, ...names.filter((n) => n !== file)].filter(Boolean).join(' > ')
  }
  return globalThis.expect?.getState?.().currentTestName
}

module.exports = { useDatabase, useFileDatabase }
