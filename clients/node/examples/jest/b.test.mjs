import { useDatabase } from '@pglease/client'
import { checkOwnDatabase } from '../check.cjs'

// jest's global beforeEach/afterEach.
const db = useDatabase({ template: 'app' })

describe('orders b', () => {
  for (let i = 0; i < 4; i++) {
    test('writes its own order ' + i, async () => {
      const label = await checkOwnDatabase(db)
      expect(label).toBe('examples/jest/b.test.mjs > orders b > writes its own order ' + i)
    })
  }
})
