// useDatabase() next to test.extend fixtures: vitest reads every hook's first parameter as a
// fixture pattern once a file has fixtures, so the helper's hooks must declare none.
import { afterEach, beforeEach, expect, test as base } from 'vitest'
import pg from 'pg'
import { useDatabase } from '@pglease/client'
import { record } from '../check.cjs'

const test = base.extend({
  customerName: async ({}, use) => use('carol'),
})
const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

for (let i = 0; i < 2; i++) {
  test('a fixture and a database ' + i, async ({ customerName }) => {
    const client = new pg.Client(db.url)
    await client.connect()
    try {
      await client.query('INSERT INTO customers (name) VALUES ($1)', [customerName])
      const names = await client.query('SELECT name FROM customers ORDER BY id')
      expect(names.rows.map((row) => row.name)).toEqual(['alice', 'bob', 'carol'])
    } finally {
      await client.end()
    }
    record(db)
  })
}
