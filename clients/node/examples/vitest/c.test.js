import { afterEach, beforeEach, expect, test } from 'vitest'
import { useDatabase } from '../../index.js'
import { checkIsolated } from '../shared.js'

const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

for (let i = 0; i < 4; i++) {
  test('isolated c ' + i, async () => {
    const label = await checkIsolated(db, 2651 + i, (ok, why) => expect(ok, why).toBe(true))
    expect(label).toContain('isolated c ' + i)
  })
}
