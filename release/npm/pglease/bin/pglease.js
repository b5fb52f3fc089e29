#!/usr/bin/env node
'use strict'
// The `pglease` command of the npm package (`npx pglease serve`): runs the binary binaryPath()
// finds with the same arguments, passes on the signals that stop it, and exits as it did.
// Node cannot exec, so the binary is a child: a terminal's Ctrl-C reaches both, and the
// daemon stops once however many SIGINTs it gets; when the launcher's parent (npx) goes
// away, the daemon is stopped too.

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
// `npx pglease serve &` then `kill $!` signals npm, not this launcher: npm exits without
// passing the signal on, and this process is left with a new parent. Node has no parent-death
// signal, so the launcher looks: once its parent is gone, it stops the daemon as SIGTERM
// would, and then exits as the daemon did.
const parent = process.ppid
const orphaned = setInterval(() => {
  if (process.ppid !== parent) {
    clearInterval(orphaned)
    child.kill('SIGTERM')
  }
}, 250)
orphaned.unref()
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
