#!/usr/bin/env bash
# go-starter's test suite against pglease and against IntegreSQL v1.1.0, taking turns, in
# compose's layout (issue 42; docs/integresql.md, "The server's own user"):
#
#   bash bench/ab/go-starter.sh GO_STARTER_CHECKOUT [ROUNDS]    # as root, from the repo's root
#
# GO_STARTER_CHECKOUT: a checkout of github.com/allaboutapps/go-starter, best at /app as in its
# compose file (one test expects that path; the Go module proxy
# does not serve it; measured at 9f7a54c). ROUNDS: runs of each, default 3. Before every run
# a postgres as compose's (superuser dbuser/dbpass, tuned as compose tunes it, on /dev/shm,
# port $PG_PORT) starts afresh, its `development` and `spec` databases are migrated with the
# project's sql-migrate, and the server under test starts on port $API_PORT: pglease attached
# to that postgres as docs/integresql.md says (PGLEASE_BINARY, or this checkout's release
# build), or IntegreSQL v1.1.0 (built from the module proxy's zip, cached in
# target/). Then `gotestsum -- -count=1 ./...` in the checkout with compose's variables.
# Prints each run's tests, failures and gotestsum's total, then the medians and
# pglease ÷ IntegreSQL. Needs go (1.24+: the project runs its tools with `go tool`), postgres
# server binaries (PGLEASE_PG_BIN_DIR or /usr/lib/postgresql/*/bin) and psql.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

checkout=${1:?usage: bash bench/ab/go-starter.sh GO_STARTER_CHECKOUT [ROUNDS]}
rounds=${2:-3}
PG_PORT=${PG_PORT:-55432}
API_PORT=${API_PORT:-55000}
HTTP_PORT=${HTTP_PORT:-55433}
[ "$(id -u)" = 0 ] || { echo "go-starter.sh: run it as root (postgres runs as the postgres user)" >&2; exit 1; }
[ -f "$checkout/go.mod" ] || { echo "go-starter.sh: $checkout has no go.mod: give a go-starter checkout" >&2; exit 1; }
command -v go >/dev/null || { echo "go-starter.sh: go is not on PATH" >&2; exit 1; }
id postgres >/dev/null 2>&1 || { echo "go-starter.sh: needs a 'postgres' OS user" >&2; exit 1; }
pg_bin=${PGLEASE_PG_BIN_DIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$pg_bin/postgres" ] || { echo "go-starter.sh: no postgres binaries: set PGLEASE_PG_BIN_DIR" >&2; exit 1; }

work=$(mktemp -d /var/tmp/pglease-go-starter.XXXXXX)
# Made afresh by mktemp (never a name someone could have put a link at): it is chowned
# to postgres as root.
data=
tools=$repo/target/go-starter-tools
server_pid=
stop_all() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
  if [ -n "$data" ]; then
    if [ -d "$data/pgdata" ]; then
      runuser -u postgres -- "$pg_bin/pg_ctl" -D "$data/pgdata" -m fast stop >/dev/null 2>&1 || true
    fi
    rm -rf "$data"
    data=
  fi
}
trap 'stop_all; rm -rf "$work"' EXIT

# The tools: pglease, IntegreSQL and gotestsum.
pglease=${PGLEASE_BINARY:-}
if [ -z "$pglease" ]; then
  echo "==> cargo build --release --bin pglease" >&2
  cargo build --release --quiet --bin pglease
  pglease=$repo/target/release/pglease
fi
mkdir -p "$tools"
# Built from the module proxy's zip: `go install …@version` asks the proxy for the module's
# version list, which some proxies refuse.
go_build() { # module@version package output
  local dir
  dir=$(go mod download -json "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  (cd "$dir" && go build -o "$3" "$2")
}
if [ ! -x "$tools/integresql" ]; then
  echo "==> go build github.com/allaboutapps/integresql@v1.1.0 (cmd/server)" >&2
  go_build github.com/allaboutapps/integresql@v1.1.0 ./cmd/server "$tools/integresql"
fi
if [ ! -x "$tools/gotestsum" ]; then
  echo "==> go build gotest.tools/gotestsum@v1.12.3" >&2
  go_build gotest.tools/gotestsum@v1.12.3 . "$tools/gotestsum"
fi
# Compose mounts the project at /app, and one test (TestLogWithCaller) expects that path in
# its log line: run there when the checkout is /app, else in a copy (that test then fails
# under both servers alike).
if [ "$(realpath "$checkout")" = /app ]; then
  app=/app
else
  app=$work/app
  cp -a "$checkout/." "$app"
  echo "go-starter.sh: the checkout is not at /app: TestLogWithCaller will fail under both" >&2
fi
echo "==> go build (the suite's packages and tools, once)" >&2
(cd "$app" && go test -exec /bin/true ./... >/dev/null && go tool sql-migrate --help >/dev/null 2>&1) || true

export PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=dbuser PGPASSWORD=dbpass PGSSLMODE=disable PGDATABASE=development
export PSQL_HOST=127.0.0.1 PSQL_PORT=$PG_PORT PSQL_USER=dbuser PSQL_PASS=dbpass PSQL_DBNAME=spec PSQL_SSLMODE=disable
export PROJECT_ROOT_DIR=$app PGTZ=UTC INTEGRESQL_CLIENT_BASE_URL=http://127.0.0.1:$API_PORT/api

# A postgres as compose's, afresh, with the app's two databases migrated.
fresh_postgres() {
  stop_all
  data=$(mktemp -d /dev/shm/pglease-go-starter.XXXXXX)
  chown postgres "$data"
  echo dbpass >"$data/pw" && chown postgres "$data/pw"
  runuser -u postgres -- "$pg_bin/initdb" -D "$data/pgdata" --nosync -U dbuser --pwfile="$data/pw" \
    -A scram-sha-256 >/dev/null
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$data/pgdata" -l "$data/log" -w -o \
    "-p $PG_PORT -k $data -c listen_addresses=127.0.0.1 -c shared_buffers=128MB -c fsync=off \
     -c synchronous_commit=off -c full_page_writes=off -c max_connections=100" start >/dev/null
  "$pg_bin/psql" -d postgres -qc "CREATE DATABASE development" -c "CREATE DATABASE spec"
  (cd "$app" && go tool sql-migrate up -env spec >/dev/null \
    && go tool sql-migrate up -env development >/dev/null)
}

start_server() {
  case $1 in
    pglease)
      "$pglease" serve --postgres-url "postgres://dbuser:dbpass@127.0.0.1:$PG_PORT/postgres" \
        --integresql-listen "127.0.0.1:$API_PORT" --integresql-pg-user dbuser \
        --listen "127.0.0.1:$HTTP_PORT" >"$work/$1.log" 2>&1 &
      ;;
    integresql)
      INTEGRESQL_PORT=$API_PORT "$tools/integresql" >"$work/$1.log" 2>&1 &
      ;;
  esac
  server_pid=$!
  for _ in $(seq 120); do
    curl -s -o /dev/null "http://127.0.0.1:$API_PORT/api/v1/templates/x/tests" && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.25
  done
  echo "go-starter.sh: $1 did not start; its log:" >&2
  tail -n 20 "$work/$1.log" >&2
  exit 1
}

declare -A totals=([pglease]="" [integresql]="")
for round in $(seq "$rounds"); do
  for which in integresql pglease; do
    fresh_postgres
    start_server "$which"
    out=$work/run-$which-$round.txt
    (cd "$app" && "$tools/gotestsum" --format dots -- -count=1 ./... >"$out" 2>&1) || true
    stop_all
    done_line=$(grep -a '^DONE' "$out" | tail -n 1)
    [ -n "$done_line" ] || { echo "go-starter.sh: no DONE line from $which; its output:" >&2; tail -n 30 "$out" >&2; exit 1; }
    seconds=$(sed -E 's/.* in ([0-9.]+)s.*/\1/' <<<"$done_line")
    totals[$which]+="$seconds "
    printf 'round %s  %-10s  %s\n' "$round" "$which" "$done_line"
    grep -a '^=== FAIL' "$out" | sed 's/^/    /' || true
  done
done

python3 - "${totals[pglease]}" "${totals[integresql]}" <<'EOF'
import statistics, sys
p = [float(x) for x in sys.argv[1].split()]
i = [float(x) for x in sys.argv[2].split()]
mp, mi = statistics.median(p), statistics.median(i)
print(f"\nmedian of gotestsum's totals: pglease {mp:.1f} s, IntegreSQL v1.1.0 {mi:.1f} s")
print(f"pglease / IntegreSQL: {mp / mi:.2f} (below 1: pglease faster)")
EOF
