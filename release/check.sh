#!/usr/bin/env bash
# Checks a release tarball the way a user meets it: its checksum, then installed into an
# empty prefix and run with an environment that has no Rust toolchain and no build tree on
# PATH — the README's first flow: serve on the embedded default, wait until ready, lease a
# database over HTTP, connect to it with psql, stop.
#
#   bash release/check.sh [release/out/pglease-<version>-<arch>-linux.tar.gz]
#
# It needs curl and psql (postgresql-client); release/check-in-container.sh runs it in a
# Debian container that has no Rust and no checkout, as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."

tarball=${1:-$(ls -t release/out/pglease-*-linux.tar.gz 2>/dev/null | head -1)}
[ -f "$tarball" ] || { echo "release/check.sh: no tarball (run release/build.sh)" >&2; exit 1; }
(cd "$(dirname "$tarball")" && grep -F "$(basename "$tarball")" SHA256SUMS | sha256sum --quiet -c -)

work=$(mktemp -d /tmp/pglease-release-check.XXXXXX)
daemon=""
cleanup() {
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

prefix="$work/prefix"
mkdir -p "$prefix"
tar -xzf "$tarball" -C "$prefix" --strip-components=1
for file in bin/pglease share/man/man1/pglease.1.gz share/man/man1/pglease-serve.1.gz \
  share/bash-completion/completions/pglease share/zsh/site-functions/_pglease \
  share/fish/vendor_completions.d/pglease.fish lib/systemd/system/pglease.service \
  share/doc/pglease/examples/pglease.toml share/doc/pglease/README.md share/doc/pglease/LICENSE-MIT \
  share/doc/pglease/LICENSE-APACHE share/doc/pglease/docs/configuration.md; do
  [ -e "$prefix/$file" ] || { echo "release/check.sh: the tarball lacks $file" >&2; exit 1; }
done
bash -n "$prefix/share/bash-completion/completions/pglease"

# What the user's shell has: the system's tools and the prefix, nothing of this checkout.
psql=$(command -v psql || ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1)
[ -n "$psql" ] || { echo "release/check.sh: psql is needed to connect (postgresql-client)" >&2; exit 1; }
# A free port when python3 is there to ask for one, else the default (a fresh container).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 5480)
url="http://127.0.0.1:$port"
user_env=(env -i "PATH=$prefix/bin:/usr/local/bin:/usr/bin:/bin" "HOME=$work" "LANG=C.UTF-8")
if "${user_env[@]}" sh -c 'command -v cargo || command -v rustc' >/dev/null; then
  echo "release/check.sh: a Rust toolchain is on the user's PATH; the check would prove nothing" >&2
  exit 1
fi

"${user_env[@]}" pglease --version
(cd "$work" && exec "${user_env[@]}" pglease serve --listen "127.0.0.1:$port" > "$work/serve.log" 2>&1) &
daemon=$!
if ! "${user_env[@]}" pglease ready --server "$url" --timeout 120; then
  echo "release/check.sh: the daemon did not become ready; its log:" >&2
  cat "$work/serve.log" >&2
  exit 1
fi
lease=$(curl -sf -X POST "$url/lease")
db_url=$(printf '%s' "$lease" | grep -o '"url":"[^"]*"' | cut -d'"' -f4)
answer=$("$psql" "$db_url" -tAc 'select current_database() = current_user')
[ "$answer" = t ] || { echo "release/check.sh: the leased database answered '$answer'" >&2; exit 1; }
echo "release/check.sh: $(basename "$tarball"): installed, served, leased and connected"
