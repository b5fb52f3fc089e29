#!/bin/bash
# The example test runner: leases databases from the pglease sidecar over the compose
# network (by its service name, with the token), checks that the template's migrations ran
# exactly once, writes, checks that leases are isolated from each other, and releases.
# Exits non-zero at the first failed check.
set -euo pipefail
: "${PGLEASE_URL:?the sidecar URL, e.g. http://pglease:5480}"
: "${PGLEASE_TOKEN:?the sidecar token}"
template=${PGLEASE_TEMPLATE:-app}
migrations_dir=${MIGRATIONS_DIR:-/migrations}
export PGCONNECT_TIMEOUT=10

say() { printf 'run-tests: %s\n' "$*"; }
fail() {
  say "FAIL: $*"
  exit 1
}
# api METHOD PATH [JSON]: prints the answer; fails on anything but 2xx.
api() {
  local args=(-sS --fail-with-body -X "$1" -H "Authorization: Bearer $PGLEASE_TOKEN")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' --data "$3")
  curl "${args[@]}" "$PGLEASE_URL$2"
}
sql() { psql "$1" -X -q -At -v ON_ERROR_STOP=1 -c "$2"; }
expect() { # what, got, want
  [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
  say "ok: $1 = $3"
}

# The migrations this template was built from, as schema_migrations should list them.
want_versions=$(cd "$migrations_dir" && printf '%s\n' *.sql | sed 's/\.sql$//' | sort | paste -sd, -)
[ -n "$want_versions" ] || fail "no migrations in $migrations_dir"

expect "an unauthenticated lease's status" \
  "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$PGLEASE_URL/lease")" 401

lease1=$(api POST /lease "{\"template\": \"$template\", \"ttl_secs\": 300}")
lease2=$(api POST /lease "{\"template\": \"$template\", \"ttl_secs\": 300}")
id1=$(jq -r .id <<<"$lease1")
id2=$(jq -r .id <<<"$lease2")
url1=$(jq -r .url <<<"$lease1")
url2=$(jq -r .url <<<"$lease2")
say "leased $(jq -r .database <<<"$lease1") and $(jq -r .database <<<"$lease2")"
expect "the advertised host" "$(jq -r .host <<<"$lease1")" "${PGLEASE_HOST:-pglease}"

for url in "$url1" "$url2"; do
  expect "migrations applied in the clone" \
    "$(sql "$url" "SELECT string_agg(version, ',' ORDER BY version) FROM schema_migrations")" \
    "$want_versions"
  expect "rows per migration (none ran twice)" \
    "$(sql "$url" "SELECT count(*) = count(DISTINCT version) FROM schema_migrations")" t
done

# Write into the first database; the second must not see it.
sql "$url1" "INSERT INTO accounts (email) VALUES ('a@example.com');
             INSERT INTO orders (account_id, total_cents) SELECT id, 1250 FROM accounts"
expect "orders written in lease 1" "$(sql "$url1" "SELECT count(*) FROM orders")" 1
expect "accounts seen from lease 2" "$(sql "$url2" "SELECT count(*) FROM accounts")" 0

# A lease's credentials open its own database only.
db2=$(jq -r .database <<<"$lease2")
if sql "${url1%/*}/$db2" "SELECT 1" >/dev/null 2>&1; then
  fail "lease 1's role opened lease 2's database"
fi
say "ok: lease 1's role cannot open lease 2's database"

# The template was built once, however many clones were made from it.
template_info=$(api GET "/templates/$template")
expect "template state" "$(jq -r .state <<<"$template_info")" ready
expect "template versions built" "$(jq -r .version <<<"$template_info")" 1

api DELETE "/leases/$id1" >/dev/null
api DELETE "/leases/$id2" >/dev/null
say "released both leases"
expect "status of a released lease's release" \
  "$(curl -s -o /dev/null -w '%{http_code}' -X DELETE -H "Authorization: Bearer $PGLEASE_TOKEN" "$PGLEASE_URL/leases/$id1")" 404

# A fresh lease after the releases: a clean copy of the same template version.
lease3=$(api POST /lease "{\"template\": \"$template\"}")
url3=$(jq -r .url <<<"$lease3")
expect "accounts in a fresh lease" "$(sql "$url3" "SELECT count(*) FROM accounts")" 0
expect "migrations in a fresh lease" \
  "$(sql "$url3" "SELECT string_agg(version, ',' ORDER BY version) FROM schema_migrations")" \
  "$want_versions"
api DELETE "/leases/$(jq -r .id <<<"$lease3")" >/dev/null
expect "template versions built" "$(api GET "/templates/$template" | jq -r .version)" 1

say "all checks passed"
