'use strict'
// useDatabase() and useFileDatabase(): register a runner's hooks that lease a database before
// each test (or before a file's tests) and give it back after, kept for a look when the test
// failed and keepFailed asks for it. The runner-specific knowledge is in runner.cjs; the HTTP
// in client.cjs.

const { PgleaseClient, PgleaseError } = require('./client.cjs')
const runner = require('./runner.cjs')

// A lease waits for a clone when none is ready (the daemon's wait_ms, 60 s by default); the
// runners' own hook timeouts (5 s in jest, 10 s in vitest) would cut that short.
const DEFAULT_HOOK_TIMEOUT_MS = 120_000
// keepFailed: true, like the pytest and Go helpers' flag without a value.
const DEFAULT_KEEP_SECS = 3600
// The daemon refuses a keep outside this range (a longer one within it is cut to --max-keep).
const MAX_KEEP_SECS = 86_400
const LEASE_FIELDS = [
  'id', 'template', 'fingerprint', 'database', 'host', 'port', 'user', 'password', 'url',
  'expires_at', 'label', 'config',
]

/** A fresh database for every test: leased in beforeEach, given back in afterEach. */
function useDatabase(options = {}) {
  return register(options, {
    name: 'useDatabase',
    before: 'beforeEach',
    after: 'afterEach',
    label: runner.testName,
    failed: runner.testFailed,
  })
}

/** One database for the tests of a file (or of the describe it is called in): leased in
 * beforeAll, given back in afterAll, kept if any of those tests failed. */
function useFileDatabase(options = {}) {
  return register(options, {
    name: 'useFileDatabase',
    before: 'beforeAll',
    after: 'afterAll',
    label: runner.suiteName,
    failed: runner.anyTestFailed,
  })
}

function register(options, scope) {
  const hooks = options.hooks ?? globalThis
  const before = hooks[scope.before]
  const after = hooks[scope.after]
  if (typeof before !== 'function' || typeof after !== 'function') {
    throw new Error(
      `@pglease/client: ${scope.name}() found no ${scope.before}/${scope.after}: pass the runner's, ` +
        `${scope.name}({ hooks: { ${scope.before}, ${scope.after} } }) with both imported from ` +
        "'vitest', or turn the runner's globals on (vitest: `globals: true`; jest has them)",
    )
  }
  const client = options.client ?? new PgleaseClient(options)
  const keepSecs = keepFailedSecs(options.keepFailed)
  const timeout = options.timeoutMs ?? DEFAULT_HOOK_TIMEOUT_MS
  // The lease of the test (or file) running now, and the context its hook was given, so the
  // after hook of a test that never got a lease cannot give back another test's.
  const current = { lease: undefined, owner: undefined }

  // `function () {}` reading `arguments`, not `(context) => {}`: jest takes a declared
  // parameter for a `done` callback and waits for it, and vitest parses the first parameter for
  // test.extend fixtures and rejects anything but `{ … }`. vitest passes its context (or
  // suite) as arguments[0]; jest passes nothing.
  before(async function pgleaseLease() {
    const context = arguments[0]
    if (current.lease) {
      throw new Error(
        `@pglease/client: ${scope.name}(): another test still holds this file's database ` +
          `(${current.lease.label ?? current.lease.id}): tests of one file running at once ` +
          '(test.concurrent) cannot share one db object; lease in the test with ' +
          'new PgleaseClient().lease() instead',
      )
    }
    const label = options.label ?? scope.label(context) ?? 'node test'
    current.lease = await client.lease({
      template: options.template,
      ttlSecs: options.ttlSecs,
      waitMs: options.waitMs,
      maxConnections: options.maxConnections,
      postgresVersion: options.postgresVersion,
      label,
    })
    current.owner = context
  }, timeout)

  after(async function pgleaseRelease() {
    const context = arguments[0]
    const lease = current.lease
    if (!lease || current.owner !== context) return
    current.lease = undefined
    current.owner = undefined
    try {
      await giveBack(client, lease, keepSecs ? scope.failed(context) : false, keepSecs)
    } catch (error) {
      if (error instanceof PgleaseError && error.code === 'lease_not_found') {
        throw new Error(
          `@pglease/client: the lease of ${lease.label ?? lease.id} had ended before ` +
            `${scope.after} gave it back: it outlived its time to live (expires_at ` +
            `${lease.expires_at}) and the daemon dropped its database; ask for more with ttlSecs`,
          { cause: error },
        )
      }
      throw error
    }
  }, timeout)

  return currentDatabase(current, scope)
}

/** Drops the database, or keeps it when the test failed; says where a kept one is. */
async function giveBack(client, lease, failed, keepSecs) {
  if (failed === undefined) {
    warnOnce(
      'keepFailed: this runner does not say whether a test failed (not vitest, nor jest with ' +
        'jest-circus): failed tests\' databases are dropped like the others',
    )
  }
  if (failed) {
    try {
      await client.release(lease.id, { keepSecs })
      console.warn(
        `pglease: ${lease.label ?? lease.id} failed: its database ${lease.database} is kept as ` +
          `the test left it for up to ${keepSecs} s (pglease kept lists it): ${lease.url}`,
      )
      return
    } catch (error) {
      // A daemon older than `keep` answers 400 to the unknown parameter. A lease that is gone
      // (expired during the test) or a daemon failure is not a refused keep: those surface.
      if (!(error instanceof PgleaseError) || error.status >= 500 || error.code === 'lease_not_found') {
        throw error
      }
      console.warn(
        `pglease: the daemon at ${client.url} did not keep the database of ${lease.label ?? lease.id} ` +
          `(${error.status} ${error.code}: ${error.detail}): it is too old to keep databases; ` +
          'dropping it instead',
      )
    }
  }
  await client.release(lease.id)
}

/** The seconds to keep a failed test's database, or 0: the option, else PGLEASE_KEEP_FAILED. */
function keepFailedSecs(option) {
  if (option === undefined) {
    const env = process.env.PGLEASE_KEEP_FAILED
    if (env === undefined || env.trim() === '' || env.trim() === '0') return 0
    const secs = Number(env)
    if (!Number.isInteger(secs) || secs < 1 || secs > MAX_KEEP_SECS) {
      throw new Error(
        `@pglease/client: PGLEASE_KEEP_FAILED=${JSON.stringify(env)}: give the seconds to keep a ` +
          `failed test's database, 1 to ${MAX_KEEP_SECS}, or 0 for off`,
      )
    }
    return secs
  }
  if (option === false || option === 0 || option === null) return 0
  if (option === true) return DEFAULT_KEEP_SECS
  if (!Number.isInteger(option) || option < 1 || option > MAX_KEEP_SECS) {
    throw new Error(
      `@pglease/client: keepFailed: ${JSON.stringify(option)}: give the seconds to keep a failed ` +
        `test's database, 1 to ${MAX_KEEP_SECS}, true for ${DEFAULT_KEEP_SECS}, or false`,
    )
  }
  return option
}

/** The object a suite reads its database from. Reading it when no lease is held throws:
 * `new pg.Client(undefined)` would otherwise connect to whatever PGHOST and PGDATABASE name. */
function currentDatabase(current, scope) {
  const db = {}
  for (const field of LEASE_FIELDS) {
    Object.defineProperty(db, field, {
      enumerable: true,
      get() {
        if (!current.lease) {
          throw new Error(
            `@pglease/client: db.${field} was read when no database is leased: ${scope.name}() ` +
              `leases in ${scope.before} and gives it back in ${scope.after}; read it inside a ` +
              'test (or a hook registered after it), not when the file is loaded',
          )
        }
        return current.lease[field]
      },
    })
  }
  return Object.freeze(db)
}

const warned = new Set()
function warnOnce(message) {
  if (warned.has(message)) return
  warned.add(message)
  console.warn(`pglease: ${message}`)
}

module.exports = { useDatabase, useFileDatabase, keepFailedSecs }
