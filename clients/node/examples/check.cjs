'use strict'
// What every example test checks on its database, the same under vitest and jest: it opens
// with db.config, holds the template's two customers and no order but the one this test
// writes (another test's order means the database was handed out twice), and its lease is
// open in GET /status under the test's name. It also logs the lease to PGLEASE_EXAMPLE_LOG,
// from which test/ checks afterwards that every lease was given back.

const assert = require('node:assert/strict')
const { appendFileSync } = require('node:fs')
const { randomInt } = require('node:crypto')
const pg = require('pg')
const { PgleaseClient } = require('@pglease/client')

async function checkOwnDatabase(db) {
  const client = new pg.Client(db.config)
  await client.connect()
  let orders
  try {
    const customers = await client.query('SELECT name FROM customers ORDER BY id')
    assert.deepEqual(customers.rows.map((row) => row.name), ['alice', 'bob'])
    const marker = randomInt(1, 2 ** 31)
    await client.query('INSERT INTO orders (customer_id, total_cents) VALUES (1, $1)', [marker])
    // Long enough for a test sharing this database to write its own order in between.
    await new Promise((resolve) => setTimeout(resolve, 50))
    orders = (await client.query('SELECT total_cents FROM orders')).rows.map((row) => Number(row.total_cents))
    assert.deepEqual(orders, [marker], `orders of another test in ${db.database}: handed out twice`)
  } finally {
    await client.end()
  }
  const mine = (await new PgleaseClient().status()).leases.find((lease) => lease.id === db.id)
  assert.ok(mine, `lease ${db.id} is not open in GET /status while its test runs`)
  record(db)
  return mine.label
}

/** Appends the lease to PGLEASE_EXAMPLE_LOG (one JSON line; appends of a line do not interleave). */
function record(db) {
  if (!process.env.PGLEASE_EXAMPLE_LOG) return
  const line = JSON.stringify({ id: db.id, database: db.database, label: db.label })
  appendFileSync(process.env.PGLEASE_EXAMPLE_LOG, line + '\n')
}

module.exports = { checkOwnDatabase, record }
