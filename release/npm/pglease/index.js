'use strict'
// The npm package `pglease`: where the pglease binary is. The binary itself comes in a package
// per platform (@pglease/linux-x64, …), listed here as optional dependencies with an `os`,
// `cpu` and `libc` each, so that npm installs only the one that fits (esbuild's pattern); this
// package holds no binary and runs no install script. bin/pglease.js is the `pglease` command.
//
// The order: PGLEASE_BIN, then the platform's package, then a `pglease` on PATH.

const fs = require('node:fs')
const path = require('node:path')

/** The platforms with a package: `${process.platform}-${process.arch}`, the package, what
 * else it needs. npm reads the same facts from each package's package.json. */
const PLATFORMS = {
  'linux-x64': { package: '@pglease/linux-x64', libc: 'glibc', needs: 'glibc 2.17 or newer' },
}

/** This machine as the table names it, and whether its C library is musl (npm's `libc`
 * check skips a glibc package there). */
function currentPlatform() {
  const key = `${process.platform}-${process.arch}`
  let libc
  if (process.platform === 'linux') {
    // Node's own report says which glibc it runs on, and nothing on musl.
    const header = process.report?.getReport?.().header
    libc = header?.glibcVersionRuntime ? 'glibc' : 'musl'
  }
  return { key, libc, name: libc === 'musl' ? `${key} (musl)` : key }
}

function describePlatforms() {
  return Object.entries(PLATFORMS)
    .map(([key, platform]) => `${key} (${platform.package}, ${platform.needs})`)
    .join(', ')
}

/** The packaged binary of this platform, or an error saying why there is none. */
function packagedBinary() {
  const platform = currentPlatform()
  const known = PLATFORMS[platform.key]
  if (!known || (known.libc && platform.libc !== known.libc)) {
    return { error: `npm has no pglease binary for ${platform.name}; there is one for ${describePlatforms()}` }
  }
  let manifest
  try {
    manifest = require.resolve(`${known.package}/package.json`)
  } catch {
    return {
      error:
        `${known.package}, the package with the binary for ${platform.name}, is not installed ` +
        '(an install with --omit=optional or --no-optional leaves it out; install again without)',
    }
  }
  return { binary: path.join(path.dirname(manifest), 'bin', 'pglease') }
}

/** A `pglease` on PATH that is not this package's own command (which would run itself). */
function binaryOnPath() {
  const shim = fs.realpathSync(path.join(__dirname, 'bin', 'pglease.js'))
  for (const dir of (process.env.PATH || '').split(path.delimiter)) {
    if (!dir) continue
    const candidate = path.join(dir, 'pglease')
    try {
      fs.accessSync(candidate, fs.constants.X_OK)
      if (fs.realpathSync(candidate) === shim || !fs.statSync(candidate).isFile()) continue
      return candidate
    } catch {
      // Not there or not executable: the next directory.
    }
  }
  return undefined
}

/**
 * The path of the pglease binary: PGLEASE_BIN when set, else the one in this platform's
 * package, else a `pglease` on PATH. Throws an error naming the platforms there are packages
 * for and PGLEASE_BIN when there is none.
 * @returns {string}
 */
function binaryPath() {
  const fromEnv = process.env.PGLEASE_BIN
  if (fromEnv) {
    if (!fs.existsSync(fromEnv)) throw new Error(`PGLEASE_BIN=${fromEnv} does not exist`)
    return fromEnv
  }
  const packaged = packagedBinary()
  if (packaged.binary) {
    if (!fs.existsSync(packaged.binary)) throw new Error(`the package's binary ${packaged.binary} is missing`)
    return packaged.binary
  }
  const onPath = binaryOnPath()
  if (onPath) return onPath
  throw new Error(
    `${packaged.error}, and no pglease is on PATH: set PGLEASE_BIN to a pglease binary ` +
      '(a release tarball has one, or build it: cargo install --path . in a checkout)',
  )
}

module.exports = { binaryPath, PLATFORMS }
