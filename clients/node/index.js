// @pglease/client: lease a fresh, migrated PostgreSQL database per test from a pglease daemon
// (its HTTP API), for vitest and jest. No runtime dependencies: Node's global fetch.

/** The daemon answered with an error: HTTP status, code and message. */
export class PgleaseError extends Error {
  constructor(status, code, message) {
    super(`pglease answered ${status} ${code}: ${message}`)
    this.name = 'PgleaseError'
    this.status = status
    this.code = code
    this.detail = message
  }
}

/** No daemon answers at the URL. */
export class PgleaseUnavailableError extends Error {
  constructor(url, cause) {
    super(
      `no pglease daemon answers at ${url} (${cause?.cause?.code ?? cause?.message ?? cause}): ` +
        'start one with `pglease serve`, or point PGLEASE_URL at it',
    )
    this.name = 'PgleaseUnavailableError'
  }
}

/** At most 256 characters, the end kept (it names the test); no control characters. */
export function cleanLabel(label) {
  // eslint-disable-next-line no-control-regex
  const printable = String(label).replace(/[\u0000-\u001f\u007f-\u009f]/g, '')
  return [...printable].slice(-256).join('')
}

export class PgleaseClient {
  /** @param {{url?: string, token?: string}} [options] */
  constructor({ url, token } = {}) {
    this.url = (url ?? process.env.PGLEASE_URL ?? 'http://127.0.0.1:5480').replace(/\/+$/, '')
    this.token = token ?? process.env.PGLEASE_TOKEN ?? undefined
  }

  async lease({ template = 'default', ttlSecs, waitMs, maxConnections, postgresVersion, label } = {}) {
    const body = { template }
    if (ttlSecs !== undefined) body.ttl_secs = ttlSecs
    if (waitMs !== undefined) body.wait_ms = waitMs
    if (maxConnections !== undefined) body.max_connections = maxConnections
    if (postgresVersion !== undefined) body.postgres_version = String(postgresVersion)
    if (label) body.label = cleanLabel(label)
    const lease = await this.#call('POST', '/lease', body)
    return {
      ...lease,
      config: {
        host: lease.host,
        port: lease.port,
        user: lease.user,
        password: lease.password,
        database: lease.database,
      },
    }
  }

  /** Drops the lease's database; with `keepSecs`, keeps it as it is for a look. */
  async release(id, { keepSecs } = {}) {
    const query = keepSecs ? `keep=${keepSecs}` : 'reuse=false'
    await this.#call('DELETE', `/leases/${id}?${query}`)
  }

  async renew(id, ttlSecs) {
    return this.#call('POST', `/leases/${id}/renew`, ttlSecs ? { ttl_secs: ttlSecs } : {})
  }

  async kept() {
    return (await this.#call('GET', '/kept')).kept
  }

  async status() {
    return this.#call('GET', '/status')
  }

  async #call(method, path, body) {
    const headers = { 'content-type': 'application/json' }
    if (this.token) headers.authorization = `Bearer ${this.token}`
    let response
    try {
      response = await fetch(this.url + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
      })
    } catch (error) {
      throw new PgleaseUnavailableError(this.url, error)
    }
    const text = await response.text()
    const json = text ? safeJson(text) : null
    if (!response.ok) {
      throw new PgleaseError(response.status, json?.error?.code ?? 'http_error', json?.error?.message ?? text)
    }
    return json
  }
}

function safeJson(text) {
  try {
    return JSON.parse(text)
  } catch {
    return null
  }
}

/**
 * Registers hooks that lease a database before each test and release it after; returns an
 * object whose fields (`url`, `config`, `id`, …) are the current test's database.
 * Works with vitest and jest: pass their `beforeEach`/`afterEach` (and vitest's
 * `onTestFailed`), or rely on the globals.
 */
export function useDatabase(options = {}) {
  return register(options, 'each')
}

/** Like useDatabase, one database for all the tests of a file (beforeAll/afterAll). */
export function useFileDatabase(options = {}) {
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
