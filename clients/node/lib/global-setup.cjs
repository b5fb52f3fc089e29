'use strict'
// `@pglease/client/global-setup`: a daemon for the whole test run, configured from the
// environment (startPglease's defaults: PGLEASE_URL, PGLEASE_START, PGLEASE_SERVE_ARGS,
// PGLEASE_BIN). vitest: `globalSetup: ['@pglease/client/global-setup']`, whose teardown is
// the function this returns. jest: `globalSetup: '@pglease/client/global-setup'` with
// `globalTeardown: '@pglease/client/global-teardown'` (jest ignores what a setup returns).
// Both runners start their test workers afterwards, so they inherit PGLEASE_URL.

const { startPglease } = require('./start.cjs')

// On globalThis, not in this module: jest loads the setup and the teardown each its own way,
// which need not share one copy of this file.
const DAEMON = Symbol.for('@pglease/client: the global setup daemon')

async function globalSetup() {
  if (globalThis[DAEMON]) return globalTeardown
  globalThis[DAEMON] = await startPglease()
  return globalTeardown
}

/** Stops the daemon globalSetup started (none if it used a running one). */
async function globalTeardown() {
  const daemon = globalThis[DAEMON]
  delete globalThis[DAEMON]
  await daemon?.stop()
}

module.exports = globalSetup
module.exports.globalTeardown = globalTeardown
