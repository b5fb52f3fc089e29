// The shape of a real Go service's test suite on IntegreSQL, driven through the npm client
// (@devoxa/integresql-client): many packages, each with a template of its own (its own
// hash), run a few at a time; every test takes a test database, uses it and never gives it
// back (integresql-client-go's usual flow). Against pglease with default options this must
// finish without a single 504: never-returned databases past the connection budget are
// recreated oldest first.
// Usage: PGLEASE_INTEGRESQL_URL=http://127.0.0.1:5000/ node suite.mjs [packages] [tests]
// Prints one JSON line of counts; exits non-zero on any failure.
import { createHash } from 'node:crypto'
import { IntegreSQLClient } from '@devoxa/integresql-client'
import { withDb } from './db.mjs'

const url = process.env.PGLEASE_INTEGRESQL_URL
if (!url) throw new Error('set PGLEASE_INTEGRESQL_URL, e.g. http://127.0.0.1:5000/')
const packages = Number(process.argv[2] ?? 12)
const testsPerPackage = Number(process.argv[3] ?? 25)
// `go test ./...` runs a few packages at once, and each package's tests in parallel.
const packagesAtOnce = 4
const testsAtOnce = 8
const client = new IntegreSQLClient({ url })

/** Runs `work` on each item, at most `limit` at once. */
async function pool(items, limit, work) {
  const results = []
  let next = 0
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) {
        const item = items[next++]
        results.push(await work(item))
      }
    }),
  )
  return results
}

await client.api.discardAllTemplates()
const started = Date.now()
let migrations = 0
const failures = []
const runPackage = async (index) => {
  const hash = createHash('md5').update(`package-${index}`).digest('hex')
  await client.initializeTemplate(hash, async (config) => {
    migrations++
    await withDb(config, (db) =>
      db.query(`CREATE TABLE users (id serial PRIMARY KEY, name text NOT NULL);
                INSERT INTO users (name) VALUES ('fixture of package ${index}');`),
    )
  })
  const tests = Array.from({ length: testsPerPackage }, (_, i) => i)
  return pool(tests, testsAtOnce, async (i) => {
    try {
      // Never given back, as the Go client does.
      const config = await client.getTestDatabase(hash)
      const rows = await withDb(config, async (db) => {
        await db.query('INSERT INTO users (name) VALUES ($1)', [`test ${i}`])
        return (await db.query('SELECT count(*)::int AS n FROM users')).rows[0].n
      })
      if (rows !== 2) throw new Error(`package ${index} test ${i} saw ${rows} rows`)
      return config.database
    } catch (err) {
      failures.push(`package ${index} test ${i}: ${err.responseStatus ?? ''} ${err.message}`)
      return null
    }
  })
}
const databases = (await pool(Array.from({ length: packages }, (_, i) => i), packagesAtOnce, runPackage)).flat()
const elapsed = Date.now() - started
await client.api.discardAllTemplates()
const summary = {
  client: '@devoxa/integresql-client',
  packages,
  tests: databases.length,
  passed: databases.filter((d) => d !== null).length,
  failed: failures.length,
  migrations,
  elapsed_ms: elapsed,
}
console.log(JSON.stringify(summary))
if (failures.length > 0) {
  console.error(failures.slice(0, 20).join('\n'))
  process.exit(1)
}
