'use strict'
// `@pglease/client/global-teardown`: jest's `globalTeardown`, stopping the daemon
// `@pglease/client/global-setup` started (vitest needs none: the setup returns its teardown).

module.exports = require('./global-setup.cjs').globalTeardown
