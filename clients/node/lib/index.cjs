'use strict'
// @pglease/client for `require` (jest's default CommonJS mode); ../index.js is the ESM entry
// and re-exports these, so both load the same modules.

const { PgleaseClient, PgleaseError, PgleaseUnavailableError, cleanLabel } = require('./client.cjs')
const { useDatabase, useFileDatabase } = require('./hooks.cjs')
const { startPglease } = require('./start.cjs')

module.exports = {
  PgleaseClient,
  PgleaseError,
  PgleaseUnavailableError,
  cleanLabel,
  startPglease,
  useDatabase,
  useFileDatabase,
}
