import { afterEach, beforeEach, describe, expect, test } from 'vitest'
import { useDatabase } from '@pglease/client'
import { checkOwnDatabase } from '../check.cjs'

const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

describe('orders b', () => {
  for (let i = 0; i < 4; i++) {
    test('writes its own order ' + i, async () => {
      const label = await checkOwnDatabase(db)
      expect(label).toBe('examples/vitest/b.test.js > orders b > writes its own order ' + i)
    })
  }
})
