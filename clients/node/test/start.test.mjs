// startPglease() and the global setup module: a daemon started from the binary (PGLEASE_BIN,
// which tests/it/helpers.rs points at the binary under test), a running one used as it is,
// and the errors when there is no binary or the daemon cannot start.
import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { after, before, test } from 'node:test'
import pg from 'pg'
import { PgleaseClient, startPglease } from '../index.js'
import { client, requireDaemon } from './support.mjs'

const require = createRequire(import.meta.url)
const { splitArgs } = require('../lib/start.cjs')
const globalSetup = require('@pglease/client/global-setup')
const globalTeardown = require('@pglease/client/global-teardown')

// The daemon the suite runs against; each test that wants none unsets it and puts it back.
const suiteUrl = process.env.PGLEASE_URL
before(requireDaemon)
after(() => (process.env.PGLEASE_URL = suiteUrl))

function withoutUrl() {
  delete process.env.PGLEASE_URL
}

function isRunning(pid) {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

test('without PGLEASE_URL it starts pglease serve on a free port, ready to lease, and stop() stops it', async () => {
  assert.ok(process.env.PGLEASE_BIN, 'PGLEASE_BIN names the binary to start (tests/it/helpers.rs sets it)')
  withoutUrl()
  const daemon = await startPglease({ serveArgs: ['--min-ready', '1'] })
  let stopped = false
  try {
    assert.equal(daemon.started, true)
    assert.match(daemon.url, /^http:\/\/127\.0\.0\.1:\d+$/)
    assert.notEqual(daemon.url, suiteUrl)
    assert.equal(process.env.PGLEASE_URL, daemon.url, 'the test workers find it in PGLEASE_URL')
    assert.ok(isRunning(daemon.pid))
    assert.match(readFileSync(daemon.logFile, 'utf8'), /listening/)

    // Its embedded default template, leased as a test would (PGLEASE_URL, PGLEASE_TOKEN).
    const started = new PgleaseClient()
    const lease = await started.lease({ label: 'start test' })
    const connection = new pg.Client(lease.config)
    await connection.connect()
    try {
      const { rows } = await connection.query('SELECT current_database() AS name')
      assert.equal(rows[0].name, lease.database)
    } finally {
      await connection.end()
    }
    await started.release(lease.id)

    await daemon.stop()
    stopped = true
    assert.equal(isRunning(daemon.pid), false, 'stop() waits until the daemon has exited')
    assert.equal(process.env.PGLEASE_URL, undefined, 'stop() puts PGLEASE_URL back')
    await assert.rejects(fetch(`${daemon.url}/healthz`))
  } finally {
    if (!stopped) await daemon.stop()
  }
})

test('a daemon answering at PGLEASE_URL is used, and stop() leaves it running', async () => {
  process.env.PGLEASE_URL = suiteUrl
  const daemon = await startPglease({ binary: '/nonexistent/pglease' })
  assert.equal(daemon.started, false)
  assert.equal(daemon.url, client.url)
  assert.equal(daemon.pid, undefined)
  await daemon.stop()
  assert.equal(process.env.PGLEASE_URL, suiteUrl)
  assert.ok(Array.isArray((await client.status()).leases), 'the running daemon still answers')
})

test('the global setup module uses a running daemon and its teardown leaves it running', async () => {
  process.env.PGLEASE_URL = suiteUrl
  const teardown = await globalSetup()
  assert.equal(teardown, globalTeardown, "vitest runs what the setup returns; jest's globalTeardown is the same")
  assert.equal(process.env.PGLEASE_URL, client.url)
  await globalTeardown()
  assert.equal(process.env.PGLEASE_URL, suiteUrl)
  assert.ok(Array.isArray((await client.status()).leases))
})

test('a missing binary is an error naming it, or PGLEASE_BIN when none is found', async () => {
  withoutUrl()
  await assert.rejects(startPglease({ binary: '/nonexistent/pglease' }), /the pglease binary \/nonexistent\/pglease does not exist/)

  const saved = { bin: process.env.PGLEASE_BIN, path: process.env.PATH }
  process.env.PGLEASE_BIN = '/nonexistent/pglease'
  await assert.rejects(startPglease(), /PGLEASE_BIN=\/nonexistent\/pglease does not exist/)
  delete process.env.PGLEASE_BIN
  process.env.PATH = '/nonexistent'
  try {
    await assert.rejects(startPglease(), (error) => {
      assert.match(error.message, /no pglease binary/)
      assert.match(error.message, /set PGLEASE_BIN to a pglease binary/)
      return true
    })
  } finally {
    process.env.PGLEASE_BIN = saved.bin
    process.env.PATH = saved.path
  }
})

test('a daemon that exits before it is ready is an error naming its log', async () => {
  withoutUrl()
  await assert.rejects(startPglease({ serveArgs: ['--no-such-flag'] }), (error) => {
    assert.match(error.message, /serve --listen 127\.0\.0\.1:\d+ --no-such-flag` exited \(2\) before it was ready/)
    const log = error.message.match(/its log: (\S+)/)?.[1]
    assert.ok(log && existsSync(log), `the log file is named: ${error.message}`)
    assert.match(readFileSync(log, 'utf8'), /--no-such-flag/)
    return true
  })
})

test('a template that cannot be built is an error at once, with the reason, not a wait', async () => {
  withoutUrl()
  const started = Date.now()
  await assert.rejects(
    startPglease({ serveArgs: ['--template', 'broken=migrations:/nonexistent/migrations'] }),
    (error) => {
      assert.match(error.message, /cannot build a template: broken: .*nonexistent/)
      assert.match(error.message, /its log: \S+/)
      return true
    },
  )
  // Not the 180 s a daemon gets to become ready.
  assert.ok(Date.now() - started < 90_000, `took ${Date.now() - started} ms`)
})

test('with PGLEASE_START=0 a URL that does not answer is an error, not a start', async () => {
  process.env.PGLEASE_START = '0'
  try {
    await assert.rejects(startPglease({ url: 'http://127.0.0.1:9' }), /no pglease daemon answers at http:\/\/127\.0\.0\.1:9, and PGLEASE_START=0/)
  } finally {
    delete process.env.PGLEASE_START
  }
})

test('PGLEASE_SERVE_ARGS is split like a shell splits it', () => {
  assert.deepEqual(splitArgs(''), [])
  assert.deepEqual(splitArgs(' --template  app=migrations:db/migrations --min-ready 2 '), [
    '--template', 'app=migrations:db/migrations', '--min-ready', '2',
  ])
  assert.deepEqual(splitArgs(`--template "app=migrations:my dir" --config='a b.toml'`), [
    '--template', 'app=migrations:my dir', '--config=a b.toml',
  ])
})
