#!/usr/bin/env bash
# Makes pglease's npm packages from a built binary, into release/out/ (npm pack):
#   pglease-linux-x64-<version>.tgz  @pglease/linux-x64 (release/npm/linux-x64): the binary
#                                    alone; "os", "cpu", "libc" let npm install it only there
#   pglease-<version>.tgz            pglease (release/npm/pglease): binaryPath() and the
#                                    `pglease` command; the platform packages are its
#                                    exact-version optional dependencies
#   pglease-client-<version>.tgz     @pglease/client (clients/node), whose optional dependency
#                                    pglease brings the binary for startPglease()
# and lists them in release/out/SHA256SUMS, replacing earlier lines of theirs (release/build.sh
# writes the file, then runs this). Every version must be Cargo.toml's [workspace.package] one.
#
#   bash release/npm.sh                  # from target/release/pglease
#   bash release/npm.sh --binary PATH
#
# release/check-npm.sh installs them into a fresh npm prefix and runs a vitest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. release/lib.sh

binary=target/release/pglease
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) [ $# -ge 2 ] || { echo "release/npm.sh: --binary needs a path" >&2; exit 64; }; binary=$2; shift 2 ;;
    --binary=*) binary=${1#--binary=}; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "release/npm.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
[ -x "$binary" ] || { echo "release/npm.sh: $binary is missing (release/build.sh builds it, or give --binary)" >&2; exit 1; }
command -v npm >/dev/null || { echo "release/npm.sh: npm is needed (Node.js 20 or newer)" >&2; exit 1; }

version=$(workspace_version)
# The binary's platform, in npm's words; a package for another one needs a directory like
# release/npm/linux-x64 and a line in release/npm/pglease (index.js, package.json).
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) platform=linux-x64 ;;
  *) echo "release/npm.sh: no npm platform package for $(uname -s)-$(uname -m) yet (release/npm/ has linux-x64)" >&2; exit 1 ;;
esac

# One version everywhere: each package's, and each exact version one names of another.
node - "$version" <<'EOF'
const fs = require('node:fs')
const version = process.argv[2]
const problems = []
const check = (file, what, value) => {
  if (value !== version) problems.push(`${file}: ${what} is ${JSON.stringify(value)}`)
}
for (const file of ['clients/node/package.json', 'release/npm/pglease/package.json', 'release/npm/linux-x64/package.json']) {
  const manifest = JSON.parse(fs.readFileSync(file, 'utf8'))
  check(file, 'version', manifest.version)
  for (const [name, spec] of Object.entries(manifest.optionalDependencies ?? {})) {
    check(file, `optionalDependencies["${name}"]`, spec)
  }
}
if (problems.length) {
  console.error(`release/npm.sh: Cargo.toml's version is ${version}, but\n  ${problems.join('\n  ')}`)
  process.exit(1)
}
EOF

# The platform package's README and description promise glibc GLIBC_FLOOR (release/lib.sh).
check_glibc_floor "$binary"

out=release/out
stage="$out/npm-stage"
rm -rf "$stage" && mkdir -p "$stage"
cp -R "release/npm/$platform" "$stage/$platform"
cp -R release/npm/pglease "$stage/pglease"
install -D -m 0755 "$binary" "$stage/$platform/bin/pglease"
for dir in "$stage/$platform" "$stage/pglease"; do
  install -m 0644 -t "$dir" LICENSE-MIT LICENSE-APACHE
done

# npm pack names each file itself (scope dropped, "@a/b" -> "a-b-<version>.tgz").
packages=()
for dir in "$stage/$platform" "$stage/pglease" clients/node; do
  file=$(cd "$dir" && npm pack --loglevel=error --ignore-scripts --pack-destination "$OLDPWD/$out" | tail -1)
  packages+=("$file")
  echo "==> $out/$file ($(du -h "$out/$file" | cut -f1))" >&2
done
rm -rf "$stage"

# What the packages must hold: the binary, executable; the client's entry points; no tests.
platform_files=$(tar -tvzf "$out/pglease-$platform-$version.tgz")
grep -q '^-rwx.* package/bin/pglease$' <<<"$platform_files" \
  || { echo "release/npm.sh: the platform package lacks an executable package/bin/pglease" >&2; exit 1; }
client_files=$(tar -tzf "$out/pglease-client-$version.tgz")
for file in package/index.js package/index.d.ts package/lib/start.cjs package/lib/global-setup.cjs; do
  grep -qx "$file" <<<"$client_files" || { echo "release/npm.sh: @pglease/client lacks $file" >&2; exit 1; }
done
if grep -q '^package/\(test\|examples\|node_modules\)/' <<<"$client_files"; then
  echo "release/npm.sh: @pglease/client packs its tests or examples" >&2
  exit 1
fi

(
  cd "$out"
  { [ -f SHA256SUMS ] && awk -v names=" ${packages[*]} " 'index(names, " " $2 " ") == 0' SHA256SUMS || true
    sha256sum "${packages[@]}"
  } > SHA256SUMS.new
  mv SHA256SUMS.new SHA256SUMS
)
printf "$out/%s\n" "${packages[@]}"
