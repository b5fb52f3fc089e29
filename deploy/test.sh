#!/usr/bin/env bash
# Builds the container image and runs the compose example end to end: the `tests` service
# leases databases from the pglease sidecar over the compose network, checks the migrations
# ran once, writes, and releases (deploy/compose/tests/run-tests.sh).
#
# On a bare Debian machine it installs docker.io, docker-compose and debootstrap, starts
# dockerd, and, since no image registry may be reachable, builds local stand-ins for the
# base images (deploy/README.md, "Base images without a registry"): debian:bookworm-slim
# from debootstrap, rust:<version>-slim-bookworm from it plus the host's stable toolchain.
# Images stay in docker as the cache of the next run; containers and networks are removed.
# Then copy-on-write clones (--storage cow, PostgreSQL 18): a privileged container that makes
# its own store, and an unprivileged one on an XFS with reflinks the script mounts.
# Needs root (or a docker the caller may use). Exits non-zero when anything fails.
#
#   bash deploy/test.sh                # all of the above
#   bash deploy/test.sh --build-only   # only the image (release/build.sh --image uses this)
#
# Environment: PGLEASE_RUST_IMAGE / PGLEASE_RUNTIME_IMAGE (base images; if they exist
# locally, e.g. pulled, they are used as they are), PGLEASE_IMAGE (tag of the result,
# default pglease:<version>, the tag compose and the Kubernetes files name; it is also
# tagged pglease:local, which release/image.sh saves), DOCKER (the docker client).
set -euo pipefail
cd "$(dirname "$0")/.."
. release/lib.sh

build_only=0
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    *) echo "deploy/test.sh: unknown argument $arg (--build-only, or none)" >&2; exit 64 ;;
  esac
done

version=$(workspace_version)
image=${PGLEASE_IMAGE:-pglease:$version}
tests_image=${PGLEASE_TESTS_IMAGE:-pglease-compose-tests:local}
runtime_image=${PGLEASE_RUNTIME_IMAGE:-debian:bookworm-slim}
project=pglease-deploy-test
compose_file=deploy/compose/docker-compose.yml

# --- timings -------------------------------------------------------------------------
script_start=$SECONDS
phase_name=""
phase_start=$SECONDS
timings=()
phase() {
  end_phase
  phase_name=$1
  phase_start=$SECONDS
  printf '\n==> deploy/test.sh: %s\n' "$phase_name"
}
end_phase() {
  if [ -n "$phase_name" ]; then
    timings+=("$(printf '%5ds  %s' $((SECONDS - phase_start)) "$phase_name")")
  fi
  phase_name=""
}

# --- clean-up --------------------------------------------------------------------------
scratch=$(mktemp -d /var/tmp/pglease-deploy-test.XXXXXX)
compose=()
containers=()
xfs_mount=""
on_exit() {
  local status=$?
  local failed_phase=$phase_name
  end_phase
  if [ ${#compose[@]} -gt 0 ]; then
    "${compose[@]}" down --volumes --remove-orphans >/dev/null 2>&1 || true
  fi
  for container in "${containers[@]}"; do
    "$DOCKER" rm -f "$container" >/dev/null 2>&1 || true
  done
  if [ -n "$xfs_mount" ] && mountpoint -q "$xfs_mount"; then
    umount "$xfs_mount" || true
  fi
  rm -rf "$scratch" deploy/docker/cargo/vendor deploy/docker/cargo/config.toml \
    deploy/docker/binaries/postgresql-*
  printf '\n==> deploy/test.sh timings\n'
  printf '%s\n' "${timings[@]}"
  printf '%5ds  total\n' $((SECONDS - script_start))
  if [ "$status" -ne 0 ]; then
    printf '\ndeploy/test.sh: FAILED (exit %d) in phase: %s\n' "$status" "${failed_phase:-?}" >&2
  else
    printf '\ndeploy/test.sh: passed\n'
  fi
  exit "$status"
}
trap on_exit EXIT

# --- tools -----------------------------------------------------------------------------
phase "tools"
apt_updated=""
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$apt_updated" ]; then
    apt-get update -qq
    apt_updated=1
  fi
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
# Compose: v2 (`docker compose`) where installed, else Debian's docker-compose 1.29.
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; then
  missing+=(docker-compose)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  apt_install "${missing[@]}"
fi
# The client that came with the daemon: a newer stray client elsewhere on PATH may default
# to a BuildKit plugin that is not installed.
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi
if "$DOCKER" compose version >/dev/null 2>&1; then
  compose_cmd=("$DOCKER" compose)
else
  compose_cmd=(docker-compose)
fi
compose=("${compose_cmd[@]}" -p "$project" -f "$compose_file")
"$DOCKER" --version
echo "compose: ${compose_cmd[*]} $("${compose_cmd[@]}" version --short)"

# --- dockerd ---------------------------------------------------------------------------
phase "dockerd"
# Started in the background and left running for later runs (its images are the cache).
start_dockerd() { # storage driver
  echo "starting dockerd (storage driver $1), log: /var/log/pglease-dockerd.log"
  setsid dockerd --storage-driver "$1" >>/var/log/pglease-dockerd.log 2>&1 </dev/null &
  local pid=$!
  for _ in $(seq 60); do
    if "$DOCKER" info >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.5
  done
  # Not answering after 30 s: stop this one before trying again.
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return 1
}
if "$DOCKER" info >/dev/null 2>&1; then
  echo "dockerd is running"
elif ! start_dockerd overlay2; then
  # overlay2 needs a backing file system that supports it; vfs works anywhere, slowly.
  start_dockerd vfs || {
    tail -n 30 /var/log/pglease-dockerd.log >&2
    echo "dockerd did not start" >&2
    exit 1
  }
fi
"$DOCKER" info --format 'storage driver: {{.Driver}}, server {{.ServerVersion}}'

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# --- base image: debian:bookworm-slim --------------------------------------------------
phase "base image $runtime_image"
if have_image "$runtime_image"; then
  echo "$runtime_image exists: using it"
else
  command -v debootstrap >/dev/null || apt_install debootstrap
  rootfs=$scratch/rootfs
  echo "debootstrap --variant=minbase bookworm (about a minute)"
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$scratch/debootstrap.log" 2>&1 || {
    tail -n 30 "$scratch/debootstrap.log" >&2
    exit 1
  }
  # What the official slim image adds: updates and security in the sources, no docs,
  # man pages or translations, no package caches.
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
APT::AutoRemove::SuggestsImportant "false";
EOF
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$rootfs"/usr/share/{man,info,groff,lintian}/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
  find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  tar --numeric-owner -C "$rootfs" -c . |
    "$DOCKER" import --change 'CMD ["bash"]' \
      --change 'LABEL org.pglease.stand-in="debootstrap --variant=minbase bookworm"' \
      - "$runtime_image"
  rm -rf "$rootfs"
fi

# --- base image: the rust builder --------------------------------------------------------
default_rust_image=$(sed -n 's/^ARG RUST_IMAGE=//p' deploy/docker/Dockerfile)
rust_image=${PGLEASE_RUST_IMAGE:-}
if [ -n "$rust_image" ] && ! have_image "$rust_image"; then
  echo "PGLEASE_RUST_IMAGE=$rust_image: no such image here" >&2
  exit 1
fi
if [ -z "$rust_image" ] && have_image "$default_rust_image"; then
  rust_image=$default_rust_image
fi
if [ -z "$rust_image" ]; then
  # The host's default stable toolchain, installed the way the official image installs one.
  command -v rustup >/dev/null || {
    echo "no $default_rust_image image and no rustup toolchain to make a stand-in from" >&2
    exit 1
  }
  toolchain_dir=$(cd / && dirname "$(dirname "$(RUSTUP_TOOLCHAIN=stable rustup which rustc)")")
  rust_version=$("$toolchain_dir/bin/rustc" --version | awk '{print $2}')
  rust_image=rust:${rust_version%.*}-slim-bookworm
fi
phase "base image $rust_image"
if have_image "$rust_image"; then
  echo "$rust_image exists: using it"
else
  host=$("$toolchain_dir/bin/rustc" -vV | sed -n 's/^host: //p')
  context=$scratch/rust-context
  tc=$context/rustup/toolchains/$rust_version-$host
  mkdir -p "$tc/bin" "$tc/lib/rustlib" "$context/cargo/bin"
  # The minimal profile: rustc (with rustdoc), cargo and the standard library; no docs,
  # clippy or rustfmt. Copies, not links: they are made world-writable below.
  cp -a "$toolchain_dir/bin/rustc" "$toolchain_dir/bin/rustdoc" "$toolchain_dir/bin/cargo" "$tc/bin/"
  cp -a "$toolchain_dir"/lib/*.so* "$tc/lib/"
  cp -a "$toolchain_dir/lib/rustlib/$host" "$toolchain_dir/lib/rustlib/etc" "$tc/lib/rustlib/"
  for component in rustc cargo rust-std; do
    cp -a "$toolchain_dir/lib/rustlib/manifest-$component-$host" "$tc/lib/rustlib/"
    echo "$component-$host" >>"$tc/lib/rustlib/components"
  done
  for file in rust-installer-version multirust-config.toml multirust-channel-manifest.toml; do
    if [ -e "$toolchain_dir/lib/rustlib/$file" ]; then
      cp -a "$toolchain_dir/lib/rustlib/$file" "$tc/lib/rustlib/"
    fi
  done
  printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n\n[overrides]\n' \
    "$rust_version-$host" >"$context/rustup/settings.toml"
  cp "$(command -v rustup)" "$context/cargo/bin/rustup"
  for proxy in cargo cargo-clippy cargo-fmt cargo-miri clippy-driver rls rust-analyzer \
    rust-gdb rust-gdbgui rust-lldb rustc rustdoc rustfmt; do
    ln "$context/cargo/bin/rustup" "$context/cargo/bin/$proxy"
  done
  # As the official image: anyone may add components or install crates.
  chmod -R a+w "$context"
  du -sh "$context"
  "$DOCKER" build -q -f deploy/docker/standin/rust.Dockerfile \
    --build-arg BASE_IMAGE="$runtime_image" --build-arg RUST_VERSION="$rust_version" \
    --label org.pglease.stand-in="host rustup toolchain $rust_version" \
    -t "$rust_image" "$context"
  rm -rf "$context"
fi

# --- the images under test -------------------------------------------------------------
phase "cargo vendor"
# Build containers do not reach crates.io here (TLS to it is intercepted by a CA that only
# the host trusts), so the crates go into the build context: the builder stage copies
# deploy/docker/cargo/ to /src/.cargo/. Cheap: from the host's cargo cache; removed at exit.
vendor_dir=deploy/docker/cargo/vendor
rm -rf "$vendor_dir" deploy/docker/cargo/config.toml
cargo vendor --quiet --locked --offline --versioned-dirs "$vendor_dir" >/dev/null 2>&1 ||
  cargo vendor --quiet --locked --versioned-dirs "$vendor_dir" >/dev/null
cat >deploy/docker/cargo/config.toml <<'TOML'
# Written by deploy/test.sh: build from the vendored crates, offline.
[source.crates-io]
replace-with = "vendored-sources"

[source.vendored-sources]
directory = "/src/.cargo/vendor"
TOML
du -sh "$vendor_dir"

phase "postgres 18 for the image"
# The image fetches PostgreSQL 18 into pglease's cache at build time (POSTGRES_VERSIONS);
# build containers here reach no registry, so the host's pglease fetches it (from its own
# cache after the first run) and the build context carries it (deploy/docker/binaries/).
pglease_binary=${PGLEASE_BINARY:-}
if [ -z "$pglease_binary" ]; then
  cargo build --quiet --bin pglease
  pglease_binary=target/debug/pglease
fi
pg18_bin=$("$pglease_binary" postgres fetch 18)
cp -a "$(dirname "$pg18_bin")" deploy/docker/binaries/
du -sh deploy/docker/binaries/postgresql-*

phase "docker build $image"
# The classic builder: it needs no buildx plugin, and sees locally made base images as they
# are. The builder stage is tagged too, so that its layers (the compiled dependencies) stay
# the cache of the next run while the previous run's images, untagged now, are pruned.
label=org.pglease.deploy-test
build_args=(--build-arg RUST_IMAGE="$rust_image" --build-arg RUNTIME_IMAGE="$runtime_image"
  --build-arg PGLEASE_COMMIT="$(git rev-parse --short=12 HEAD 2>/dev/null || true)")
DOCKER_BUILDKIT=0 "$DOCKER" build -f deploy/docker/Dockerfile "${build_args[@]}" \
  --target builder --label "$label=builder" -t "${image%%:*}-builder:local" .
DOCKER_BUILDKIT=0 "$DOCKER" build -f deploy/docker/Dockerfile "${build_args[@]}" \
  --label "$label=image" -t "$image" -t pglease:local .
"$DOCKER" image ls "$image" --format 'image {{.Repository}}:{{.Tag}}: {{.Size}}'
[ "$build_only" = 1 ] && exit 0

phase "docker build $tests_image"
DOCKER_BUILDKIT=0 "$DOCKER" build --build-arg BASE_IMAGE="$runtime_image" \
  --label "$label=tests" -t "$tests_image" deploy/compose/tests
"$DOCKER" image prune --force --filter "label=$label" >/dev/null

# --- the image on its own ----------------------------------------------------------------
phase "image checks"
# No token with a non-loopback listen address: refused (exit 64) before anything starts.
set +e
out=$("$DOCKER" run --rm --tmpfs /var/lib/pglease --tmpfs /var/lib/pglease/databases "$image" 2>&1)
status=$?
set -e
if [ "$status" -ne 64 ] || ! grep -q "token" <<<"$out"; then
  echo "expected exit 64 and a word about the token without PGLEASE_TOKEN, got $status: $out" >&2
  exit 1
fi
echo "ok: refuses to listen on all interfaces without a token"
# One tmpfs, none for the databases: refused (exit 64) rather than letting one lease that
# fills it make postgres restart.
set +e
out=$("$DOCKER" run --rm --tmpfs /var/lib/pglease -e PGLEASE_TOKEN=x "$image" 2>&1)
status=$?
set -e
if [ "$status" -ne 64 ] || ! grep -q "databases-dir /var/lib/pglease/databases" <<<"$out"; then
  echo "expected exit 64 naming --databases-dir without the databases' tmpfs, got $status: $out" >&2
  exit 1
fi
echo "ok: refuses to start without the databases' tmpfs"
# No tmpfs: refused rather than running fsync-off postgres on the overlay file system.
set +e
out=$("$DOCKER" run --rm -e PGLEASE_TOKEN=x "$image" --no-databases-dir 2>&1)
status=$?
set -e
if [ "$status" -ne 1 ] || ! grep -q "not tmpfs" <<<"$out"; then
  echo "expected exit 1 and 'not tmpfs' without a tmpfs, got $status: $out" >&2
  exit 1
fi
echo "ok: refuses a data directory that is not tmpfs"
echo "runs as: $("$DOCKER" run --rm --entrypoint id "$image")"

# --- copy-on-write clones ------------------------------------------------------------------
# status_of CONTAINER: GET /status, from inside the container.
status_of() { "$DOCKER" exec "$1" pglease status --json; }
# wait_ready CONTAINER: until /readyz answers (or the container is gone).
wait_ready() {
  for _ in $(seq 120); do
    if "$DOCKER" exec "$1" pglease-healthcheck /readyz >/dev/null 2>&1; then return 0; fi
    if [ "$("$DOCKER" inspect --format '{{.State.Running}}' "$1")" != true ]; then break; fi
    sleep 0.5
  done
  "$DOCKER" logs "$1" 2>&1 | tail -n 30 >&2
  echo "the container did not become ready" >&2
  return 1
}
# expect_clones CONTAINER KIND: the server clones (file_copy_method = clone) on storage KIND,
# and a lease of the template can be written in.
expect_clones() {
  local status method kind url
  status=$(status_of "$1")
  method=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["postgres"]["settings"].get("file_copy_method"))' <<<"$status")
  kind=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["postgres"]["storage"]["kind"])' <<<"$status")
  if [ "$method" != clone ] || [ "$kind" != "$2" ]; then
    echo "expected file_copy_method clone on storage $2, got $method on $kind:" >&2
    python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["postgres"], indent=1))' <<<"$status" >&2
    return 1
  fi
  url=$("$DOCKER" exec "$1" pglease lease --template default)
  "$DOCKER" exec "$1" psql "$url" -v ON_ERROR_STOP=1 -qc 'CREATE TABLE t (i int); INSERT INTO t VALUES (1)'
  echo "ok: storage $kind, file_copy_method clone, a lease written in"
}
# stop_cleanly CONTAINER: docker stop, which must end in exit 0 (its log's tail otherwise).
stop_cleanly() {
  local exit_code
  "$DOCKER" stop -t 30 "$1" >/dev/null
  exit_code=$("$DOCKER" inspect --format '{{.State.ExitCode}}' "$1")
  if [ "$exit_code" != 0 ]; then
    echo "after docker stop: exit $exit_code" >&2
    "$DOCKER" logs "$1" 2>&1 | tail -n 20 >&2
    return 1
  fi
}
# loops_of PATTERN: loop devices whose backing file matches PATTERN (a privileged
# container's loop devices are the host's).
loops_of() {
  grep -l -- "$1" /sys/block/loop*/loop/backing_file 2>/dev/null | wc -l || true
}
cow_token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

phase "the databases' room: a lease that fills it fails alone"
# As kubernetes/sidecar-job.yaml's non-root sidecar (read-only root, every capability dropped)
# with its two memory volumes: WAL and the catalogs on the first tmpfs, the databases on the
# second (pglease.toml's databases_dir), small so that one lease fills it in seconds. With
# --lease-max-bytes=off the filler is not ended first: it fills the room itself.
cid=$("$DOCKER" run -d --read-only --cap-drop ALL --security-opt no-new-privileges \
  --tmpfs /var/lib/pglease:size=256m --tmpfs /var/lib/pglease/databases:size=128m \
  -e PGLEASE_TOKEN="$cow_token" "$image" --min-ready=1 --lease-max-bytes=off)
containers+=("$cid")
wait_ready "$cid"
filler=$("$DOCKER" exec "$cid" pglease lease --template default)
bystander=$("$DOCKER" exec "$cid" pglease lease --template default)
"$DOCKER" exec "$cid" psql "$bystander" -v ON_ERROR_STOP=1 -qc 'CREATE TABLE mine (n int); INSERT INTO mine VALUES (1)'
"$DOCKER" exec "$cid" psql "$filler" -v ON_ERROR_STOP=1 -qc 'CREATE TABLE fill (n int, pad text)'
filled=
for _ in $(seq 40); do
  # VERBOSITY verbose: the error's SQLSTATE is printed.
  if ! out=$("$DOCKER" exec "$cid" psql "$filler" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -qc \
    "INSERT INTO fill SELECT g, md5(g::text) || md5((g + 1)::text) FROM generate_series(1, 100000) g" 2>&1); then
    filled=$out
    break
  fi
done
if ! grep -q "53100" <<<"$filled" || ! grep -Eq "No space left on device|free disk space" <<<"$filled"; then
  echo "expected the filler to get 53100 (No space left on device), got: ${filled:-no error in 40 batches}" >&2
  exit 1
fi
echo "ok: the filler got: $(grep -m1 ERROR <<<"$filled")"
# The other lease still writes (a row that fits its page), and postgres did not restart.
"$DOCKER" exec "$cid" psql "$bystander" -v ON_ERROR_STOP=1 -qc 'INSERT INTO mine VALUES (2)'
# The room is measured every 250 ms: a few looks until /status says it is full.
for _ in $(seq 20); do
  room=$(status_of "$cid" | python3 -c '
import json, sys
postgres = json.load(sys.stdin)["postgres"]
space = postgres["databases_space"] or {}
print(postgres["restarts"], space.get("bytes"), space.get("full"))')
  read -r restarts room_bytes room_full <<<"$room"
  [ "$room_full" = True ] && break
  sleep 0.5
done
if [ "$restarts" != 0 ] || [ "$room_bytes" != $((128 << 20)) ] || [ "$room_full" != True ]; then
  echo "expected 0 restarts and the 128 MiB room full in /status, got: $room" >&2
  "$DOCKER" logs "$cid" 2>&1 | tail -n 30 >&2
  exit 1
fi
echo "ok: the other lease still writes; /status: restarts 0, the databases' room ($room_bytes bytes) full"
stop_cleanly "$cid"
"$DOCKER" rm "$cid" >/dev/null

phase "copy-on-write clones: a container makes its store"
# Root with CAP_SYS_ADMIN and the loop devices: what --privileged gives, narrowed (docker
# here may not grant every capability --privileged asks for). A read-only root, as in
# kubernetes/sidecar-job-cow.yaml.
# The container gets the device nodes that exist when it starts, and mount -o loop takes
# the first free device: make sure that one has a node (LOOP_CTL_GET_FREE adds a device
# when none is free; a fresh machine may have none yet).
losetup -f >/dev/null
loop_devices=()
for device in /dev/loop-control /dev/loop[0-9]*; do
  [ -b "$device" ] || [ -c "$device" ] && loop_devices+=(--device "$device")
done
cid=$("$DOCKER" run -d --user 0:0 --cap-add SYS_ADMIN "${loop_devices[@]}" \
  --security-opt apparmor=unconfined --read-only --tmpfs /var/lib/pglease:size=1g \
  -e PGLEASE_TOKEN="$cow_token" "$image" --postgres-version=18 --storage=cow --min-ready=1 \
  --no-databases-dir)
containers+=("$cid")
wait_ready "$cid"
expect_clones "$cid" cow
store_loops=$(loops_of /var/lib/pglease/data/cow.xfs)
if [ "$store_loops" -lt 1 ]; then
  echo "no loop device backs the container's store" >&2
  exit 1
fi
stop_cleanly "$cid"
left=$(loops_of /var/lib/pglease/data/cow.xfs)
if [ "$left" -ne 0 ]; then
  echo "after docker stop: $left loop device(s) of the store left" >&2
  exit 1
fi
# The end of the container's mount namespace would unmount the store and free its loop
# device even if pglease had not: that pglease removed its instance directory, which it
# cannot while the store is mounted on cow/ inside it, says that pglease unmounted it.
# The log is read whole first: `docker logs | grep -q` fails under pipefail when grep
# stops at the match before docker has written the rest (SIGPIPE).
cow_log=$("$DOCKER" logs "$cid" 2>&1)
if ! grep -q "removed the instance directory" <<<"$cow_log"; then
  echo "pglease did not remove its instance directory (the store's mount point) at the stop:" >&2
  tail -n 20 <<<"$cow_log" >&2
  exit 1
fi
echo "ok: pglease unmounted its store at the stop (exit 0), and its loop device" \
  "($store_loops while it ran) is free"
"$DOCKER" rm "$cid" >/dev/null

phase "copy-on-write clones: a volume on an XFS with reflinks, unprivileged"
command -v mkfs.xfs >/dev/null || apt_install xfsprogs # on the host, for the volume
xfs_mount=$scratch/xfs
mkdir -p "$xfs_mount"
truncate -s 1G "$scratch/xfs.img"
mkfs.xfs -q -f -m reflink=1 "$scratch/xfs.img"
mount -o loop "$scratch/xfs.img" "$xfs_mount"
chown 10001:10001 "$xfs_mount"
# As kubernetes/sidecar-job.yaml's non-root sidecar: read-only root, every capability
# dropped, no privilege escalation.
cid=$("$DOCKER" run -d --read-only --cap-drop ALL --security-opt no-new-privileges \
  -v "$xfs_mount:/var/lib/pglease" -e PGLEASE_TOKEN="$cow_token" \
  "$image" --postgres-version=18 --storage=cow --allow-unsafe-on-disk --min-ready=1 \
  --no-databases-dir)
containers+=("$cid")
wait_ready "$cid"
expect_clones "$cid" data_dir
stop_cleanly "$cid"
left=$(ls -A "$xfs_mount")
if [ -n "$left" ]; then
  echo "after docker stop: left on the volume: $left" >&2
  exit 1
fi
"$DOCKER" rm "$cid" >/dev/null
umount "$xfs_mount"
echo "ok: an unprivileged container cloned on the volume, stopped cleanly (exit 0) and left" \
  "nothing on it"

# --- compose -------------------------------------------------------------------------------
phase "compose up (tests leases from the sidecar)"
export PGLEASE_IMAGE=$image PGLEASE_TESTS_IMAGE=$tests_image
PGLEASE_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export PGLEASE_TOKEN
"${compose[@]}" down --volumes --remove-orphans >/dev/null 2>&1 || true
"${compose[@]}" up --no-build --abort-on-container-exit --exit-code-from tests

phase "compose down"
# The sidecar stopped on SIGTERM: it must have stopped postgres and exited cleanly.
sidecar=$("${compose[@]}" ps -q pglease)
sidecar_exit=$("$DOCKER" inspect --format '{{.State.ExitCode}}' "$sidecar")
if [ "$sidecar_exit" != 0 ]; then
  echo "the pglease sidecar exited with $sidecar_exit" >&2
  "${compose[@]}" logs --no-color pglease | tail -n 40 >&2
  exit 1
fi
sidecar_log=$("$DOCKER" logs "$sidecar" 2>&1)
for line in "postgres stopped" "removed the instance directory" "pglease: stopped"; do
  grep -q "$line" <<<"$sidecar_log" || {
    echo "the sidecar's log lacks '$line':" >&2
    tail -n 20 <<<"$sidecar_log" >&2
    exit 1
  }
done
echo "ok: the sidecar stopped postgres, removed its data and exited 0 after SIGTERM"
"${compose[@]}" down --volumes --remove-orphans

phase "compose up with docker-compose.cow.yml (copy-on-write clones)"
compose+=(-f deploy/compose/docker-compose.cow.yml)
"${compose[@]}" up --no-build --abort-on-container-exit --exit-code-from tests
sidecar=$("${compose[@]}" ps -q pglease)
sidecar_log=$("$DOCKER" logs "$sidecar" 2>&1)
sidecar_exit=$("$DOCKER" inspect --format '{{.State.ExitCode}}' "$sidecar")
if [ "$sidecar_exit" != 0 ] || ! grep -q 'storage="cow"' <<<"$sidecar_log"; then
  echo "the sidecar exited with $sidecar_exit; its storage:" >&2
  grep -i "storage" <<<"$sidecar_log" >&2 || tail -n 20 <<<"$sidecar_log" >&2
  exit 1
fi
echo "ok: the example's tests passed on a sidecar that made its copy-on-write store"
"${compose[@]}" down --volumes --remove-orphans
end_phase
