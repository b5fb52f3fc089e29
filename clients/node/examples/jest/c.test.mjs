import { useDatabase } from '@pglease/client'
import { checkOwnDatabase } from '../check.cjs'

// jest's global beforeEach/afterEach.
const db = useDatabase({ template: 'app' })

describe('orders c', () => {
  for (let i = 0; i < 4; i++) {
    test('writes its own order ' + i, async () => {
      const label = await checkOwnDatabase(db)
      expect(label).toBe('examples/jest/c.test.mjs > orders c > writes its own order ' + i)
    })
  }
})
