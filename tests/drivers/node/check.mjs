// Connects with each Node driver (pg, postgres.js). Two modes:
//
// - A lease (tests/it/drivers.rs): the lease answer comes as JSON in PGLEASE_LEASE, and each
//   driver connects with its `url` as it is (docs/using-from-tests.md).
// - The PostgreSQL front (tests/it/front_drivers.rs): PGLEASE_FRONT_URL is
//   `postgresql://<user>@<host>:<port>/<template>`, given to each driver as it is. Each
//   driver opens two connections, one after the other, and checks what docs/front.md
//   promises: a clone of its own, the lease's role, a table round trip, a query with a
//   parameter. It prints `ok <driver> <first database> <second database>`.
//
// Arguments name the drivers to run (all when none). Prints `ok <driver> ...` or
// `FAIL <driver>: <error>` per driver; exits 1 if any failed.
import pg from 'pg'
import postgres from 'postgres'

const frontUrl = process.env.PGLEASE_FRONT_URL

// --- a lease ---------------------------------------------------------------------------

const query = 'SELECT current_user AS u, current_database() AS d'

function leaseChecks () {
  const lease = JSON.parse(process.env.PGLEASE_LEASE)

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

  const checked = (connect) => async () => {
    const got = await connect()
    if (got[0] !== lease.user || got[1] !== lease.database) {
      throw new Error(`connected as ${got}, not ${lease.user}/${lease.database}`)
    }
    return ''
  }
  return { pg: checked(nodePostgres), 'postgres.js': checked(postgresJs) }
}

// --- the front -------------------------------------------------------------------------

// The front's checks on one connection, whose `run(kind, ...)` answers each step in the
// driver's own way. Returns the database.
async function probe (run) {
  const { u: user, d: database } = (await run('who'))[0]
  const url = new URL(frontUrl)
  if (database === url.pathname.slice(1)) {
    throw new Error(`connected to the template's name ${database}, not a clone`)
  }
  // The front logs in as the lease's role, which pglease names after its database; the
  // user the client named is only the front's.
  if (user !== database || user === url.username) {
    throw new Error(`current_user is ${user}: not the lease's role of ${database}`)
  }
  // A fresh clone: the table is not there yet (a reused connection would fail here).
  await run('create')
  await run('insert', 1, 'one')
  const rows = await run('select', 1)
  if (rows.length !== 1 || rows[0].name !== 'one') {
    throw new Error(`round trip: ${JSON.stringify(rows)}`)
  }
  const sum = await run('add', 41)
  if (Number(sum[0].n) !== 42) throw new Error(`a query with a parameter: ${JSON.stringify(sum)}`)
  return database
}

// Runs `probe` on two connections, one after the other; `session(probe)` opens one, runs
// it, and closes it. The second must get another database.
async function twoConnections (session) {
  const first = await session(probe)
  const second = await session(probe)
  if (first === second) throw new Error(`both connections got ${first}`)
  return `${first} ${second}`
}

// The statements, with $n parameters (node-postgres sends them with the extended protocol).
const statements = {
  who: 'SELECT current_user AS u, current_database() AS d',
  create: 'CREATE TABLE front_check (id int PRIMARY KEY, name text)',
  insert: 'INSERT INTO front_check VALUES ($1, $2)',
  select: 'SELECT name FROM front_check WHERE id = $1',
  add: 'SELECT $1::int + 1 AS n'
}

function frontChecks () {
  async function nodePostgres (check) {
    const client = new pg.Client({ connectionString: frontUrl })
    await client.connect()
    try {
      return await check(async (kind, ...params) => (await client.query(statements[kind], params)).rows)
    } finally {
      await client.end()
    }
  }

  async function postgresJs (check) {
    // Default options. A pool of its own may open several connections, each a lease of its
    // own at the front; a reserved connection keeps the checks on one.
    const sql = postgres(frontUrl)
    try {
      const conn = await sql.reserve()
      try {
        // Tagged templates: postgres.js prepares them (named statements, extended protocol).
        return await check(async (kind, ...params) => {
          switch (kind) {
            case 'who': return await conn`SELECT current_user AS u, current_database() AS d`
            case 'create': return await conn`CREATE TABLE front_check (id int PRIMARY KEY, name text)`
            case 'insert': return await conn`INSERT INTO front_check VALUES (${params[0]}, ${params[1]})`
            case 'select': return await conn`SELECT name FROM front_check WHERE id = ${params[0]}`
            case 'add': return await conn`SELECT ${params[0]}::int + 1 AS n`
          }
          throw new Error(`no statement ${kind}`)
        })
      } finally {
        conn.release()
      }
    } finally {
      await sql.end()
    }
  }

  return {
    pg: () => twoConnections(nodePostgres),
    'postgres.js': () => twoConnections(postgresJs)
  }
}

const checks = frontUrl ? frontChecks() : leaseChecks()
const names = process.argv.length > 2 ? process.argv.slice(2) : Object.keys(checks)
let failed = false
for (const name of names) {
  try {
    if (!checks[name]) throw new Error(`no driver ${name}`)
    console.log(`ok ${name} ${await checks[name]()}`.trimEnd())
  } catch (error) {
    failed = true
    console.log(`FAIL ${name}: ${error.message}`)
  }
}
process.exit(failed ? 1 : 0)
