#!/usr/bin/env bash
# Checks the npm packages (release/npm.sh) the way a newcomer meets them: their checksums,
# then, in a fresh directory with a fresh npm prefix and a PATH without a Rust toolchain and
# without this checkout, `npm install --save-dev @pglease/client pg vitest` (the packed
# tarballs standing in for the registry's pglease packages, pg and vitest from the registry
# through the npm cache), a vitest suite as @pglease/client's README sets it up (its global
# setup starting the daemon on its embedded default, useDatabase, queries on the leased
# databases), then the same suite under jest. Also: `npx pglease`, binaryPath(), and the
# errors without a platform package.
#
#   bash release/check-npm.sh        # after release/build.sh (or release/npm.sh)
#
# On 2 cores it takes about 35 s with pg, vitest and jest in the npm cache (most of it
# `npm install`: 332 packages, 271 of them jest's), about 100 s with an empty one.
set -euo pipefail
cd "$(dirname "$0")/.."
. release/lib.sh
started=$SECONDS

version=$(workspace_version)
out=$PWD/release/out
client=pglease-client-$version.tgz
launcher=pglease-$version.tgz
platform=pglease-linux-x64-$version.tgz
for file in "$client" "$launcher" "$platform"; do
  [ -f "$out/$file" ] || { echo "release/check-npm.sh: no $out/$file (run release/build.sh or release/npm.sh)" >&2; exit 1; }
  (cd "$out" && awk -v name="$file" '$2 == name' SHA256SUMS | grep -q . && awk -v name="$file" '$2 == name' SHA256SUMS | sha256sum --quiet -c -) \
    || { echo "release/check-npm.sh: $file is not in SHA256SUMS as it is" >&2; exit 1; }
done

work=$(mktemp -d /tmp/pglease-npm-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
app="$work/app"
mkdir -p "$app" "$work/home" "$work/prefix"

# The user's shell: the system's tools and a fresh npm prefix, nothing of this checkout, no
# PGLEASE_* variables; npm's cache and configuration (the registry, its certificates) stay
# the machine's, so that the registry's packages come from the cache when they are there.
npm_cache=$(npm config get cache)
npm_userconfig=$(npm config get userconfig)
npm_globalconfig=$(npm config get globalconfig)
user_env=(env -i "PATH=$work/prefix/bin:/usr/local/bin:/usr/bin:/bin" "HOME=$work/home" "LANG=C.UTF-8"
  "npm_config_prefix=$work/prefix" "npm_config_cache=$npm_cache"
  "npm_config_userconfig=$npm_userconfig" "npm_config_globalconfig=$npm_globalconfig"
  "npm_config_audit=false" "npm_config_fund=false" "npm_config_update_notifier=false"
  "npm_config_prefer_offline=true")
if "${user_env[@]}" sh -c 'command -v cargo || command -v rustc || command -v pglease' >/dev/null; then
  echo "release/check-npm.sh: cargo, rustc or pglease is on the user's PATH; the check would prove nothing" >&2
  exit 1
fi
"${user_env[@]}" node -e 'if (+process.versions.node.split(".")[0] < 20) { console.error(`node ${process.version}: @pglease/client needs 20`); process.exit(1) }'

# Until they are on the registry, overrides point the names at the tarballs: installing
# @pglease/client alone must bring pglease, and pglease the platform package.
cat > "$app/package.json" <<EOF
{
  "name": "app",
  "private": true,
  "type": "module",
  "scripts": { "test": "vitest run" },
  "overrides": {
    "pglease": "file:$out/$launcher",
    "@pglease/linux-x64": "file:$out/$platform"
  }
}
EOF
cd "$app"
echo "==> npm install --save-dev @pglease/client pg vitest jest (in $app)" >&2
"${user_env[@]}" npm install --save-dev --loglevel=error "$out/$client" pg vitest jest
for dir in @pglease/client pglease @pglease/linux-x64; do
  [ -d "node_modules/$dir" ] || { echo "release/check-npm.sh: npm did not install $dir" >&2; exit 1; }
done

echo "==> npx pglease --version; binaryPath()" >&2
"${user_env[@]}" npx --no-install pglease --version
binary=$("${user_env[@]}" node -p "require('pglease').binaryPath()")
[ "$binary" = "$app/node_modules/@pglease/linux-x64/bin/pglease" ] \
  || { echo "release/check-npm.sh: binaryPath() is $binary, not the platform package's" >&2; exit 1; }
# Elsewhere the error names the platforms there are and PGLEASE_BIN.
expect_error() {
  local pattern=$1; shift
  local output
  if output=$("$@" 2>&1); then
    echo "release/check-npm.sh: expected an error from: $*" >&2; exit 1
  fi
  grep -q -- "$pattern" <<<"$output" || { echo "release/check-npm.sh: expected '$pattern' in: $output" >&2; exit 1; }
}
expect_error 'npm has no pglease binary for linux-arm64; there is one for linux-x64 (@pglease/linux-x64, glibc 2.17 or newer), and no pglease is on PATH: set PGLEASE_BIN' \
  "${user_env[@]}" node -e "Object.defineProperty(process, 'arch', { value: 'arm64' }); require('pglease').binaryPath()"
mv node_modules/@pglease/linux-x64 "$work/linux-x64"
expect_error '@pglease/linux-x64, the package with the binary for linux-x64, is not installed' "${user_env[@]}" npx --no-install pglease --version
mv "$work/linux-x64" node_modules/@pglease/linux-x64

answers() {
  "${user_env[@]}" node -e 'fetch(process.argv[1] + "/healthz").then(() => process.exit(0), () => process.exit(1))' "$1"
}

# `npx pglease serve &` then `kill $!`: $! is npm's pid, and npm exits without passing the
# signal on; the launcher notices its parent is gone and stops the daemon, which stops its
# postgres. Nothing may be left holding the port.
echo "==> npx pglease serve & kill \$!" >&2
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${user_env[@]}" npx --no-install pglease serve --listen "127.0.0.1:$port" --front-listen off \
  > "$work/npx-serve.log" 2>&1 &
npx_pid=$!
for _ in $(seq 120); do answers "http://127.0.0.1:$port" && break; sleep 0.5; done
answers "http://127.0.0.1:$port" || { echo "release/check-npm.sh: npx pglease serve did not answer:" >&2; cat "$work/npx-serve.log" >&2; exit 1; }
daemon_pid=$(pgrep -f "linux-x64/bin/pglease serve --listen 127.0.0.1:$port" | head -1)
postmaster_pid=$(pgrep -P "$daemon_pid" postgres | head -1)
[ -n "$daemon_pid" ] && [ -n "$postmaster_pid" ] \
  || { echo "release/check-npm.sh: cannot find the daemon or its postgres" >&2; exit 1; }
kill "$npx_pid"
for _ in $(seq 60); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$daemon_pid" 2>/dev/null || answers "http://127.0.0.1:$port"; then
  echo "release/check-npm.sh: after kill \$! (npm), the daemon $daemon_pid still runs" >&2
  exit 1
fi
for _ in $(seq 20); do kill -0 "$postmaster_pid" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$postmaster_pid" 2>/dev/null; then
  echo "release/check-npm.sh: after kill \$! (npm), the daemon's postgres still runs" >&2
  exit 1
fi

# The suite as the README tells it: the global setup starts the daemon, each test leases.
cat > vitest.config.js <<'EOF'
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test/**/*.test.js'],
    globalSetup: ['@pglease/client/global-setup'],
  },
})
EOF
mkdir -p test jest
cat > test/db.test.js <<'EOF'
import { afterEach, beforeEach, expect, test } from 'vitest'
import { writeFileSync } from 'node:fs'
import pg from 'pg'
import { useDatabase } from '@pglease/client'

const db = useDatabase({ hooks: { beforeEach, afterEach } })

async function query(sql) {
  const client = new pg.Client(db.config)
  await client.connect()
  try {
    return (await client.query(sql)).rows
  } finally {
    await client.end()
  }
}

test('a leased database takes a table', async () => {
  writeFileSync('daemon-url', process.env.PGLEASE_URL)
  await query('CREATE TABLE orders (id int)')
  await query('INSERT INTO orders VALUES (1), (2)')
  expect(await query('SELECT count(*)::int AS n FROM orders')).toEqual([{ n: 2 }])
})

test('the next test has a database of its own', async () => {
  expect(await query("SELECT to_regclass('orders') AS t")).toEqual([{ t: null }])
})
EOF
echo "==> npm test (vitest run)" >&2
"${user_env[@]}" npm test
# The global setup's teardown stopped the daemon it started.
daemon_url=$(cat daemon-url)
if answers "$daemon_url"; then
  echo "release/check-npm.sh: the daemon vitest's global setup started still answers at $daemon_url" >&2
  exit 1
fi

cat > jest.config.cjs <<'EOF'
module.exports = {
  testMatch: ['<rootDir>/jest/**/*.test.cjs'],
  globalSetup: '@pglease/client/global-setup',
  globalTeardown: '@pglease/client/global-teardown',
}
EOF
sed -e "s|^import { afterEach, beforeEach, expect, test } from 'vitest'$||" \
  -e "s|^import { writeFileSync } from 'node:fs'$|const { writeFileSync } = require('node:fs')|" \
  -e "s|^import pg from 'pg'$|const pg = require('pg')|" \
  -e "s|^import { useDatabase } from '@pglease/client'$|const { useDatabase } = require('@pglease/client')|" \
  -e "s|useDatabase({ hooks: { beforeEach, afterEach } })|useDatabase()|" \
  test/db.test.js > jest/db.test.cjs
rm -f daemon-url
echo "==> npx jest" >&2
"${user_env[@]}" npx --no-install jest --config jest.config.cjs
daemon_url=$(cat daemon-url)
if answers "$daemon_url"; then
  echo "release/check-npm.sh: the daemon jest's global setup started still answers at $daemon_url" >&2
  exit 1
fi
echo "release/check-npm.sh: $client, $launcher and $platform installed; vitest and jest passed against the daemon they started ($((SECONDS - started)) s)"
