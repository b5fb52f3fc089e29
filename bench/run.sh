#!/usr/bin/env bash
# pglease benchmarks: builds release, runs the driver (crates/bench), writes
# bench/results/<UTC date-time>.json and prints the tables.
#
#   bash bench/run.sh            # full mode (about 15 minutes on 2 cores, 10 of them scenario 6)
#   bash bench/run.sh --quick    # quick mode (under 2 minutes)
#   bash bench/run.sh --no-build # use the binaries already in target/release
#
# Extra arguments go to the driver (e.g. --only 1,2). Everything the driver starts is
# stopped when it ends; if the driver itself dies, the exit trap stops the daemons and
# postgres servers it recorded and removes their directories. See bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=full
build=1
args=()
for arg in "$@"; do
  case "$arg" in
    --quick) mode=quick; args+=("$arg") ;;
    --no-build) build=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) args+=("$arg") ;;
  esac
done

stamp=$(date -u +%Y-%m-%dT%H-%M-%SZ)
work=target/pglease-bench
run_dir="$work/runs/$stamp"
pid_file="$run_dir/pids"
out="bench/results/$stamp.json"
mkdir -p "$run_dir" bench/results

driver_pid=""
spawned_pid=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  # The driver stops its daemons on SIGTERM; give it the time to.
  if [ -n "$driver_pid" ] && kill -0 "$driver_pid" 2>/dev/null; then
    kill -TERM "$driver_pid" 2>/dev/null || true
    for _ in $(seq 1 450); do kill -0 "$driver_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$driver_pid" 2>/dev/null || true
  fi
  # Safety net: any daemon it recorded that is still alive, then their instance dirs.
  if [ -f "$pid_file" ]; then
    local pid dir
    for pid in $(awk '$1 == "pid" { print $2 }' "$pid_file"); do
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'pglease serve'; then
        echo "bench/run.sh: stopping leftover daemon $pid" >&2
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 400); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done
    # Scenario 6's own postgres servers ("server PID BASE_DIR"): stop a postmaster only
    # while its command line still names a data directory under BASE_DIR (fast
    # shutdown, then immediate, then kill).
    local base
    while read -r _ pid base; do
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-D $base/"; then
        echo "bench/run.sh: stopping leftover postgres $pid ($base)" >&2
        kill -INT "$pid" 2>/dev/null || true
        for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -QUIT "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done < <(awk '$1 == "server" { print $1, $2, $3 }' "$pid_file")
    for dir in $(awk '$1 == "dir" { print $2 }' "$pid_file"); do
      case "$dir" in
        */pglease-bench-seeds-*)
          if [ -d "$dir" ]; then
            echo "bench/run.sh: removing leftover $dir" >&2
            rm -rf -- "$dir"
          fi ;;
        /dev/shm/pglease-*)
          if [ -d "$dir" ]; then
            # A SIGKILLed daemon's postmaster dies with it (parent-death signal); give
            # it a moment to let go of the directory before removing it.
            sleep 1
            # A copy-on-write store (scenario 13) is unmounted first; its loop device
            # goes with it.
            if mountpoint -q "$dir/cow" 2>/dev/null; then
              umount "$dir/cow" 2>/dev/null || umount -l "$dir/cow" 2>/dev/null || true
            fi
            echo "bench/run.sh: removing leftover $dir" >&2
            rm -rf -- "$dir"
          fi ;;
      esac
    done
  fi
  # The driver's scratch space (cold initdb caches), if it could not remove it itself.
  [ -n "$spawned_pid" ] && rm -rf -- "$work/scratch-$spawned_pid"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$build" = 1 ]; then
  echo "==> cargo build --release --workspace" >&2
  cargo build --release --workspace >&2
fi

echo "==> pglease-bench ($mode mode); report: $out" >&2
# In the background so the traps run at once on a signal; `wait` returns its status.
target/release/pglease-bench "${args[@]}" \
  --out "$out" --work-dir "$work" --log-dir "$run_dir/logs" --pid-file "$pid_file" &
driver_pid=$!
spawned_pid=$driver_pid
set +e
wait "$driver_pid"
status=$?
set -e
driver_pid=""
echo "==> daemon logs: $run_dir/logs" >&2
exit "$status"
