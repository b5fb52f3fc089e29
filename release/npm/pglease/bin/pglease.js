#!/usr/bin/env node
'use strict'
// The `pglease` command of the npm package (`npx pglease serve`): runs the binary binaryPath()
// finds with the same arguments, passes on the signals that stop it, and exits as it did.
// Node cannot exec, so the binary is a child: a terminal's Ctrl-C reaches both, and the
// daemon stops once however many SIGINTs it gets.

const { spawn } = require('node:child_process')
const { binaryPath } = require('..')

let binary
try {
  binary = binaryPath()
} catch (error) {
  console.error(`pglease: ${error.message}`)
  process.exit(1)
}

const child = spawn(binary, process.argv.slice(2), { stdio: 'inherit' })
const forwarded = ['SIGINT', 'SIGTERM', 'SIGHUP']
for (const signal of forwarded) process.on(signal, () => child.kill(signal))
child.on('error', (error) => {
  console.error(`pglease: cannot run ${binary}: ${error.message}`)
  process.exit(1)
})
child.on('exit', (code, signal) => {
  if (signal) {
    // Die of the same signal, as a shell reports it.
    for (const name of forwarded) process.removeAllListeners(name)
    process.kill(process.pid, signal)
    return
  }
  process.exit(code ?? 1)
})
