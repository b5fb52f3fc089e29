// With injectGlobals off, or just explicit: jest's hooks from @jest/globals.
import { afterEach, beforeEach, expect, test } from '@jest/globals'
import { useDatabase } from '@pglease/client'
import { checkOwnDatabase } from '../check.cjs'

const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })

for (let i = 0; i < 3; i++) {
  test('hooks passed in ' + i, async () => {
    const label = await checkOwnDatabase(db)
    expect(label).toBe('examples/jest/globals.test.mjs > hooks passed in ' + i)
  })
}
