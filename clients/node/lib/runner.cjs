'use strict'
// What the hooks need to know from the test runner, vitest or jest, without importing either:
// the current test's full name (the lease's label), the file's name, and whether a test failed
// (to keep its database). Every function answers `undefined` when it cannot tell.
//
// vitest passes its hooks the test's context (beforeEach/afterEach) or the suite
// (beforeAll/afterAll), and has marked a failed test's result 'fail' before afterEach runs.
// jest passes its hooks nothing; its runner, jest-circus, keeps its state (the running test and
// the errors it has collected) on the test file's global object under a symbol it does not
// export. That state is the same object jest hands a custom environment's handleTestEvent, a
// documented API; finding it by the symbol's description is not documented, so if a jest
// version stops putting it there, the name falls back to expect.getState() and failure is
// reported unknown (hooks.cjs then says so and drops the database).

const path = require('node:path')

const JEST_STATE_SYMBOL = 'JEST_STATE_SYMBOL'
const JEST_ROOT_BLOCK = 'ROOT_DESCRIBE_BLOCK'

/** vitest's task, when the hook was given a test context. */
function vitestTask(context) {
  const task = context?.task
  return task && typeof task === 'object' && task.type === 'test' ? task : undefined
}

/** vitest's suite or file, when a beforeAll/afterAll hook was given one. */
function vitestSuite(suite) {
  return suite && typeof suite === 'object' && suite.type === 'suite' && Array.isArray(suite.tasks)
    ? suite
    : undefined
}

function jestState() {
  const symbol = Object.getOwnPropertySymbols(globalThis).find((s) => s.description === JEST_STATE_SYMBOL)
  const state = symbol && globalThis[symbol]
  return state && typeof state === 'object' && state.rootDescribeBlock ? state : undefined
}

/** The test file, relative to the working directory, as both runners print it. */
function jestFile() {
  const testPath = globalThis.expect?.getState?.().testPath
  return testPath ? path.relative(process.cwd(), testPath) : undefined
}

/** Names from the outermost describe to the task itself, file excluded. */
function vitestNames(task) {
  const names = []
  for (let t = task; t && t.type !== undefined; t = t.suite) {
    if (t === t.file) break
    if (t.name) names.unshift(t.name)
  }
  return names
}

function jestNames(test) {
  const names = []
  for (let t = test; t && !(t.name === JEST_ROOT_BLOCK && !t.parent); t = t.parent) names.unshift(t.name)
  return names
}

/** `file > describe > test`, the current test's full name. */
function testName(context) {
  const task = vitestTask(context)
  if (task) return join(task.file?.name, vitestNames(task))
  const test = jestState()?.currentlyRunningTest
  if (test) return join(jestFile(), jestNames(test))
  // Another runner that implements expect.getState() (vitest without a context, jest without
  // the state): the name without the file.
  return globalThis.expect?.getState?.().currentTestName || undefined
}

/** `file` or `file > describe`, for a database shared by a file's (or describe's) tests. */
function suiteName(suite) {
  const vitest = vitestSuite(suite)
  if (vitest) return vitest.file && vitest.file !== vitest ? join(vitest.file.name, vitestNames(vitest)) : vitest.name
  return jestFile()
}

/** Whether the current test failed (its body or its hooks so far), or undefined. */
function testFailed(context) {
  const task = vitestTask(context)
  if (task) return task.result?.state === 'fail'
  const test = jestState()?.currentlyRunningTest
  if (test) return test.errors.length > 0
  return undefined
}

/** Whether any test of the suite (vitest) or of the file (jest) has failed, or undefined. */
function anyTestFailed(suite) {
  const vitest = vitestSuite(suite)
  if (vitest) return someTask(vitest, (t) => t.result?.state === 'fail')
  const state = jestState()
  if (state) return state.unhandledErrors.length > 0 || someJestTest(state.rootDescribeBlock)
  return undefined
}

function someTask(suite, failed) {
  return suite.tasks.some((t) => failed(t) || (Array.isArray(t.tasks) && someTask(t, failed)))
}

function someJestTest(block) {
  return block.children.some((child) =>
    child.type === 'test' ? child.errors.length > 0 : someJestTest(child),
  )
}

function join(file, names) {
  const parts = [file, ...names].filter(Boolean)
  return parts.length ? parts.join(' > ') : undefined
}

module.exports = { testName, suiteName, testFailed, anyTestFailed }
