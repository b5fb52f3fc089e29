#!/usr/bin/env bash
# Boots deploy/systemd/pglease.service under a real systemd — PID 1 of a container — and
# checks what a CI host would see: `systemctl start` returns once pglease has sent READY=1
# (postgres up, the default template built), a lease works and its database accepts the
# lease's credentials, the journal has pglease's lines with their priorities (a failed
# template build is a warning, info lines are not), and `systemctl stop` ends it
# cleanly (exit 0, postgres and its data gone).
#
# Uses docker and the debian:bookworm-slim image (deploy/test.sh makes a local one where no
# registry is reachable) and a release binary (cargo build --release -p pglease; a
# bookworm-compatible glibc is needed, which the host's is). Exits non-zero on failure.
#
#   bash deploy/systemd/boot-test.sh
#   PGLEASE_DEB=release/out/pglease_0.1.0-1_amd64.deb bash deploy/systemd/boot-test.sh
#
# With PGLEASE_DEB the Debian package (release/build.sh) is installed with apt instead of
# copying the binary and the unit: the unit it installs starts at boot, with the token its
# postinst made; a purge at the end removes the unit and the token.
set -euo pipefail
cd "$(dirname "$0")/../.."

docker=${DOCKER:-docker}
# Debian's docker client where both exist (deploy/test.sh does the same).
[ -x /usr/bin/docker ] && [ -z "${DOCKER:-}" ] && docker=/usr/bin/docker
base=${PGLEASE_RUNTIME_IMAGE:-debian:bookworm-slim}
binary=${PGLEASE_BINARY:-target/release/pglease}
deb=${PGLEASE_DEB:-}
image=pglease-systemd-boot:local
name=pglease-systemd-boot-$$

if [ -z "$deb" ] && [ ! -x "$binary" ]; then
  echo "==> building $binary"
  cargo build --release --locked -p pglease
fi

context=$(mktemp -d /var/tmp/pglease-systemd-boot.XXXXXX)
cleanup() {
  local status=$?
  if [ "$status" -ne 0 ]; then
    # What the unit said, before the container goes.
    "$docker" exec "$name" systemctl status --no-pager pglease 2>&1 | tail -n 20 || true
    "$docker" exec "$name" journalctl -u pglease --no-pager -o cat 2>&1 | tail -n 40 || true
  fi
  "$docker" rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$context"
  if [ "$status" -eq 0 ]; then echo "boot-test: passed"; else echo "boot-test: FAILED" >&2; fi
  exit "$status"
}
trap cleanup EXIT

if [ -n "$deb" ]; then
  cp "$deb" "$context/pglease.deb"
  install_pglease='COPY pglease.deb /tmp/pglease.deb
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends /tmp/pglease.deb \
    && rm -rf /var/lib/apt/lists/* /tmp/pglease.deb'
else
  cp "$binary" "$context/pglease"
  cp deploy/systemd/pglease.service deploy/systemd/pglease.toml "$context/"
  install_pglease="COPY pglease /usr/local/bin/pglease
COPY pglease.service /etc/systemd/system/pglease.service
COPY pglease.toml /etc/pglease/pglease.toml
RUN printf 'boot-test-token\\n' > /etc/pglease/token && chmod 600 /etc/pglease/token"
fi
cat >"$context/Dockerfile" <<EOF
FROM $base
RUN set -eux; export DEBIAN_FRONTEND=noninteractive; \\
    apt-get update; \\
    apt-get install -y --no-install-recommends postgresql-common; \\
    sed -ri 's/^#?\\s*create_main_cluster\\s*=.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf; \\
    apt-get install -y --no-install-recommends systemd systemd-sysv libnss-systemd dbus procps postgresql-15 postgresql-client-15 curl; \\
    rm -rf /var/lib/apt/lists/*; \\
    systemctl mask getty.target systemd-logind.service console-getty.service
$install_pglease
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
EOF
echo "==> building $image"
"$docker" build -q -t "$image" "$context" >/dev/null

echo "==> booting systemd in a container"
# Not --privileged: where the host lacks a capability (CAP_SYS_RESOURCE in some sandboxes)
# docker cannot grant it; every capability but that one, and no seccomp filter, is enough.
"$docker" run -d --name "$name" --cap-add ALL --cap-drop SYS_RESOURCE \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined --cgroupns=host \
  -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock --tmpfs /tmp \
  "$image" >/dev/null
in_box() { "$docker" exec "$name" "$@"; }
for _ in $(seq 1 100); do
  state=$(in_box systemctl is-system-running 2>/dev/null || true)
  case "$state" in running|degraded) break ;; esac
  sleep 0.2
done
echo "system state: $state"

echo "==> systemctl start pglease (returns once READY=1 arrived)"
started=$SECONDS
in_box systemctl start pglease
echo "started in $((SECONDS - started)) s: $(in_box systemctl is-active pglease)"
[ "$(in_box systemctl show -p Type --value pglease)" = notify ]
user=$(in_box systemctl show -p User --value pglease)
pid=$(in_box systemctl show -p MainPID --value pglease)
echo "main pid $pid, user $(in_box ps -o user= -p "$pid") (unit User=$user, DynamicUser=yes)"

if [ -n "$deb" ]; then
  # The package's unit runs /usr/bin/pglease, with the token its postinst made.
  in_box systemctl show -p ExecStart --value pglease | grep -q '/usr/bin/pglease serve' \
    || { echo "the package's unit does not run /usr/bin/pglease" >&2; exit 1; }
  token=$(in_box cat /etc/pglease/token)
  [ -n "$token" ] || { echo "the package made no token" >&2; exit 1; }
else
  token=boot-test-token
fi

echo "==> a lease through the unit's daemon"
# The unit reads the token from its credential: without it the API answers 401.
code=$(in_box curl -s -o /dev/null -w '%{http_code}' -X POST http://127.0.0.1:5480/lease)
[ "$code" = 401 ] || { echo "a lease without the token got HTTP $code, not 401" >&2; exit 1; }
auth="Authorization: Bearer $token"
lease=$(in_box curl -sf -X POST -H "$auth" http://127.0.0.1:5480/lease)
url=$(printf '%s' "$lease" | python3 -c 'import json, sys; print(json.load(sys.stdin)["url"])')
in_box psql "$url" -v ON_ERROR_STOP=1 -tAc "CREATE TABLE t (x int); INSERT INTO t VALUES (1); SELECT current_user || ' ' || count(*) FROM t"
postgres_user=$(in_box ps -o user= -C postgres | sort -u | tr '\n' ' ')
echo "postgres runs as: $postgres_user"
case "$postgres_user" in *root*) echo "postgres runs as root" >&2; exit 1 ;; esac

echo "==> a template whose SQL fails: the daemon answers and logs a warning"
in_box sh -c 'printf "CREATE TABLE broken (;\n" > /opt/broken.sql && chmod 644 /opt/broken.sql'
in_box curl -sf -X PUT -H "$auth" -H 'Content-Type: application/json' -d '{"sql": "/opt/broken.sql"}' \
  http://127.0.0.1:5480/templates/broken >/dev/null
code=$(in_box curl -s -o /dev/null -w '%{http_code}' -X POST -H "$auth" -H 'Content-Type: application/json' \
  -d '{"template": "broken", "wait_ms": 20000}' http://127.0.0.1:5480/lease)
echo "lease from it: HTTP $code"
case "$code" in 2*) echo "a broken template gave a lease" >&2; exit 1 ;; esac

echo "==> the journal"
in_box journalctl --sync 2>/dev/null || true
in_box journalctl -u pglease --no-pager -o cat | grep -E "listening|template built|lease granted" | sed -n 1,5p
# Lines carry a syslog priority prefix, which journald turns into the entry's priority:
# `-p warning` shows the failed build and none of the info lines.
warnings=$(in_box journalctl -u pglease --no-pager -o cat -p warning)
echo "warnings and errors:"; sed -n 1,5p <<<"$warnings"
grep -q "template build failed" <<<"$warnings" \
  || { echo "the failed build is not a warning in the journal" >&2; exit 1; }
if grep -q "listening" <<<"$warnings"; then
  echo "info lines are logged as warnings" >&2; exit 1
fi
if in_box journalctl -u pglease --no-pager -o cat | grep -qE '^(<[0-9]>| )'; then
  echo "journal lines carry a raw prefix or padding" >&2; exit 1
fi

echo "==> systemctl stop pglease"
in_box systemctl stop pglease
result=$(in_box systemctl show -p Result --value pglease)
status=$(in_box systemctl show -p ExecMainStatus --value pglease)
echo "result $result, exit status $status"
[ "$result" = success ] && [ "$status" = 0 ]
if in_box pgrep -x postgres >/dev/null; then echo "postgres still running" >&2; exit 1; fi
leftover=$(in_box sh -c 'ls -A /run/pglease 2>/dev/null | wc -l')
[ "$leftover" = 0 ] || { echo "data left in /run/pglease" >&2; exit 1; }
echo "postgres stopped, /run/pglease removed"

if [ -n "$deb" ]; then
  echo "==> apt-get purge pglease"
  in_box env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq pglease >/dev/null
  for gone in /usr/bin/pglease /lib/systemd/system/pglease.service /etc/pglease/token; do
    if in_box test -e "$gone"; then echo "$gone is left after the purge" >&2; exit 1; fi
  done
  echo "purged: binary, unit and token gone"
fi
