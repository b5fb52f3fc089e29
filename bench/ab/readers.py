"""Server CPU per read-only test, for A/B runs of two pglease binaries (issue 29).

    python3 bench/ab/readers.py BINARY N        # from the repository's root, as root
    EXTRA=--no-reuse-unchanged python3 bench/ab/readers.py BINARY N

Starts BINARY serving the bench fixture (bench/fixtures/migrations) on 127.0.0.1:7811 with
the bench's initdb cache, then runs N tests one after the other, each: POST /lease, connect
with libpq (psycopg2), one SELECT, disconnect, DELETE /leases/{id}. It prints the CPU the
daemon and every postgres process under it spent per test (utime + stime from /proc, reaped
children included) and the wall time per test. With the proof on (the default) every such
test's database is proven unchanged and reused; with EXTRA=--no-reuse-unchanged each is
dropped and cloned again. Run the binaries alternately: the machine's load drifts.
"""
import json, os, subprocess, sys, time, urllib.request
import psycopg2  # before the daemon starts: a missing driver must not leave it running
binary, n = sys.argv[1], int(sys.argv[2])
port = 7811
log = open(os.environ.get('PGLEASE_AB_LOG', '/dev/null'), 'w')
d = subprocess.Popen([binary, 'serve', '--listen', f'127.0.0.1:{port}', '--template', 'app=migrations:bench/fixtures/migrations', '--prebuild', '--cache-dir', 'target/pglease-bench/initdb-cache', '--min-ready', '2'] + os.environ.get('EXTRA', '').split(), stdout=log, stderr=log)
def req(method, path, body=None):
    r = urllib.request.Request(f'http://127.0.0.1:{port}{path}', method=method, data=json.dumps(body).encode() if body else None, headers={'content-type': 'application/json'})
    with urllib.request.urlopen(r) as f:
        t = f.read()
        return json.loads(t) if t else None
for _ in range(200):
    try:
        req('GET', '/readyz'); break
    except Exception:
        time.sleep(0.1)
time.sleep(2)
if d.poll() is not None:
    sys.exit(f'{binary} exited with {d.returncode} (is port {port} taken?)')
HZ = os.sysconf('SC_CLK_TCK')
def tree_cpu(root):
    kids = {}
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                s = open(f'/proc/{p}/stat').read()
                f = s[s.rindex(')')+2:].split()
                kids.setdefault(int(f[1]), []).append((int(p), f))
            except Exception: pass
    total = 0
    def walk(pid, f):
        nonlocal total
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # utime stime cutime cstime
        for c, cf in kids.get(pid, []):
            walk(c, cf)
    s = open(f'/proc/{root}/stat').read(); f = s[s.rindex(')')+2:].split()
    walk(root, f)
    return total / HZ

def one():
    l = req('POST', '/lease', {'template': 'app', 'wait_ms': 30000})
    c = psycopg2.connect(l['url'])
    cur = c.cursor(); cur.execute('SELECT count(*) FROM bench_marker'); cur.fetchall()
    c.close()
    req('DELETE', f"/leases/{l['id']}")
for _ in range(20): one()
time.sleep(1)
c0 = tree_cpu(d.pid); t0 = time.time()
for _ in range(n): one()
time.sleep(0.5)
c1 = tree_cpu(d.pid); t1 = time.time()
st = req('GET', '/status')
print(binary, f"server CPU ms per read-only test: {(c1-c0)*1000/n:.2f}", f"wall ms/test: {(t1-t0)*1000/n:.2f}", "limits:", {k: v for k, v in st['limits'].items() if 'reused' in k or 'replaced' in k})
d.terminate(); d.wait()
