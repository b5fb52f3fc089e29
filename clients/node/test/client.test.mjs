// PgleaseClient against the real daemon: what a lease opens, the options reaching the daemon,
// release and renew, the errors, and where the URL and token come from.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { createServer } from 'node:net'
import { before, test } from 'node:test'
import pg from 'pg'
import { PgleaseClient, PgleaseError, PgleaseUnavailableError } from '../index.js'
import { client, proxy, requireDaemon } from './support.mjs'

before(requireDaemon)

async function query(config, sql) {
  const connection = new pg.Client(config)
  await connection.connect()
  try {
    return (await connection.query(sql)).rows
  } finally {
    await connection.end()
  }
}

test('a lease opens with config and with url, is listed with its label, and release drops it', async () => {
  const lease = await client.lease({ template: 'app', label: 'client test: lease' })
  assert.equal(lease.template, 'app')
  assert.equal(lease.label, 'client test: lease')
  assert.deepEqual(lease.config, {
    host: lease.host, port: lease.port, user: lease.user, password: lease.password, database: lease.database,
  })
  assert.deepEqual(await query(lease.config, 'SELECT name FROM customers ORDER BY id'), [{ name: 'alice' }, { name: 'bob' }])
  assert.deepEqual(await query({ connectionString: lease.url }, 'SELECT count(*)::int AS n FROM orders'), [{ n: 0 }])
  const listed = (await client.status()).leases.find((l) => l.id === lease.id)
  assert.equal(listed?.label, 'client test: lease')

  await client.release(lease.id)
  assert.equal((await client.status()).leases.find((l) => l.id === lease.id), undefined)
  await assert.rejects(client.release(lease.id), (error) => {
    assert.ok(error instanceof PgleaseError)
    assert.equal(error.status, 404)
    assert.equal(error.code, 'lease_not_found')
    assert.match(error.message, new RegExp(`404 lease_not_found to DELETE /leases/${lease.id}`))
    return true
  })
})

test('ttlSecs, maxConnections and postgresVersion reach the daemon; renew extends a lease', async () => {
  const { postgres_version: version } = await (await fetch(`${client.url}/templates/app`, {
    headers: client.token ? { authorization: `Bearer ${client.token}` } : {},
  })).json()
  const major = parseInt(version, 10)
  const lease = await client.lease({ template: 'app', ttlSecs: 120, maxConnections: 3, postgresVersion: major, waitMs: 30_000 })
  try {
    const secondsLeft = (Date.parse(lease.expires_at) - Date.now()) / 1000
    assert.ok(secondsLeft > 90 && secondsLeft <= 121, `expires in ${secondsLeft} s, asked 120`)
    const [role] = await query(lease.config,
      "SELECT rolconnlimit, current_setting('server_version_num')::int / 10000 AS major FROM pg_roles WHERE rolname = current_user")
    assert.deepEqual(role, { rolconnlimit: 3, major })

    const renewed = await client.renew(lease.id, 900)
    assert.equal(renewed.id, lease.id)
    assert.ok(Date.parse(renewed.expires_at) - Date.now() > 800_000, `renewed to ${renewed.expires_at}`)
  } finally {
    await client.release(lease.id)
  }
})

test('a label is cleaned before it is sent: no control characters, its last 256 characters', async () => {
  const label = 'x'.repeat(300) + '\u0000tab\tline\nend ✓'
  const lease = await client.lease({ template: 'app', label })
  try {
    const listed = (await client.status()).leases.find((l) => l.id === lease.id)
    assert.equal([...listed.label].length, 256)
    assert.ok(listed.label.endsWith('xtablineend ✓'), listed.label)
  } finally {
    await client.release(lease.id)
  }
})

test('an unknown template is a PgleaseError with the daemon\'s code and message', async () => {
  await assert.rejects(client.lease({ template: 'no-such-template' }), (error) => {
    assert.ok(error instanceof PgleaseError)
    assert.equal(error.status, 404)
    assert.equal(error.code, 'unknown_template')
    assert.match(error.message, /^pglease answered 404 unknown_template to POST \/lease: .*no-such-template/)
    return true
  })
})

test('a value the daemon refuses is a PgleaseError too', async () => {
  await assert.rejects(client.lease({ template: 'app', postgresVersion: 99 }), (error) => {
    assert.ok(error instanceof PgleaseError)
    assert.equal(error.status, 422)
    assert.equal(error.code, 'invalid_value')
    assert.match(error.detail, /postgres_version/)
    return true
  })
})

test('no daemon answering is a PgleaseUnavailableError naming the URL and how to start one', async () => {
  // A port that was just free: nothing listens there.
  const server = createServer().listen(0, '127.0.0.1')
  await once(server, 'listening')
  const { port } = server.address()
  await new Promise((resolve) => server.close(resolve))
  const none = new PgleaseClient({ url: `http://127.0.0.1:${port}/` })
  await assert.rejects(none.lease({ template: 'app' }), (error) => {
    assert.ok(error instanceof PgleaseUnavailableError)
    assert.equal(error.url, `http://127.0.0.1:${port}`)
    assert.ok(
      error.message.startsWith(`no pglease daemon answers at http://127.0.0.1:${port} (ECONNREFUSED): start one with \`pglease serve`),
      error.message,
    )
    assert.match(error.message, /PGLEASE_URL/)
    return true
  })
})

test('url and token come from the options, else PGLEASE_URL and PGLEASE_TOKEN; the token goes as a bearer', async () => {
  const saved = { url: process.env.PGLEASE_URL, token: process.env.PGLEASE_TOKEN }
  // The daemon may require a token (CI's does not); the one it knows is the one to send.
  const token = saved.token ?? 'token-from-env'
  const recorder = await proxy()
  try {
    process.env.PGLEASE_URL = recorder.url
    process.env.PGLEASE_TOKEN = token
    const fromEnv = new PgleaseClient()
    assert.equal(fromEnv.url, recorder.url)
    await fromEnv.status()
    assert.equal(recorder.requests.at(-1).headers.authorization, `Bearer ${token}`)
    assert.ok(!JSON.stringify(fromEnv).includes(token), 'the token is not shown when the client is printed')

    delete process.env.PGLEASE_URL
    delete process.env.PGLEASE_TOKEN
    assert.equal(new PgleaseClient().url, 'http://127.0.0.1:5480')
    const fromOptions = new PgleaseClient({ url: recorder.url + '/', token })
    assert.equal(fromOptions.url, recorder.url)
    await fromOptions.status()
    assert.equal(recorder.requests.at(-1).headers.authorization, `Bearer ${token}`)
    await new PgleaseClient({ url: recorder.url }).status().catch(() => {})
    assert.equal(recorder.requests.at(-1).headers.authorization, undefined, 'no token, no header')
  } finally {
    for (const [key, value] of [['PGLEASE_URL', saved.url], ['PGLEASE_TOKEN', saved.token]]) {
      if (value === undefined) delete process.env[key]
      else process.env[key] = value
    }
    await recorder.close()
  }
})
