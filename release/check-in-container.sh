#!/usr/bin/env bash
# Runs release/check.sh where a user installs pglease: a Debian bookworm container with
# PostgreSQL 15, psql and curl from Debian's packages, and no Rust toolchain, cargo cache
# or checkout — only the tarball, its SHA256SUMS and the check script are put in.
#
#   bash release/check-in-container.sh [release/out/pglease-<version>-<arch>-linux.tar.gz]
#
# Uses docker and the debian:bookworm-slim image (deploy/test.sh makes a local one where no
# registry is reachable; PGLEASE_RUNTIME_IMAGE names another, PGLEASE_CHECK_PG_MAJOR the
# PostgreSQL its packages have, 15 by default). Exits non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

docker=${DOCKER:-docker}
[ -x /usr/bin/docker ] && [ -z "${DOCKER:-}" ] && docker=/usr/bin/docker
base=${PGLEASE_RUNTIME_IMAGE:-debian:bookworm-slim}
pg_major=${PGLEASE_CHECK_PG_MAJOR:-15}
image=pglease-release-check-${base//[:\/]/-}:local
tarball=${1:-$(ls -t release/out/pglease-*-linux.tar.gz 2>/dev/null | head -1)}
[ -f "$tarball" ] || { echo "release/check-in-container.sh: no tarball (run release/build.sh)" >&2; exit 1; }

context=$(mktemp -d /var/tmp/pglease-release-check.XXXXXX)
trap 'rm -rf "$context"' EXIT
cat >"$context/Dockerfile" <<DOCKERFILE
FROM $base
RUN set -eux; export DEBIAN_FRONTEND=noninteractive; \\
    apt-get update; \\
    apt-get install -y --no-install-recommends postgresql-common; \\
    sed -ri 's/^#?\\s*create_main_cluster\\s*=.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf; \\
    apt-get install -y --no-install-recommends postgresql-$pg_major postgresql-client-$pg_major curl ca-certificates; \\
    rm -rf /var/lib/apt/lists/*
DOCKERFILE
echo "==> building $image (on $base: Debian's postgresql-$pg_major, psql, curl; no Rust)"
"$docker" build -q -t "$image" "$context" >/dev/null

mkdir -p "$context/release/out"
cp "$tarball" "$(dirname "$tarball")/SHA256SUMS" "$context/release/out/"
cp release/check.sh "$context/release/"
echo "==> release/check.sh in a container"
# pglease mounts a tmpfs for its databases (CAP_SYS_ADMIN) and wants room in /dev/shm.
"$docker" run --rm --cap-add ALL --cap-drop SYS_RESOURCE \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  --shm-size 1g --tmpfs /tmp:exec \
  -v "$context/release:/opt/release:ro" -w /opt \
  "$image" bash /opt/release/check.sh "/opt/release/out/$(basename "$tarball")"
