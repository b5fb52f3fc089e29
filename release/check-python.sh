#!/usr/bin/env bash
# Checks the Python wheels the way a pytest user meets them: a fresh virtual environment,
# no Rust toolchain and no pglease on PATH, `pip install --find-links . pytest-pglease` in the
# release directory (it brings pglease-bin, the daemon), psycopg from PyPI, a migrations
# directory and a test file as clients/python/README.md shows them, and
# `pytest --pglease-start`: the plugin starts the wheel's daemon, the test leases a migrated
# database and passes. Prints how long the install and the first test run took.
#
#   bash release/check-python.sh [release/out]
#
# Run without activating the environment (venv/bin/pytest, as CI jobs and IDEs do), so that
# the plugin finds the daemon in its own environment, not on PATH. The daemon runs the
# newest PostgreSQL installed on the machine, else the one it downloaded into its cache.
set -euo pipefail
cd "$(dirname "$0")/.."
. release/lib.sh

out=$(cd "${1:-release/out}" && pwd)
version=$(workspace_version)
(cd "$out" && grep -E " (pglease_bin|pytest_pglease)-$version-" SHA256SUMS | sha256sum --quiet -c -)

work=$(mktemp -d /tmp/pglease-python-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The daemon reads template sources as its child user (nobody when run as root): the
# project directory must be readable by it, as a checkout under /home usually is.
chmod 0755 "$work"
python=$(command -v python3)
"$python" -m venv "$work/venv"

# The user's shell: the system's tools, not this checkout's nor ~/.cargo's.
user_env=(env -i "PATH=/usr/bin:/bin" "HOME=$work" "LANG=C.UTF-8")
if "${user_env[@]}" sh -c 'command -v cargo || command -v rustc || command -v pglease' >/dev/null; then
  echo "release/check-python.sh: cargo, rustc or pglease is on the user's PATH; the check would prove nothing" >&2
  exit 1
fi

mkdir -p "$work/app/db/migrations"
cat > "$work/app/db/migrations/0001_orders.sql" <<'SQL'
CREATE TABLE orders (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, total_cents bigint NOT NULL);
SQL
cat > "$work/app/test_orders.py" <<'PY'
import psycopg


def test_refund(pglease_db):
    with psycopg.connect(pglease_db.dsn) as conn:
        conn.execute("INSERT INTO orders (customer_id, total_cents) VALUES (1, 500)")
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
PY

port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

started=$(date +%s%N)
# README.md's install line, in the release directory, then the test's driver.
pip=("${user_env[@]}" "$work/venv/bin/pip" --quiet --disable-pip-version-check)
(cd "$out" && "${pip[@]}" install --find-links . pytest-pglease)
"${pip[@]}" install 'psycopg[binary]'
installed=$(date +%s%N)
if ! (cd "$work/app" && "${user_env[@]}" "$work/venv/bin/pytest" -p no:cacheprovider \
  --pglease-start --pglease-url "http://127.0.0.1:$port" --pglease-template app --pglease-serve-arg=--template=app=migrations:db/migrations \
  test_orders.py > "$work/pytest.log" 2>&1); then
  echo "release/check-python.sh: pytest failed; its output:" >&2
  cat "$work/pytest.log" >&2
  exit 1
fi
passed=$(date +%s%N)
grep -q "1 passed" "$work/pytest.log" || { cat "$work/pytest.log" >&2; exit 1; }
[ -x "$work/venv/bin/pglease" ] || { echo "release/check-python.sh: the venv has no bin/pglease" >&2; exit 1; }
"$work/venv/bin/pglease" --version | head -1
ms() { echo $(( ($2 - $1) / 1000000 )); }
echo "release/check-python.sh: pip install $(ms "$started" "$installed") ms, first pytest run $(ms "$installed" "$passed") ms (daemon start, template, lease, test): passed"
