// Shared by the test files: the daemon they run against (PGLEASE_URL, serving template `app`
// from clients/testdata/migrations), a test runner run in a subprocess over examples/, the
// checks made on its leases afterwards, and a stand-in for a daemon too old to keep databases.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, existsSync } from 'node:fs'
import { createServer } from 'node:http'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { PgleaseClient } from '../index.js'

export const root = join(dirname(fileURLToPath(import.meta.url)), '..')
export const client = new PgleaseClient()

/** Fails with what to do when no daemon serving `app` is at PGLEASE_URL. */
export async function requireDaemon() {
  const start =
    'start one, e.g.\n' +
    '  pglease serve --listen 127.0.0.1:55483 --template app=migrations:$PWD/../testdata/migrations &\n' +
    '  pglease ready --server http://127.0.0.1:55483 && PGLEASE_URL=http://127.0.0.1:55483 npm test'
  assert.ok(process.env.PGLEASE_URL, `PGLEASE_URL is not set: these tests need a real daemon serving template app: ${start}`)
  const response = await fetch(`${client.url}/templates/app`, {
    headers: client.token ? { authorization: `Bearer ${client.token}` } : {},
  }).catch((error) => assert.fail(`no daemon answers at PGLEASE_URL=${client.url} (${error.cause?.code ?? error}): ${start}`))
  assert.notEqual(response.status, 401, `the daemon at ${client.url} wants a token: set PGLEASE_TOKEN`)
  assert.equal(response.status, 200, `the daemon at ${client.url} has no template app (${response.status}): ${start}`)
}

const bin = (name) => join(root, 'node_modules', '.bin', name)
// CI=true makes the runners colour their output even with NO_COLOR; matched text is plain.
const plain = (text) => text.replace(/\x1b\[[0-9;]*m/g, '')

/**
 * Runs a runner over examples/ in a subprocess. Every example test logs its lease to a file
 * (examples/check.cjs); the result has the exit status, the output and those leases.
 * @param {'vitest' | 'jest'} runner
 */
export async function runExamples(runner, args, env = {}) {
  const log = join(mkdtempSync(join(tmpdir(), 'pglease-node-')), 'leases.jsonl')
  const child = spawn(bin(runner), args, {
    cwd: root,
    env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0', PGLEASE_EXAMPLE_LOG: log, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  child.stdout.on('data', (chunk) => (output += chunk))
  child.stderr.on('data', (chunk) => (output += chunk))
  const status = await new Promise((resolve) => child.on('close', (code, signal) => resolve(code ?? signal)))
  const leases = existsSync(log)
    ? readFileSync(log, 'utf8').trim().split('\n').filter(Boolean).map((line) => JSON.parse(line))
    : []
  return { status, output: plain(output), leases }
}

/** jest over ES modules needs Node's VM modules. */
export const jestEsm = { NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --experimental-vm-modules`.trim() }

/** Every lease of the run is given back: none is open in GET /status, and (unless kept)
 * none is in GET /kept. */
export async function assertGivenBack(run, { kept = [] } = {}) {
  assert.ok(run.leases.length > 0, 'the examples logged no lease')
  const ids = new Set(run.leases.map((lease) => lease.id))
  const open = (await client.status()).leases.filter((lease) => ids.has(lease.id))
  assert.deepEqual(open, [], 'leases still open after the run')
  const keptNow = (await client.kept()).filter((k) => ids.has(k.id)).map((k) => k.id)
  assert.deepEqual(keptNow.sort(), [...kept].sort(), 'kept databases of the run')
}

/** The run's leases whose label ends with `suffix`. */
export function leasesLabelled(run, suffix) {
  return run.leases.filter((lease) => lease.label?.endsWith(suffix))
}

/**
 * An HTTP proxy in front of the real daemon that records each request's headers and, with
 * `refuseKeep`, answers a `?keep` release as a daemon without that parameter does (400
 * malformed_request, the text copied from one). Everything else is the daemon's own answer.
 */
export async function proxy({ refuseKeep = false } = {}) {
  const requests = []
  const server = createServer(async (request, response) => {
    requests.push({ method: request.method, url: request.url, headers: request.headers })
    if (refuseKeep && request.method === 'DELETE' && /[?&]keep=/.test(request.url)) {
      response.writeHead(400, { 'content-type': 'application/json' })
      response.end(JSON.stringify({
        error: {
          code: 'malformed_request',
          message: 'Failed to deserialize query string: unknown field `keep`, expected `reuse`',
        },
      }))
      return
    }
    const chunks = []
    for await (const chunk of request) chunks.push(chunk)
    const headers = { ...request.headers }
    delete headers.host
    delete headers['content-length']
    const upstream = await fetch(client.url + request.url, {
      method: request.method,
      headers,
      body: chunks.length ? Buffer.concat(chunks) : undefined,
    })
    response.writeHead(upstream.status, { 'content-type': upstream.headers.get('content-type') ?? 'text/plain' })
    response.end(Buffer.from(await upstream.arrayBuffer()))
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    close: () => new Promise((resolve) => server.close(resolve)),
  }
}
