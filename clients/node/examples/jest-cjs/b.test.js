// jest's default CommonJS mode: require() gets the same helper.
const { useDatabase } = require('@pglease/client')
const { checkOwnDatabase } = require('../check.cjs')

const db = useDatabase({ template: 'app' })

for (let i = 0; i < 3; i++) {
  test('commonjs b ' + i, async () => {
    const label = await checkOwnDatabase(db)
    expect(label).toBe('examples/jest-cjs/b.test.js > commonjs b ' + i)
  })
}
