// Fails on purpose (test/ runs it in a subprocess): the failed test's lease must still be
// given back, and with PGLEASE_KEEP_FAILED its database kept as the test left it.
import { afterEach, beforeEach, expect, test } from 'vitest'
import pg from 'pg'
import { useDatabase } from '@pglease/client'
import { record } from '../../check.cjs'

const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

test('breaks on purpose', async () => {
  record(db)
  const client = new pg.Client(db.config)
  await client.connect()
  await client.query('INSERT INTO orders (customer_id, total_cents) VALUES (2, 4242)')
  await client.end()
  expect('the database').toBe('kept for a look')
})

test('passes next to it', () => {
  record(db)
})
