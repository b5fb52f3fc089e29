#!/usr/bin/env python3
"""Where a warm lease's time goes (issue 45): per cycle of scenario 1 (POST /lease, then
DELETE ?reuse=true, one worker), the latency a client sees and the CPU of the daemon and of
its postgres.

Usage: python3 bench/lease_cpu.py target/release/pglease [cycles] [extra serve flags]
CPU is read from /proc (utime+stime of the daemon; of the postmaster, its live children and
the children it reaped), so it is less bent by a busy machine than wall time. bench/README.md,
scenario 1, has the figures and what they are made of."""
import http.client, json, os, socket, subprocess, sys, time, statistics, signal

binary = sys.argv[1]
cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
extra = sys.argv[3:]
tick = os.sysconf("SC_CLK_TCK")
root = os.path.dirname(os.path.abspath(__file__))

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is state; utime=11 stime=12 cutime=13 cstime=14 (0-based after the comm)
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])

def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out

def tree_cpu(pid):
    own, reaped = stat(pid)
    total = own + reaped
    for c in children(pid):
        try:
            total += sum(stat(c))
        except FileNotFoundError:
            pass
    return total

port = free_port()
cache = os.environ.get("CACHE", os.path.join(root, "..", "target", "pglease-bench", "initdb-cache"))
args = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--front-listen", "off",
        "--template", f"fixture=migrations:{os.path.join(root, 'fixtures', 'migrations')}",
        "--prebuild", "--min-ready", "40", "--max-total", "80", "--cache-dir", cache] + extra
log = open(f"/tmp/cpu-daemon-{port}.log", "w")
daemon = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
try:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    def call(method, path, body=None):
        conn.request(method, path, body=body, headers={"content-type": "application/json"} if body else {})
        r = conn.getresponse(); data = r.read(); return r.status, data
    for _ in range(600):
        try:
            st, data = call("GET", "/status")
            s = json.loads(data)
            t = [x for x in s.get("templates", []) if x.get("name") == "fixture"]
            if t and t[0].get("ready", 0) >= 40:
                break
        except Exception:
            conn = http.client.HTTPConnection("127.0.0.1", port)
        time.sleep(0.1)
    else:
        sys.exit("not ready")
    pg = [c for c in children(daemon.pid) if open(f"/proc/{c}/comm").read().strip() == "postgres"]
    postmaster = pg[0]
    def one():
        t0 = time.perf_counter()
        st, data = call("POST", "/lease", json.dumps({"template": "fixture"}))
        t1 = time.perf_counter()
        assert st == 201, (st, data)
        lid = json.loads(data)["id"]
        st, _ = call("DELETE", f"/leases/{lid}?reuse=true")
        t2 = time.perf_counter()
        assert st == 204, st
        return t1 - t0, t2 - t1
    for _ in range(200):
        one()
    time.sleep(1)
    d0, p0, w0 = sum(stat(daemon.pid)), tree_cpu(postmaster), time.perf_counter()
    lat, rel = [], []
    for _ in range(cycles):
        a, b = one(); lat.append(a); rel.append(b)
    time.sleep(1.0)  # the last recycles finish
    d1, p1, w1 = sum(stat(daemon.pid)), tree_cpu(postmaster), time.perf_counter()
    lat.sort(); rel.sort()
    q = lambda xs, p: xs[int(p * (len(xs) - 1))] * 1000
    print(json.dumps({
        "cycles": cycles, "cycles_per_s": round(cycles / (w1 - w0 - 1.0), 1),
        "lease_p50_ms": round(q(lat, .5), 3), "lease_p90_ms": round(q(lat, .9), 3),
        "release_p50_ms": round(q(rel, .5), 3),
        "daemon_cpu_ms_per_cycle": round((d1 - d0) / tick * 1000 / cycles, 3),
        "postgres_cpu_ms_per_cycle": round((p1 - p0) / tick * 1000 / cycles, 3),
    }))
finally:
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout=60)
