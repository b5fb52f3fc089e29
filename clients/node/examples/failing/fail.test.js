import { afterEach, beforeEach, expect, test } from 'vitest'
import pg from 'pg'
import { useDatabase } from '../../index.js'

const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

test('breaks on purpose', async () => {
  const client = new pg.Client(db.config)
  await client.connect()
  await client.query('INSERT INTO orders (customer_id, total_cents) VALUES (2, 4242)')
  await client.end()
  expect('the database').toBe('kept for a look')
})
