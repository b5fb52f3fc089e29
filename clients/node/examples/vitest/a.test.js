import { afterEach, beforeEach, expect, test } from 'vitest'
import { useDatabase } from '../../index.js'
import { checkIsolated } from '../shared.js'

const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

for (let i = 0; i < 4; i++) {
  test('isolated a ' + i, async () => {
    const label = await checkIsolated(db, 8579 + i, (ok, why) => expect(ok, why).toBe(true))
    expect(label).toContain('isolated a ' + i)
  })
}
