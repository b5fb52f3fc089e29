// A suite that loads a dump into its template the way allaboutapps' go-starter does
// (its test helper runs `cat <dump> | psql <template database>`): psql gets the user,
// password, host and port from the PG* variables of the whole run, set once, as they are
// for IntegreSQL's shared user — not from the initialize answer. Nothing here is
// pglease-specific: the same script runs against IntegreSQL.
// Usage: PGLEASE_INTEGRESQL_URL=http://127.0.0.1:5000/ PGHOST=… PGPORT=… PGUSER=… PGPASSWORD=… node dump.mjs
// Prints one JSON line; exits non-zero on any failure.
import { spawnSync } from 'node:child_process'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { IntegreSQLClient } from '@devoxa/integresql-client'
import { withDb } from './db.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const url = process.env.PGLEASE_INTEGRESQL_URL
if (!url) throw new Error('set PGLEASE_INTEGRESQL_URL, e.g. http://127.0.0.1:5000/')
for (const name of ['PGHOST', 'PGPORT', 'PGUSER', 'PGPASSWORD']) {
  if (!process.env[name]) throw new Error(`set ${name}: the run's PG* variables`)
}
const client = new IntegreSQLClient({ url })
const dump = join(here, 'testdata', 'dump.sql')

function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`)
}

// go-starter's ApplyDump: the database name from the template's own connection, then psql.
async function applyDump(config) {
  const target = await withDb(config, async (db) => (await db.query('SELECT current_database() AS name')).rows[0].name)
  const psql = spawnSync('bash', ['-c', `cat ${JSON.stringify(dump)} | psql ${JSON.stringify(target)}`], {
    encoding: 'utf8',
  })
  // psql without ON_ERROR_STOP exits 0 after a failed statement: read what it said too.
  check(psql.status === 0 && !/ERROR|FATAL/.test(psql.stderr), `psql ${target}: status ${psql.status}: ${psql.stderr}`)
}

process.chdir(here)
const hash = await client.hashFiles(['testdata/dump.sql'])
await client.api.discardAllTemplates()

// Two packages of the suite start at once: one loads the dump, the other waits for it.
let loads = 0
const setup = async (config) => {
  loads++
  await applyDump(config)
}
await Promise.all([client.initializeTemplate(hash, setup), client.initializeTemplate(hash, setup)])
check(loads === 1, `loaded the dump ${loads} times`)

// Each test's database holds the dump, and a test may change what the dump made.
const tests = await Promise.all(
  Array.from({ length: 5 }, async (_, i) => {
    const config = await client.getTestDatabase(hash)
    return withDb(config, async (db) => {
      const { rows } = await db.query('SELECT count(*)::int AS n, max(id) AS last FROM users')
      check(rows[0].n === 2 && rows[0].last === 2, `test ${i} saw ${JSON.stringify(rows[0])}`)
      await db.query(`INSERT INTO users (username) VALUES ('test ${i}')`)
      await db.query('ALTER TABLE users ADD COLUMN email text')
      await db.query('TRUNCATE users')
      return 1
    })
  })
)
console.log(JSON.stringify({ loads, tests: tests.length }))
