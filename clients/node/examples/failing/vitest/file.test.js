// Fails on purpose: a file's shared database, given back (kept with PGLEASE_KEEP_FAILED)
// although one of its tests failed.
import { afterAll, beforeAll, expect, test } from 'vitest'
import pg from 'pg'
import { useFileDatabase } from '@pglease/client'
import { record } from '../../check.cjs'

const db = useFileDatabase({ template: 'app', hooks: { beforeAll, afterAll } })

test('passes first', () => {
  record(db)
})

test('then breaks on purpose', async () => {
  const client = new pg.Client(db.config)
  await client.connect()
  await client.query('INSERT INTO orders (customer_id, total_cents) VALUES (2, 4343)')
  await client.end()
  expect('the file database').toBe('kept for a look')
})
