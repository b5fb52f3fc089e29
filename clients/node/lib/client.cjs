'use strict'
// The HTTP client of a pglease daemon: lease, release (or keep), renew, list kept databases,
// read the status, and the two errors a caller can meet. It knows nothing of test runners
// (hooks.cjs does). No dependencies: Node's global fetch.
//
// CommonJS behind the package's ESM entry (../index.js) so that jest's default CommonJS mode
// can `require` it too; both routes load this one module, never two copies.

const DEFAULT_URL = 'http://127.0.0.1:5480'
// The daemon refuses longer labels and control characters (Rust's char::is_control: Cc).
const LABEL_MAX_CHARS = 256
const CONTROL_CHARACTERS = /[\u0000-\u001f\u007f-\u009f]/g

/** The daemon answered with an error: its HTTP status, code and message. */
class PgleaseError extends Error {
  constructor(status, code, message, request) {
    super(`pglease answered ${status} ${code} to ${request}: ${message}`)
    this.name = 'PgleaseError'
    this.status = status
    this.code = code
    // The daemon's own message, without the prefix above.
    this.detail = message
  }
}

/** No daemon answers at the URL (nothing listens, or the connection failed). */
class PgleaseUnavailableError extends Error {
  constructor(url, cause) {
    // fetch wraps the socket error: its cause has the useful code (ECONNREFUSED, ENOTFOUND).
    const reason = cause?.cause?.code ?? cause?.cause?.message ?? cause?.message ?? String(cause)
    super(
      `no pglease daemon answers at ${url} (${reason}): start one with ` +
        '`pglease serve --template NAME=migrations:DIR` and wait for it with `pglease ready`, ' +
        'or point PGLEASE_URL at a running one',
      { cause },
    )
    this.name = 'PgleaseUnavailableError'
    this.url = url
  }
}

/** A label the daemon accepts: control characters removed, the last 256 characters kept
 * (a test's full name ends with its most specific part). */
function cleanLabel(label) {
  const printable = String(label).replace(CONTROL_CHARACTERS, '')
  // Characters, not UTF-16 units, as the daemon counts them.
  const chars = [...printable]
  return chars.length > LABEL_MAX_CHARS ? chars.slice(-LABEL_MAX_CHARS).join('') : printable
}

class PgleaseClient {
  /** @param {{url?: string, token?: string}} [options] */
  constructor({ url, token } = {}) {
    this.url = (url || process.env.PGLEASE_URL || DEFAULT_URL).replace(/\/+$/, '')
    // Not enumerable: a client logged or compared by a test runner does not show the token.
    Object.defineProperty(this, 'token', {
      value: token ?? (process.env.PGLEASE_TOKEN || undefined),
      enumerable: false,
    })
  }

  /** Leases a fresh database; `config` is ready for `new pg.Client(config)`. */
  async lease({ template, ttlSecs, waitMs, maxConnections, postgresVersion, label } = {}) {
    const body = {}
    // Unset fields are left out so the daemon's own defaults apply.
    if (template !== undefined) body.template = template
    if (ttlSecs !== undefined) body.ttl_secs = ttlSecs
    if (waitMs !== undefined) body.wait_ms = waitMs
    if (maxConnections !== undefined) body.max_connections = maxConnections
    if (postgresVersion !== undefined) body.postgres_version = String(postgresVersion)
    if (label !== undefined && label !== null) body.label = cleanLabel(label)
    const lease = await this.#call('POST', '/lease', body)
    return {
      ...lease,
      label: body.label ?? null,
      config: {
        host: lease.host,
        port: lease.port,
        user: lease.user,
        password: lease.password,
        database: lease.database,
      },
    }
  }

  /** Gives a lease back: its database is dropped, or with `keepSecs` kept as it is for a look
   * (`GET /kept` lists it; the lease's URL still opens it). */
  async release(id, { keepSecs } = {}) {
    const query = keepSecs === undefined ? '' : `?keep=${encodeURIComponent(keepSecs)}`
    await this.#call('DELETE', `/leases/${encodeURIComponent(id)}${query}`)
  }

  /** Extends a lease's time to live (the daemon's default TTL without `ttlSecs`). */
  async renew(id, ttlSecs) {
    const body = ttlSecs === undefined ? {} : { ttl_secs: ttlSecs }
    return this.#call('POST', `/leases/${encodeURIComponent(id)}/renew`, body)
  }

  /** The databases kept after failed tests, oldest first. */
  async kept() {
    return (await this.#call('GET', '/kept')).kept
  }

  /** Drops a kept database now instead of when its keep ends. */
  async dropKept(id) {
    await this.#call('DELETE', `/kept/${encodeURIComponent(id)}`)
  }

  /** The daemon's `GET /status`: servers, templates, open leases (with their labels). */
  async status() {
    return this.#call('GET', '/status')
  }

  async #call(method, path, body) {
    const headers = {}
    if (body !== undefined) headers['content-type'] = 'application/json'
    if (this.token) headers.authorization = `Bearer ${this.token}`
    const request = `${method} ${path}`
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
    const json = parseJson(text)
    if (!response.ok) {
      // Every daemon error is {"error": {"code", "message"}}; anything else (a proxy's page)
      // is shown as it came.
      const code = json?.error?.code ?? 'http_error'
      const message = json?.error?.message ?? (text.trim().slice(0, 500) || response.statusText)
      throw new PgleaseError(response.status, code, message, request)
    }
    return json
  }
}

function parseJson(text) {
  if (!text) return null
  try {
    return JSON.parse(text)
  } catch {
    return null
  }
}

module.exports = { PgleaseClient, PgleaseError, PgleaseUnavailableError, cleanLabel, DEFAULT_URL }
