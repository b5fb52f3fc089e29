#!/usr/bin/env python3
"""Soak test: lease → release (drop and replace) at the highest rate the machine allows,
for a while, sampling the daemon's RSS and open file descriptors and the server's database
count. They must stay flat: a leak of memory, descriptors or databases shows as a trend.

    python3 bench/soak.py [--minutes 10] [--workers 16] [--binary target/release/pglease]

Starts its own daemon (release build: `cargo build --release` first) and stops it at the
end; prints one line per sample and a summary. Uses only the standard library and psql.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request


def http(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read()
        return response.status, (json.loads(text) if text else None)


def worker(base, stop, counts, lock):
    while not stop.is_set():
        try:
            status, lease = http("POST", f"{base}/lease", {"wait_ms": 10000})
            http("DELETE", f"{base}/leases/{lease['id']}")
            with lock:
                counts["cycles"] += 1
        except (urllib.error.URLError, OSError, KeyError, ValueError):
            with lock:
                counts["errors"] += 1
            time.sleep(0.05)


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--binary", default="target/release/pglease")
    parser.add_argument("--every", type=float, default=30, help="seconds between samples")
    args = parser.parse_args()

    log = tempfile.NamedTemporaryFile(prefix="pglease-soak-", suffix=".log", delete=False)
    daemon = subprocess.Popen(
        [args.binary, "serve", "--listen", "127.0.0.1:0", "--max-total", "64",
         "--cache-dir", "target/pglease-bench/initdb-cache"],
        stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "RUST_LOG": "warn,pglease=info"},
    )
    try:
        addr = None
        for _ in range(300):
            with open(log.name) as text:
                found = re.search(r"addr=(127\.0\.0\.1:\d+)", text.read())
            if found:
                addr = found.group(1)
                break
            time.sleep(0.1)
        if not addr:
            sys.exit(f"soak: the daemon did not start; see {log.name}")
        base = f"http://{addr}"
        status = http("GET", f"{base}/status")[1]["postgres"]
        socket_dir = os.path.join(os.path.dirname(status["data_dir"]), "socket")
        port = str(status["port"])

        def databases():
            out = subprocess.run(
                ["psql", "-h", socket_dir, "-p", port, "-U", "postgres", "-d", "postgres", "-Atc",
                 "SELECT count(*) FROM pg_database"],
                capture_output=True, text=True, check=True)
            return int(out.stdout.strip())

        stop, lock = threading.Event(), threading.Lock()
        counts = {"cycles": 0, "errors": 0}
        threads = [threading.Thread(target=worker, args=(base, stop, counts, lock), daemon=True)
                   for _ in range(args.workers)]
        for thread in threads:
            thread.start()
        started = time.time()
        samples = []
        print(f"soak: {args.workers} workers, {args.minutes} min, daemon pid {daemon.pid}")
        print(f"{'t(s)':>6} {'cycles':>8} {'cycles/s':>9} {'errors':>7} {'rss MiB':>8} {'fds':>5} {'databases':>9}")
        last_cycles, last_time = 0, started
        while time.time() - started < args.minutes * 60:
            time.sleep(args.every)
            now = time.time()
            with lock:
                cycles, errors = counts["cycles"], counts["errors"]
            sample = (now - started, cycles, (cycles - last_cycles) / (now - last_time), errors,
                      rss_kb(daemon.pid) / 1024, len(os.listdir(f"/proc/{daemon.pid}/fd")), databases())
            last_cycles, last_time = cycles, now
            samples.append(sample)
            print(f"{sample[0]:6.0f} {sample[1]:8d} {sample[2]:9.1f} {sample[3]:7d} {sample[4]:8.1f} {sample[5]:5d} {sample[6]:9d}",
                  flush=True)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        if len(samples) >= 2:
            first, last = samples[0], samples[-1]
            print(f"soak: {last[1]} cycles in {last[0]:.0f} s ({last[1] / last[0]:.1f}/s), {last[3]} errors; "
                  f"rss {first[4]:.1f} → {last[4]:.1f} MiB (max {max(s[4] for s in samples):.1f}), "
                  f"fds {first[5]} → {last[5]} (max {max(s[5] for s in samples)}), "
                  f"databases {first[6]} → {last[6]} (max {max(s[6] for s in samples)})")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
        print(f"soak: daemon exited with {daemon.returncode}; log {log.name}")


if __name__ == "__main__":
    main()
