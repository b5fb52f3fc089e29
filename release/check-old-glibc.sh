#!/usr/bin/env bash
# Runs release/check-in-container.sh on an older system than the build machine's: Debian 11
# (bullseye: glibc 2.31, PostgreSQL 13 from its packages), the oldest release Debian's
# mirrors still carry. The binary is linked against glibc 2.17's symbols (release/build.sh);
# this shows it runs where glibc is older than the build machine's (2.36) and than the 2.34
# a native build needed.
#
#   bash release/check-old-glibc.sh [release/out/pglease-<version>-<arch>-linux.tar.gz]
#
# No image registry may be reachable: the base image is made with debootstrap once and kept
# in docker as pglease-base-bullseye:local (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."

docker=${DOCKER:-docker}
[ -x /usr/bin/docker ] && [ -z "${DOCKER:-}" ] && docker=/usr/bin/docker
image=pglease-base-bullseye:local
if ! "$docker" image inspect "$image" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  rootfs=$(mktemp -d /var/tmp/pglease-bullseye.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  echo "==> debootstrap --variant=minbase bullseye (about a minute)" >&2
  debootstrap --variant=minbase bullseye "$rootfs" http://deb.debian.org/debian >"$rootfs.log" 2>&1 || {
    tail -n 30 "$rootfs.log" >&2
    exit 1
  }
  rm -f "$rootfs.log"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  tar --numeric-owner -C "$rootfs" -c . | "$docker" import --change 'CMD ["bash"]' - "$image" >/dev/null
fi
# The first line taken inside the container: `docker run … | head -1` outside it closes the
# pipe while docker still writes, and docker's "broken pipe" failed the run under pipefail.
glibc=$("$docker" run --rm "$image" sh -c 'ldd --version | head -n 1')
echo "==> $image: $glibc" >&2
PGLEASE_RUNTIME_IMAGE=$image PGLEASE_CHECK_PG_MAJOR=13 bash release/check-in-container.sh "$@"
