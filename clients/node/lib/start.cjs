'use strict'
// startPglease(): a daemon for a test run. It uses the one at PGLEASE_URL when that answers;
// otherwise it runs `pglease serve` on a free loopback port (or on PGLEASE_URL's, when that
// names this machine), waits until it is ready, points PGLEASE_URL at it for the test
// workers the runner starts afterwards, and stops it (SIGTERM, then waits) in stop().
// The daemon's output goes to a log file, which every error about it names.
//
// The binary: the `binary` option, PGLEASE_BIN, the npm package `pglease` (an optional
// dependency of this one, whose platform packages hold the binary), then PATH.

const { spawn } = require('node:child_process')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')

const READY_TIMEOUT_MS = 180_000
const STOP_TIMEOUT_MS = 40_000
const POLL_MS = 200
// How often a port we picked may turn out taken before the daemon binds it.
const PORT_ATTEMPTS = 3
const LOOPBACK_HOSTS = new Set(['127.0.0.1', 'localhost', '[::1]', '::1'])

/** The pglease binary: the option, PGLEASE_BIN, the npm package `pglease`, then PATH. */
function findBinary(binary) {
  if (binary) {
    if (!fs.existsSync(binary)) throw new Error(`@pglease/client: the pglease binary ${binary} does not exist`)
    return binary
  }
  let launcher
  try {
    launcher = require('pglease')
  } catch (error) {
    if (error.code !== 'MODULE_NOT_FOUND') throw error
  }
  if (launcher) {
    // PGLEASE_BIN, the platform package, PATH; its error names the platforms there are.
    try {
      return launcher.binaryPath()
    } catch (error) {
      throw new Error(`@pglease/client: no pglease binary: ${error.message}`)
    }
  }
  const fromEnv = process.env.PGLEASE_BIN
  if (fromEnv) {
    if (!fs.existsSync(fromEnv)) throw new Error(`@pglease/client: PGLEASE_BIN=${fromEnv} does not exist`)
    return fromEnv
  }
  const onPath = (process.env.PATH || '')
    .split(path.delimiter)
    .filter(Boolean)
    .map((dir) => path.join(dir, 'pglease'))
    .find((candidate) => isExecutableFile(candidate))
  if (onPath) return onPath
  throw new Error(
    '@pglease/client: no pglease binary: the npm package pglease, which brings it, is not ' +
      'installed (npm install --save-dev pglease; an install with --omit=optional leaves it out), ' +
      'PGLEASE_BIN is not set and no pglease is on PATH: set PGLEASE_BIN to a pglease binary',
  )
}

function isExecutableFile(file) {
  try {
    fs.accessSync(file, fs.constants.X_OK)
    return fs.statSync(file).isFile()
  } catch {
    return false
  }
}

/** Whether a daemon answers at `url` (GET /healthz, which needs no token). */
async function answers(url) {
  try {
    const response = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) })
    await response.arrayBuffer()
    return response.ok
  } catch {
    return false
  }
}

/** GET /readyz's answer, ready (200) or not (503: `failed_templates` says which template
 * cannot be built and why); undefined while nothing answers. */
async function readiness(url) {
  try {
    const response = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(2000) })
    const body = await response.json().catch(() => ({}))
    return { ...body, ready: response.ok }
  } catch {
    return undefined
  }
}

/** A loopback port free now; the daemon binds it a moment later, so it may be taken by then
 * (startPglease tries again). */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
}

/** Splits PGLEASE_SERVE_ARGS like a shell: on blanks, with '…' and "…" quoting. */
function splitArgs(text) {
  const args = []
  const pattern = /"([^"]*)"|'([^']*)'|([^\s'"]+)/g
  let current = null
  let last = -1
  for (let match; (match = pattern.exec(text)); ) {
    const part = match[1] ?? match[2] ?? match[3]
    // Pieces that touch (--template="a b") make one argument.
    if (current !== null && match.index === last) current += part
    else {
      if (current !== null) args.push(current)
      current = part
    }
    last = pattern.lastIndex
  }
  if (current !== null) args.push(current)
  return args
}

function tail(file, lines = 20) {
  try {
    return fs.readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n')
  } catch {
    return ''
  }
}

/** Where a daemon started for `url` listens: PGLEASE_URL's host and port when it names this
 * machine, else an error (nothing can listen elsewhere for it). */
function listenAddressOf(url) {
  let parsed
  try {
    parsed = new URL(url)
  } catch {
    throw new Error(`@pglease/client: PGLEASE_URL=${url} is not a URL`)
  }
  if (!LOOPBACK_HOSTS.has(parsed.hostname)) {
    throw new Error(
      `@pglease/client: no pglease daemon answers at ${url}, and a daemon started here cannot ` +
        'listen there: start that one, or unset PGLEASE_URL to have one started on this machine',
    )
  }
  const host = parsed.hostname === 'localhost' ? '127.0.0.1' : parsed.hostname
  return `${host}:${parsed.port || 80}`
}

/**
 * A daemon for a test run: the one at `url` (default PGLEASE_URL) when it answers, else one
 * started here, ready to lease. Sets PGLEASE_URL to its URL; `stop()` stops a daemon it
 * started and puts PGLEASE_URL back.
 */
async function startPglease(options = {}) {
  const url = (options.url ?? process.env.PGLEASE_URL ?? '').replace(/\/+$/, '') || undefined
  const previousUrl = process.env.PGLEASE_URL
  const restore = () => {
    if (previousUrl === undefined) delete process.env.PGLEASE_URL
    else process.env.PGLEASE_URL = previousUrl
  }
  if (url && (await answers(url))) {
    process.env.PGLEASE_URL = url
    return { url, started: false, pid: undefined, logFile: undefined, stop: async () => restore() }
  }
  const start = options.start ?? process.env.PGLEASE_START !== '0'
  if (!start) {
    throw new Error(
      `@pglease/client: no pglease daemon answers at ${url ?? 'PGLEASE_URL (not set)'}, and ` +
        'PGLEASE_START=0 says not to start one',
    )
  }
  const binary = findBinary(options.binary)
  const serveArgs = options.serveArgs ?? splitArgs(process.env.PGLEASE_SERVE_ARGS ?? '')
  const fixed = url ? listenAddressOf(url) : undefined
  const logFile =
    options.logFile ?? path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'pglease-')), 'serve.log')
  const readyTimeoutMs = options.readyTimeoutMs ?? READY_TIMEOUT_MS

  for (let attempt = 1; ; attempt++) {
    const listen = fixed ?? `127.0.0.1:${await freePort()}`
    const daemonUrl = url ?? `http://${listen}`
    const args = ['serve', '--listen', listen, ...serveArgs]
    const daemon = launch(binary, args, logFile, options.env)
    const outcome = await waitReady(daemon, daemonUrl, readyTimeoutMs)
    if (outcome === 'ready') {
      process.env.PGLEASE_URL = daemonUrl
      return {
        url: daemonUrl,
        started: true,
        pid: daemon.child.pid,
        logFile,
        stop: async () => {
          await daemon.stop()
          restore()
        },
      }
    }
    const log = tail(logFile)
    // Another process took the port between freePort() and the daemon's bind: another port.
    if (outcome === 'exited' && !fixed && attempt < PORT_ATTEMPTS && /cannot listen/.test(log)) continue
    if (outcome.failed) {
      await daemon.stop()
      const why = outcome.failed.map((t) => `${t.name}: ${t.error}`).join('; ')
      throw new Error(
        `@pglease/client: the pglease daemon cannot build a template: ${why} (it is stopped); ` +
          `its log: ${logFile}`,
      )
    }
    if (outcome === 'exited') {
      throw new Error(
        `@pglease/client: \`${[binary, ...args].join(' ')}\` ` +
          `exited (${daemon.child.exitCode ?? daemon.child.signalCode}) before it was ready; its log: ${logFile}\n${log}`,
      )
    }
    await daemon.stop()
    throw new Error(
      `@pglease/client: the pglease daemon at ${daemonUrl} was not ready in ${readyTimeoutMs / 1000} s ` +
        `(it is stopped); its log: ${logFile}\n${log}`,
    )
  }
}

/** Runs the daemon with its output appended to `logFile`; stop() sends SIGTERM and waits,
 * SIGKILL after 40 s. */
function launch(binary, args, logFile, env) {
  const log = fs.openSync(logFile, 'a')
  let child
  try {
    child = spawn(binary, args, {
      stdio: ['ignore', log, log],
      env: { ...process.env, ...env },
    })
  } finally {
    fs.closeSync(log)
  }
  const exited = new Promise((resolve) => {
    child.on('exit', resolve)
    // A binary that cannot be run at all: reported as an exit, its reason in the log.
    child.on('error', (error) => {
      fs.appendFileSync(logFile, `cannot run ${binary}: ${error.message}\n`)
      resolve()
    })
  })
  // If the runner exits without stop() (a crash, a forgotten teardown), the daemon does not
  // outlive it: SIGTERM, and the daemon shuts its postgres down itself.
  const onExit = () => child.kill('SIGTERM')
  process.on('exit', onExit)
  exited.then(() => process.removeListener('exit', onExit))
  // Nothing here keeps the runner's process alive.
  child.unref()
  const running = () => child.exitCode === null && child.signalCode === null
  return {
    child,
    exited,
    running,
    async stop() {
      if (!running()) return
      child.kill('SIGTERM')
      let timer
      const late = new Promise((resolve) => (timer = setTimeout(resolve, STOP_TIMEOUT_MS, 'late')))
      const outcome = await Promise.race([exited, late])
      // A pending timer would keep the runner's process alive for the rest of the 40 s.
      clearTimeout(timer)
      if (outcome === 'late') {
        child.kill('SIGKILL')
        await exited
      }
    },
  }
}

/** 'ready' once GET /readyz answers 200, 'exited' if the daemon ends first, { failed } when
 * a template failed (it stays failed until its sources change: no use waiting), else
 * 'timeout'. */
async function waitReady(daemon, url, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  let ended = false
  daemon.exited.then(() => (ended = true))
  while (Date.now() < deadline) {
    if (ended || !daemon.running()) return 'exited'
    const answer = await readiness(url)
    if (answer?.ready) return 'ready'
    if (answer?.failed_templates?.length) return { failed: answer.failed_templates }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS))
  }
  return 'timeout'
}

module.exports = { startPglease, findBinary, splitArgs }
