// useFileDatabase(): the tests of this file share one database, in order.
import { afterAll, beforeAll, expect, test } from 'vitest'
import pg from 'pg'
import { useFileDatabase } from '@pglease/client'
import { record } from '../check.cjs'

const db = useFileDatabase({ template: 'app', hooks: { beforeAll, afterAll } })
const ids = new Set()

async function query(sql, params) {
  const client = new pg.Client(db.config)
  await client.connect()
  try {
    return (await client.query(sql, params)).rows
  } finally {
    await client.end()
  }
}

test('the first test writes an order', async () => {
  ids.add(db.id)
  record(db)
  expect(db.label).toBe('examples/vitest/file.test.js')
  await query('INSERT INTO orders (customer_id, total_cents) VALUES (2, 700)')
})

test('the next test sees it: the same database', async () => {
  ids.add(db.id)
  expect(ids.size).toBe(1)
  expect(await query('SELECT total_cents::int AS total FROM orders')).toEqual([{ total: 700 }])
})
