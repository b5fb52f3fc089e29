// jest's default CommonJS mode: require() gets the same helper.
const { useDatabase } = require('@pglease/client')
const { checkOwnDatabase } = require('../check.cjs')

const db = useDatabase({ template: 'app' })

for (let i = 0; i < 3; i++) {
  test('commonjs a ' + i, async () => {
    const label = await checkOwnDatabase(db)
    expect(label).toBe('examples/jest-cjs/a.test.js > commonjs a ' + i)
  })
}
