import { useDatabase } from '../../index.js'
import { checkIsolated } from '../shared.js'

// jest's globals: beforeEach, afterEach.
const db = useDatabase({ template: 'app' })

for (let i = 0; i < 4; i++) {
  test('jest isolated b ' + i, async () => {
    const label = await checkIsolated(db, 14733 + i, (ok, why) => {
      if (!ok) throw new Error(why)
    })
    expect(label).toContain('jest isolated b ' + i)
  })
}
