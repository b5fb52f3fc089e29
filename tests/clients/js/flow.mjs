// Drives pglease's IntegreSQL API with the IntegreSQL client library from npm
// (@devoxa/integresql-client), as a test suite would: initialize → migrate → finalize,
// 20 test databases in parallel, unlock (reuse) and recreate, discard, reset.
// Usage: PGLEASE_INTEGRESQL_URL=http://127.0.0.1:5000/ node flow.mjs
// Prints one JSON line of counts; exits non-zero on any failure.
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { IntegreSQLClient, IntegreSQLApiClientError } from '@devoxa/integresql-client'
import { withDb } from './db.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const url = process.env.PGLEASE_INTEGRESQL_URL
if (!url) throw new Error('set PGLEASE_INTEGRESQL_URL, e.g. http://127.0.0.1:5000/')
const client = new IntegreSQLClient({ url })

function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`)
}

// Giving a database back right after disconnecting can race the server noticing the
// disconnect: pglease answers 423 while a session is still there.
async function whenDisconnected(call) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await call()
    } catch (err) {
      if (!(err instanceof IntegreSQLApiClientError) || err.responseStatus !== 423 || attempt > 100) throw err
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  }
}

// The client hashes files by glob patterns relative to the working directory.
process.chdir(here)
const hash = await client.hashFiles(['migrations/*.sql'])
await client.api.discardAllTemplates()

// Two suites start at once: only one migrates.
let migrations = 0
const migrate = async (config) => {
  migrations++
  await withDb(config, (db) => db.query(readFileSync(join(here, 'migrations', '001_items.sql'), 'utf8')))
}
await Promise.all([client.initializeTemplate(hash, migrate), client.initializeTemplate(hash, migrate)])
check(migrations === 1, `migrated ${migrations} times`)

// 20 tests in parallel, each in its own database.
const results = await Promise.all(
  Array.from({ length: 20 }, async (_, i) => {
    const test = await client.api.getTestDatabase(hash)
    const got = performance.now()
    const config = test.database.config
    const writes = i % 2 === 1
    const count = await withDb(config, async (db) => {
      if (writes) await db.query('INSERT INTO items (label) VALUES ($1)', [`test ${i}`])
      const { rows } = await db.query('SELECT count(*)::int AS n FROM items')
      return rows[0].n
    })
    check(count === (writes ? 2 : 1), `test ${i} saw ${count} rows: databases are not isolated`)
    const givenBack = performance.now()
    if (writes) {
      await whenDisconnected(() => client.api.recreateTestDatabase(hash, test.id))
    } else {
      await whenDisconnected(() => client.api.reuseTestDatabase(hash, test.id))
    }
    return { id: test.id, database: config.database, writes, got, givenBack }
  }),
)
// An id names one database at a time: one given back unchanged may come back to a later
// test under its id, and a recreated one's id to its replacement (as from IntegreSQL) —
// never to a test while another still holds it (from its answer to its giving back).
for (const a of results) {
  for (const b of results) {
    if (a === b || a.id !== b.id) continue
    check(a.givenBack <= b.got || b.givenBack <= a.got, `id ${a.id} held by two tests at once`)
  }
}

// After unlock and recreate, no test sees another's rows.
for (let i = 0; i < 10; i++) {
  const config = await client.getTestDatabase(hash)
  const n = await withDb(config, async (db) => (await db.query('SELECT count(*)::int AS n FROM items')).rows[0].n)
  check(n === 1, `a recycled database kept ${n} rows`)
}

// Discard: getters are told the template is gone.
await client.api.discardTemplate(hash)
let status = 0
try {
  await client.api.getTestDatabase(hash)
} catch (err) {
  status = err.responseStatus
}
check(status === 410, `getTestDatabase after discard answered ${status}, not 410`)
await client.api.discardAllTemplates()

console.log(
  JSON.stringify({
    client: '@devoxa/integresql-client',
    hash,
    migrations,
    parallel: results.length,
    unlocked: results.filter((r) => !r.writes).length,
    recreated: results.filter((r) => r.writes).length,
    after_discard: status,
  }),
)
