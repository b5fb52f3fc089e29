// @pglease/client: a fresh, migrated PostgreSQL database per test from a pglease daemon, for
// vitest and jest. The ESM entry; the code is CommonJS in lib/ so that jest's default
// CommonJS mode can require the same modules (see lib/client.cjs).
export {
  PgleaseClient,
  PgleaseError,
  PgleaseUnavailableError,
  cleanLabel,
  startPglease,
  useDatabase,
  useFileDatabase,
} from './lib/index.cjs'
