"""Drop + clone against truncate + proof, for a database a test wrote (issue 44).

    python3 bench/ab/reset.py [ROUNDS]      # from the repository's root, as root; default 200
    FK=1 python3 bench/ab/reset.py [ROUNDS] # the written tables reference a filled one
    PAD_MB=200 python3 bench/ab/reset.py 30 # a template with 200 MB more in a filled table

Starts a private PostgreSQL 15 (pglease's TUNED_SETTINGS, on /dev/shm, as the `postgres`
user, unix socket only) and builds one template: the bench fixture (bench/fixtures/migrations)
plus three tables that are empty in it (`reset_events`, `reset_notes`, `reset_audit`, each
with a bigserial key and an index; with FK=1 also a foreign key to `customers`), sealed as pglease seals a
template (ANALYZE, CHECKPOINT, VACUUM (FREEZE)). Then, per workload and round, one clone
goes through each way of putting it back, the two ways alternating in the same run:

* clone:  `DROP DATABASE` + `CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY`
          (what a release of a written database costs today);
* reset:  the reset with the proof `crates/pool/src/session/reset.rs` describes:
          CHECKPOINT; list the clone's files and compare with its stamp (the daemon asks
          its inotify watch instead; the listing is the fallback and costs more); map each
          changed file to a relation through the template's and the clone's relfilenodes;
          refuse unless every changed file belongs to a table empty in the template (or its
          index, TOAST, sequence) or to a catalog; connect to the clone; TRUNCATE the
          written tables RESTART IDENTITY; check they are empty; compare the fingerprint of
          every changed catalog (and pg_class, which the TRUNCATE rewrites) and the state of
          every sequence with the template's; CHECKPOINT; stamp the files again.

Workloads (each after the holder's sessions ended):
* w10:   the bench marker row + 10 rows into `reset_events` (the issue's 10 inserts, into a
         table empty in the template: the fixture's `orders`, which leasebench writes, is not
         empty in the template, so a reset cannot put it back; see the report);
* w1000: the marker + 1,000 rows into each of `reset_events`, `reset_notes`, `reset_audit`.

Prints, per workload and way, the medians of wall time, the server's CPU (postmaster and
every backend, reaped ones included, from /proc) and this script's CPU (the part the daemon
would do), and the ratio clone ÷ reset. Every reset database is also checked against the
template by a full catalog+data query, independently of the proof.
"""
import glob, hashlib, os, shutil, signal, statistics, subprocess, sys, time
import psycopg2

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
PGBIN = os.environ.get('PGBIN', '/usr/lib/postgresql/15/bin')
TUNED = [('fsync', 'off'), ('synchronous_commit', 'off'), ('full_page_writes', 'off'),
         ('wal_level', 'minimal'), ('max_wal_senders', '0'), ('jit', 'off'),
         ('checkpoint_timeout', '1d'), ('dynamic_shared_memory_type', 'mmap'),
         ('shared_buffers', '128MB'), ('listen_addresses', '')]
EMPTY_TABLES = ['reset_events', 'reset_notes', 'reset_audit']
# FK=1: the three tables reference `customers` (a table the fixture fills). Each insert then
# locks the referenced row (FOR KEY SHARE), which writes that row's page of `customers`:
# the reset cannot tell such a lock from a change and falls back to drop + clone.
FK = 'REFERENCES customers (id)' if os.environ.get('FK') == '1' else ''
# PAD_MB=N: the template also holds a filled table of about N MB, for how each way scales
# with the template's size (a clone copies every file; a reset touches only the written).
PAD_MB = int(os.environ.get('PAD_MB', '0'))
HZ = os.sysconf('SC_CLK_TCK')

root = f'/dev/shm/pglease-resetbench-{os.getpid()}'
data, sock = f'{root}/data', f'{root}/sock'
os.makedirs(sock)
shutil.chown(root, 'postgres'); shutil.chown(sock, 'postgres')
as_pg = ['runuser', '-u', 'postgres', '--']
server = None


def run(cmd):
    subprocess.run(as_pg + cmd, check=True, stdout=subprocess.DEVNULL)


def conn(db):
    c = psycopg2.connect(host=sock, port=5999, user='postgres', dbname=db)
    c.autocommit = True
    return c


def tree_cpu(pid):
    """CPU seconds of `pid` and its children (reaped ones included), from /proc."""
    kids = {}
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                s = open(f'/proc/{p}/stat').read()
                f = s[s.rindex(')') + 2:].split()
                kids.setdefault(int(f[1]), []).append((int(p), f))
            except Exception:
                pass
    s = open(f'/proc/{pid}/stat').read()
    total, stack = 0, [(pid, s[s.rindex(')') + 2:].split())]
    while stack:
        p, f = stack.pop()
        total += sum(int(x) for x in f[11:15])
        stack.extend(kids.get(p, []))
    return total / HZ


def files(oid):
    """The stamp of a database's directory, as the daemon takes it (proof.rs: list_files)."""
    out = {}
    for e in os.scandir(f'{data}/base/{oid}'):
        if e.name == 'pg_internal.init':
            continue
        st = e.stat(follow_symlinks=False)
        out[e.name] = (st.st_size, st.st_ino, st.st_mtime_ns)
    return out


def filenode_of(name):
    """`16384`, `16384_fsm`, `16384.1` → 16384; anything else → None (unsure)."""
    base = name.split('.')[0]
    for fork in ('_fsm', '_vm', '_init'):
        if base.endswith(fork):
            base = base[:-len(fork)]
    return int(base) if base.isdigit() else None


# What a relation's file belongs to: the owning table of an index, a TOAST table (and its
# index) or an owned sequence, so that a write to any of them counts against that table.
OWNER_SQL = """
SELECT c.oid, pg_relation_filenode(c.oid), NULL,
       coalesce(t.oid, i.indrelid, d.refobjid, c.oid) AS owner
  FROM pg_class c
  LEFT JOIN pg_index i ON i.indexrelid = c.oid
  LEFT JOIN pg_class t ON t.reltoastrelid = coalesce(i.indrelid, c.oid)
  LEFT JOIN pg_depend d ON d.objid = c.oid AND d.classid = 'pg_class'::regclass
        AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i') AND c.relkind = 'S'
 WHERE pg_relation_filenode(c.oid) IS NOT NULL
"""
# Tables with no page at all in the template: a reset may truncate these.
EMPTY_SQL = """
SELECT c.oid FROM pg_class c
 WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND c.oid >= 16384
   AND pg_relation_size(c.oid) = 0
   AND (c.reltoastrelid = 0 OR pg_relation_size(c.reltoastrelid) = 0)
"""
# Every catalog of a database, by relfilenode, with the columns a TRUNCATE (or the
# statistics) change left out of pg_class's rows.
PG_CLASS_VOLATILE = {'relfilenode', 'relpages', 'reltuples', 'relallvisible', 'relfrozenxid',
                     'relminmxid'}


def catalog_fingerprint_sql(cur, catalog):
    if catalog == 'pg_class':
        cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = 'pg_class'::regclass "
                    "AND attnum > 0 AND NOT attisdropped ORDER BY attnum")
        cols = ', '.join(['oid'] + [r[0] for r in cur.fetchall()
                                     if r[0] not in PG_CLASS_VOLATILE and r[0] != 'oid'])
        return f"SELECT md5(coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '')) " \
               f"FROM (SELECT {cols} FROM pg_catalog.pg_class) x"
    # The catalogs' own statistics (autovacuum analyzes pg_class, which resets rewrite)
    # steer plans, not what a query returns.
    rows = ' WHERE starelid >= 16384' if catalog == 'pg_statistic' else ''
    return f"SELECT md5(coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '')) " \
           f"FROM (SELECT * FROM pg_catalog.{catalog}{rows}) x"


def sequence_state(cur):
    """Each sequence's (last_value, is_called), read from the sequence itself."""
    cur.execute("SELECT oid::regclass::text FROM pg_class WHERE relkind = 'S' ORDER BY oid")
    names = [r[0] for r in cur.fetchall()]
    if not names:
        return ()
    cur.execute(' UNION ALL '.join(
        f"SELECT {i}, last_value, is_called FROM {n}" for i, n in enumerate(names)))
    return tuple(sorted(cur.fetchall()))


# The independent check: everything a test could see, as text (catalog rows that matter
# with their relfilenode-free columns, every user table's rows, sequences, large objects,
# settings). The daemon's proof does not use this.
def full_check(db):
    c = conn(db)
    cur = c.cursor()
    h = hashlib.sha256()
    for q in ["SELECT oid, relname, relnamespace, relkind, relnatts, relacl::text, reloptions::text FROM pg_class ORDER BY oid",
              "SELECT attrelid, attname, atttypid, attnum, attnotnull, atthasdef, attacl::text FROM pg_attribute ORDER BY 1, 4",
              "SELECT adrelid, adnum, pg_get_expr(adbin, adrelid) FROM pg_attrdef ORDER BY 1, 2",
              "SELECT oid, conname, pg_get_constraintdef(oid) FROM pg_constraint ORDER BY oid",
              "SELECT indexrelid, pg_get_indexdef(indexrelid) FROM pg_index ORDER BY 1",
              "SELECT oid, tgname, tgenabled FROM pg_trigger ORDER BY oid",
              "SELECT oid, proname, md5(prosrc) FROM pg_proc ORDER BY oid",
              "SELECT objoid, classoid, objsubid, description FROM pg_description ORDER BY 1, 2, 3",
              "SELECT * FROM pg_sequence ORDER BY 1",
              "SELECT oid FROM pg_largeobject_metadata ORDER BY 1",
              "SELECT setdatabase, setrole, setconfig::text FROM pg_db_role_setting ORDER BY 1, 2"]:
        cur.execute(q)
        h.update(repr(cur.fetchall()).encode())
    h.update(repr(sequence_state(cur)).encode())
    cur.execute("SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND n.nspname NOT IN "
                "('pg_catalog', 'information_schema') ORDER BY 1")
    for (t,) in cur.fetchall():
        cur.execute(f"SELECT md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')) FROM {t} x")
        h.update(t.encode() + cur.fetchone()[0].encode())
    c.close()
    return h.hexdigest()


def start():
    global server
    run([f'{PGBIN}/initdb', '-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync'])
    args = [f'{PGBIN}/postgres', '-D', data, '-p', '5999', '-k', sock]
    for k, v in TUNED:
        args += ['-c', f'{k}={v}']
    server = subprocess.Popen(as_pg + args, stdout=subprocess.DEVNULL,
                              stderr=open(f'{root}/log', 'w'))
    for _ in range(200):
        try:
            conn('postgres').close()
            return
        except Exception:
            time.sleep(0.05)
    sys.exit(f'postgres did not start; see {root}/log')


def pg_size(admin):
    cur = admin.cursor()
    cur.execute("SELECT pg_size_pretty(pg_database_size('tpl'))")
    return cur.fetchone()[0]


def postmaster_pid():
    return int(open(f'{data}/postmaster.pid').readline())


def build_template():
    admin = conn('postgres')
    admin.cursor().execute('CREATE DATABASE tpl')
    c = conn('tpl')
    cur = c.cursor()
    for f in sorted(glob.glob('bench/fixtures/migrations/*.sql')):
        cur.execute(open(f).read())
    for t in EMPTY_TABLES:
        cur.execute(f"""CREATE TABLE {t} (id bigserial PRIMARY KEY,
            customer_id int NOT NULL {FK}, body text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now());
            CREATE INDEX ON {t} (customer_id)""")
    if PAD_MB:
        # About 1 KB per row of incompressible text.
        cur.execute("CREATE TABLE reset_pad AS SELECT g AS id, (SELECT string_agg(md5(g::text || x::text), '') "
                    "FROM generate_series(1, 32) x) AS body FROM generate_series(1, %s) g", (PAD_MB * 1024,))
    cur.execute('ANALYZE'); cur.execute('CHECKPOINT'); cur.execute('VACUUM (FREEZE)')
    c.close()
    admin.cursor().execute('CHECKPOINT')
    return admin


def owners(cur):
    """relfilenode → (relation, the relation whose contents it is part of)."""
    cur.execute(OWNER_SQL)
    return {r[1]: (r[0], r[3]) for r in cur.fetchall()}


class Template:
    """What the reset compares with, computed once per template."""

    def __init__(self):
        c = conn('tpl')
        cur = c.cursor()
        self.by_filenode = owners(cur)
        cur.execute(EMPTY_SQL)
        self.empty = {r[0] for r in cur.fetchall()}
        cur.execute('SELECT oid, relname FROM pg_class')
        self.names = dict(cur.fetchall())
        cur.execute("SELECT c.oid, c.relname, pg_relation_filenode(c.oid) FROM pg_class c "
                    "WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r' "
                    "AND NOT c.relisshared")
        self.catalog_names = {r[0]: r[1] for r in cur.fetchall()}
        self.fingerprints = {}
        for name in self.catalog_names.values():
            sql = catalog_fingerprint_sql(cur, name)
            cur.execute(sql)
            self.fingerprints[name] = (sql, cur.fetchone()[0])
        self.sequences = sequence_state(cur)
        c.close()
        self.full = full_check('tpl')


class Refused(Exception):
    pass


PHASES = {}


def phase(name, t0):
    """Adds the wall time since `t0` to phase `name`; returns now."""
    t = time.perf_counter()
    PHASES.setdefault(name, []).append((t - t0) * 1000)
    return t


def truncate_and_compare(c, tpl, written, catalogs, by_filenode, t):
    """Steps 3 to 5 on a connection to the clone; returns the clone's new filenode map."""
    cur = c.cursor()
    if written:
        cur.execute("SELECT string_agg(oid::regclass::text, ', ') FROM pg_class "
                    "WHERE oid = ANY(%s)", (list(written),))
        cur.execute(f'TRUNCATE {cur.fetchone()[0]} RESTART IDENTITY')
        # A truncated table has a new, empty file (and so has its TOAST table).
        cur.execute("SELECT bool_and(pg_relation_size(oid) = 0 AND (reltoastrelid = 0 OR "
                    "pg_relation_size(reltoastrelid) = 0)) FROM pg_class WHERE oid = ANY(%s)",
                    (list(written),))
        if not cur.fetchone()[0]:
            raise Refused('a table not empty after the truncate')
        # Autovacuum analyzes a table a test filled; its statistics outlive the truncate.
        # The template has none of these tables' (an ANALYZE of an empty table writes
        # none), so they go too; pg_statistic is then compared as any catalog.
        cur.execute('DELETE FROM pg_statistic WHERE starelid = ANY(%s)', (list(written),))
    t = phase('4 truncate + emptiness', t)
    for name in sorted(catalogs):
        sql, expected = tpl.fingerprints[name]
        cur.execute(sql)
        if cur.fetchone()[0] != expected:
            raise Refused(f'catalog {name} differs')
    t = phase('5 catalog fingerprints', t)
    if sequence_state(cur) != tpl.sequences:
        raise Refused('a sequence differs')
    t = phase('6 sequences', t)
    if written:
        # The truncate gave relations new files: the next proof maps them.
        by_filenode = owners(cur)
    phase('7 filenode map again', t)
    return by_filenode


def reset(admin, tpl, db, oid, stamp):
    """The reset and its proof. `stamp` is (files, the clone's filenode map) at its last
    stamp. Returns the new stamp; raises Refused when anything is unsure."""
    a = admin.cursor()
    t = time.perf_counter()
    a.execute('CHECKPOINT')
    t = phase('1 checkpoint', t)
    before, by_filenode = stamp
    now = files(oid)
    changed = {n for n in set(now) | set(before) if now.get(n) != before.get(n)}
    written, catalogs = set(), {'pg_class'}
    for name in changed:
        node = filenode_of(name)
        if node is None:
            raise Refused(f'unknown file {name}')
        rel = by_filenode.get(node)
        if rel is None:
            # A file no relation of the stamp had: a relation made since (DDL), or a
            # relation's new file (a TRUNCATE or a rewrite by the holder). Both are unsure.
            raise Refused('new file')
        owner = rel[1]
        if owner in tpl.catalog_names:
            # A catalog, its index or its TOAST: its rows are compared below.
            catalogs.add(tpl.catalog_names[owner])
        elif owner in tpl.empty:
            written.add(owner)
        else:
            raise Refused(f'file of {tpl.names.get(owner, owner)}, not empty in the template')
    t = phase('2 files listed and classified', t)
    c = conn(db)
    t = phase('3 connect to the clone', t)
    try:
        by_filenode = truncate_and_compare(c, tpl, written, catalogs, by_filenode, t)
    finally:
        c.close()
    t = time.perf_counter()
    a.execute('CHECKPOINT')
    t = phase('8 checkpoint', t)
    new = files(oid), by_filenode
    phase('9 files listed (new stamp)', t)
    return new


def test(admin, db, rows, tables):
    c = conn(db)
    cur = c.cursor()
    cur.execute('BEGIN')
    cur.execute("INSERT INTO bench_marker (lease_id) VALUES ('x')")
    for t in tables:
        cur.execute(f"INSERT INTO {t} (customer_id, body) SELECT 1 + g %% 100, 'row ' || g "
                    f"FROM generate_series(1, %s) g", (rows,))
    cur.execute('COMMIT')
    c.close()
    # Both ways start once the holder's backend has exited (the recycle waits for that):
    # otherwise its CPU, counted when the postmaster reaps it, would fall into the timing.
    cur = admin.cursor()
    for _ in range(5000):
        cur.execute('SELECT count(*) FROM pg_stat_activity WHERE datname = %s', (db,))
        if cur.fetchone()[0] == 0:
            break
        time.sleep(0.001)


def main():
    start()
    admin = build_template()
    tpl = Template()
    a = admin.cursor()
    pm = postmaster_pid()
    workloads = [('w10', 10, EMPTY_TABLES[:1]), ('w1000', 1000, EMPTY_TABLES)]
    for db in ('c_clone', 'c_reset'):
        a.execute(f'CREATE DATABASE {db} TEMPLATE tpl STRATEGY FILE_COPY')
    a.execute("SELECT oid FROM pg_database WHERE datname = 'c_reset'")
    reset_oid = a.fetchone()[0]
    a.execute('CHECKPOINT')
    stamp = files(reset_oid), tpl.by_filenode
    results, refused, unequal = {}, {}, 0
    # The marker table is empty in the template: a reset truncates it too. Its write is
    # part of every workload.
    for wname, rows, tables in workloads:
        for rnd in range(ROUNDS + 5):
            for way in (('clone', 'reset') if rnd % 2 else ('reset', 'clone')):
                db = f'c_{way}'
                test(admin, db, rows, tables)
                cpu0, own0, t0 = tree_cpu(pm), time.process_time(), time.perf_counter()
                if way == 'clone':
                    a.execute(f'DROP DATABASE {db}')
                    a.execute(f'CREATE DATABASE {db} TEMPLATE tpl STRATEGY FILE_COPY')
                else:
                    try:
                        stamp = reset(admin, tpl, db, reset_oid, stamp)
                    except Refused as e:
                        refused[str(e)] = refused.get(str(e), 0) + 1
                        a.execute(f'DROP DATABASE {db}')
                        a.execute(f'CREATE DATABASE {db} TEMPLATE tpl STRATEGY FILE_COPY')
                        a.execute(f"SELECT oid FROM pg_database WHERE datname = '{db}'")
                        reset_oid = a.fetchone()[0]
                        a.execute('CHECKPOINT')
                        stamp = files(reset_oid), tpl.by_filenode
                t1, own1, cpu1 = time.perf_counter(), time.process_time(), tree_cpu(pm)
                if rnd >= 5:  # the first rounds warm caches
                    results.setdefault((wname, way), []).append(
                        ((t1 - t0) * 1000, (cpu1 - cpu0) * 1000, (own1 - own0) * 1000))
                if way == 'reset' and rnd % 20 == 0 and full_check(db) != tpl.full:
                    unequal += 1
    print(f'rounds per workload and way: {ROUNDS}; foreign keys to customers: {bool(FK)}; '
          f'template {pg_size(admin)}; postgres {PGBIN}; '
          f'CPU from /proc in ticks of {1000 // HZ} ms (medians of many rounds)')
    print(f"{'workload':8} {'way':6} {'wall ms':>8} {'server CPU ms':>14} {'script CPU ms':>14} "
          f"{'mean server CPU':>16}")
    for wname, _, _ in workloads:
        for way in ('clone', 'reset'):
            r = results[(wname, way)]
            print(f"{wname:8} {way:6} {statistics.median(x[0] for x in r):8.2f} "
                  f"{statistics.median(x[1] for x in r):14.1f} "
                  f"{statistics.median(x[2] for x in r):14.2f} "
                  f"{statistics.mean(x[1] for x in r):16.2f}")
        c, rs = results[(wname, 'clone')], results[(wname, 'reset')]
        print(f"{wname:8} clone ÷ reset: wall {statistics.median(x[0] for x in c) / statistics.median(x[0] for x in rs):.2f}, "
              f"mean server+script CPU {statistics.mean(x[1] + x[2] for x in c) / statistics.mean(x[1] + x[2] for x in rs):.2f}")
    print('reset phases, median wall ms over both workloads:',
          ', '.join(f'{k} {statistics.median(v):.2f}' for k, v in sorted(PHASES.items())))
    print(f'resets refused (fell back to drop + clone): {refused or 0}')
    print(f'reset databases unequal to the template (checked every 20th round): {unequal}')


# SIGTERM ends the run as an interrupt does: postgres is stopped and its directory removed.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
try:
    main()
finally:
    if server is not None:
        subprocess.run(as_pg + [f'{PGBIN}/pg_ctl', '-D', data, 'stop', '-m', 'fast'],
                       stdout=subprocess.DEVNULL)
        server.wait(timeout=30)
    shutil.rmtree(root, ignore_errors=True)
