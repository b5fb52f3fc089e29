import { useDatabase } from '../../index.js'
import { checkIsolated } from '../shared.js'

// jest's globals: beforeEach, afterEach.
const db = useDatabase({ template: 'app' })

for (let i = 0; i < 4; i++) {
  test('jest isolated a ' + i, async () => {
    const label = await checkIsolated(db, 20086 + i, (ok, why) => {
      if (!ok) throw new Error(why)
    })
    expect(label).toContain('jest isolated a ' + i)
  })
}
