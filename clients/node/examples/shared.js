// What every example test checks on its database: the template's two customers, no order of
// another test, and its own label in the daemon's /status.
import pg from 'pg'

export async function checkIsolated(db, marker, expectName) {
  const client = new pg.Client(db.config)
  await client.connect()
  try {
    const customers = await client.query('SELECT count(*)::int AS n FROM customers')
    expectName(customers.rows[0].n === 2, `customers: ${customers.rows[0].n}`)
    await client.query('INSERT INTO orders (customer_id, total_cents) VALUES (1, $1)', [marker])
    const orders = await client.query('SELECT total_cents FROM orders')
    expectName(
      orders.rows.length === 1 && Number(orders.rows[0].total_cents) === marker,
      `another test's order in this database: ${JSON.stringify(orders.rows)}`,
    )
  } finally {
    await client.end()
  }
  const status = await (await fetch(`${process.env.PGLEASE_URL.replace(/\/+$/, '')}/status`)).json()
  const mine = status.leases.find((l) => l.id === db.id)
  expectName(mine !== undefined, 'the lease is open while its test runs')
  return mine.label
}
