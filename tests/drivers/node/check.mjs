// Connects to a lease with each Node driver, the `url` as it is (docs/using-from-tests.md).
// The lease answer comes as JSON in PGLEASE_LEASE. Prints `ok <driver>` or
// `FAIL <driver>: <error>` per driver; exits 1 if any failed.
import pg from 'pg'
import postgres from 'postgres'

const lease = JSON.parse(process.env.PGLEASE_LEASE)
const query = 'SELECT current_user AS u, current_database() AS d'

async function nodePostgres () {
  const client = new pg.Client({ connectionString: lease.url })
  await client.connect()
  try {
    const { rows } = await client.query(query)
    return [rows[0].u, rows[0].d]
  } finally {
    await client.end()
  }
}

async function postgresJs () {
  const sql = postgres(lease.url, { max: 1 })
  try {
    const rows = await sql.unsafe(query)
    return [rows[0].u, rows[0].d]
  } finally {
    await sql.end()
  }
}

let failed = false
for (const [name, check] of [['pg', nodePostgres], ['postgres.js', postgresJs]]) {
  try {
    const got = await check()
    if (got[0] !== lease.user || got[1] !== lease.database) {
      throw new Error(`connected as ${got}, not ${lease.user}/${lease.database}`)
    }
    console.log(`ok ${name}`)
  } catch (error) {
    failed = true
    console.log(`FAIL ${name}: ${error.message}`)
  }
}
process.exit(failed ? 1 : 0)
