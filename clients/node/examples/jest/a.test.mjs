import { useDatabase } from '@pglease/client'
import { checkOwnDatabase } from '../check.cjs'

// jest's global beforeEach/afterEach.
const db = useDatabase({ template: 'app' })

describe('orders a', () => {
  for (let i = 0; i < 4; i++) {
    test('writes its own order ' + i, async () => {
      const label = await checkOwnDatabase(db)
      expect(label).toBe('examples/jest/a.test.mjs > orders a > writes its own order ' + i)
    })
  }
})
