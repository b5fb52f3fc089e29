'use strict'
// What the hooks need to know from the test runner, vitest, jest or node:test, without importing
// any:
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
//
// node:test passes every hook its TestContext (beforeEach/afterEach) or SuiteContext
// (before/after): `fullName` is `describe > test`, `passed` is set before afterEach runs, and
// `filePath` (Node 22.6+) names the file; before that, node --test runs each file in a process
// of its own, whose argv[1] is the file.

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

/** node:test's TestContext or SuiteContext: a name and an abort signal, and no vitest task. */
function nodeContext(context) {
  return context && typeof context === 'object' && typeof context.name === 'string' &&
    context.signal instanceof AbortSignal && !('task' in context) && !('tasks' in context)
    ? context
    : undefined
}

/** The file of a node:test context, relative to the working directory. */
function nodeFile(context) {
  const file = context.filePath ?? process.argv[1]
  return file ? path.relative(process.cwd(), file) : undefined
}

/** `file > describe > test` (or `file > describe`) of a node:test context. */
function nodeName(context) {
  let name
  try {
    name = context.fullName ?? context.name
  } catch {
    // The file's own context (a hook outside any describe): Node 20's fullName throws for it,
    // as it has no parent; the file names it.
    name = undefined
  }
  return join(nodeFile(context), name ? [name] : [])
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
  const node = nodeContext(context)
  if (node) return nodeName(node)
  // Another runner that implements expect.getState() (vitest without a context, jest without
  // the state): the name without the file.
  return globalThis.expect?.getState?.().currentTestName || undefined
}

/** `file` or `file > describe`, for a database shared by a file's (or describe's) tests. */
function suiteName(suite) {
  const vitest = vitestSuite(suite)
  if (vitest) return vitest.file && vitest.file !== vitest ? join(vitest.file.name, vitestNames(vitest)) : vitest.name
  const node = nodeContext(suite)
  if (node) return nodeName(node)
  return jestFile()
}

/** Whether the current test failed (its body or its hooks so far), or undefined. */
function testFailed(context) {
  const task = vitestTask(context)
  if (task) return task.result?.state === 'fail'
  const test = jestState()?.currentlyRunningTest
  if (test) return test.errors.length > 0
  const node = nodeContext(context)
  if (node && typeof node.passed === 'boolean') return !node.passed
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
