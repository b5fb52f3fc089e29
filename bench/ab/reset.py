"""Drop + clone, truncate + proof and delete + row proof, for a database a test wrote (issue 44).

    python3 bench/ab/reset.py [ROUNDS]      # from the repository's root, as root; default 200
    FK=1 python3 bench/ab/reset.py [ROUNDS] # the written tables reference a filled one
    PAD_MB=200 python3 bench/ab/reset.py 30 # a template with 200 MB more in a filled table
    SPLIT=1 PHASE_CPU=1 python3 bench/ab/reset.py 60  # the restore's steps apart, with server CPU
    DEFER=1 python3 bench/ab/reset.py 60    # the restore takes no new stamp
    ADV=1 ADV_ROUNDS=5 python3 bench/ab/reset.py  # adversarial rounds (below)
    CONN_COST=1 python3 bench/ab/reset.py   # a bare connection into a clone, 300 times

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

* restore: a logical restore with a row-level proof, which also covers tables the template
          fills: CHECKPOINT; list and map the changed files as the reset does, refusing a
          file no relation of the stamp had; one superuser connection into the clone and
          one multi-statement string (SPLIT=1: three round trips, timed apart): a DO block
          that compares every changed catalog's fingerprint with the template's and raises
          before anything runs in the clone as superuser; then, with
          session_replication_role = replica (no trigger runs, no cascade writes elsewhere),
          a DELETE of every row of a written table whose xmin is newer than the template's
          seal, setval of every written sequence to the template's state; then one SELECT:
          per written table a fingerprint of its visible rows with their ctids, in ctid order,
          and each written sequence's state, equal to the template's. What the next release's
          proof of an unchanged clone needs (CHECKPOINT and a listing: a new stamp) is timed
          apart ("stamp"), as it could be deferred to the next release's CHECKPOINT.

Workloads (each after the holder's sessions ended):
* w10:   the bench marker row + 10 rows into `reset_events` (the issue's 10 inserts, into a
         table empty in the template: the fixture's `orders`, which leasebench writes, is not
         empty in the template, so a reset cannot put it back; see the report);
* w1000: the marker + 1,000 rows into each of `reset_events`, `reset_notes`, `reset_audit`;
* orders10: leasebench's test (crates/bench/src/scenarios/throughput.rs, `work`): the marker
         check, the marker, 10 inserts into `orders` (filled in the template, with foreign keys
         to `customers` and `addresses`, whose referenced rows the inserts lock) and the select.

ADV=1 runs adversarial rounds instead: orders10, then one change a restore must notice or
undo (ADVERSARIAL below), ADV_ROUNDS (default 3) rounds per change; prints per change how
often the restore refused (and why), proved the clone, and whether a proven clone passed
the full check. One more case puts a trigger in the way of each way's own statements.

Prints, per workload and way, the medians of wall time, the server's CPU (postmaster and
every backend, reaped ones included, from /proc) and this script's CPU (the part the daemon
would do), the ratios clone ÷ reset and clone ÷ restore, the server's CPU of the test itself,
and the median of each step. Every reset or restored database is also checked against the
template by a full catalog+data query after every round, independently of the proof.
"""
import glob, hashlib, os, shutil, signal, statistics, subprocess, sys, time
import psycopg2

from restore_plan import (Refused, classify_for_restore, filenode_of, restore_sql,
                          row_fingerprint_sql, sequence_state_sql)

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
    # A sequence no table owns (a `nextval` of it is one of the adversarial changes).
    cur.execute('CREATE SEQUENCE reset_free_seq')
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
        self.restore_facts(cur)
        c.close()
        self.full = full_check('tpl')

    def restore_facts(self, cur):
        """What the restore compares with: every relation's kind and quoted name, each user
        table's fingerprint of rows with ctids, each sequence's state, and the seal's xid."""
        cur.execute("SELECT c.oid, c.relkind, c.relpersistence, format('%I.%I', n.nspname, c.relname) "
                    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace")
        self.rels = {r[0]: (r[1], r[2], r[3]) for r in cur.fetchall()}
        self.row_fp = {}
        for oid, (kind, persistence, name) in self.rels.items():
            if kind == 'r' and persistence == 'p' and oid >= 16384:
                cur.execute(row_fingerprint_sql(name))
                self.row_fp[oid] = cur.fetchone()[0]
        self.seq_state = {}
        for oid, (kind, _, name) in self.rels.items():
            if kind == 'S':
                cur.execute(f'SELECT {sequence_state_sql(name)}')
                self.seq_state[oid] = cur.fetchone()[0]
        # A transaction id taken after the seal: every row of the template is older, every
        # row a clone's holder wrote is newer (in the cluster's one xid counter).
        cur.execute('SELECT pg_current_xact_id()::xid::text')
        self.seal_xid = int(cur.fetchone()[0])


PHASES = {}
# (workload, way) the phases are recorded for; main sets it (None: not recorded).
CURRENT = [None]
# PHASE_CPU=1: each step's server CPU too (a read of /proc per step, which adds to the
# script's CPU; the server's is what this is for). [postmaster pid, CPU at the last step].
PHASE_CPU = os.environ.get('PHASE_CPU') == '1'
PHASE_PM = [None, 0.0]


def phase(name, t0):
    """Adds the wall time since `t0` to phase `name` of the current (workload, way) (with
    PHASE_CPU=1 also the server's CPU since the previous step); returns now."""
    t = time.perf_counter()
    if CURRENT[0] is not None:
        PHASES.setdefault(CURRENT[0], {}).setdefault(name, []).append((t - t0) * 1000)
        if PHASE_CPU:
            cpu = tree_cpu(PHASE_PM[0])
            PHASES[CURRENT[0]].setdefault(name + ' [server CPU]', []).append((cpu - PHASE_PM[1]) * 1000)
            PHASE_PM[1] = cpu
            t = time.perf_counter()
    return t


def phase_start():
    """With PHASE_CPU=1: the server's CPU the first step counts from."""
    if PHASE_CPU and CURRENT[0] is not None:
        PHASE_PM[1] = tree_cpu(PHASE_PM[0])


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
    phase_start()
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


# ---- The restore: delete what the holder added, prove rows and places equal ----

SPLIT = os.environ.get('SPLIT') == '1'


def restore(admin, tpl, db, oid, stamp):
    """The restore and its proof; raises Refused when anything is unsure. The stamp it
    compares with is left as it was (see new_stamp)."""
    a = admin.cursor()
    phase_start()
    t = time.perf_counter()
    a.execute('CHECKPOINT')
    t = phase('1 checkpoint', t)
    before, by_filenode = stamp
    now = files(oid)
    changed = {n for n in set(now) | set(before) if now.get(n) != before.get(n)}
    tables, sequences, catalogs = classify_for_restore(tpl, changed, by_filenode)
    guard, restore_stmts, proof, expected, what = restore_sql(tpl, tables, sequences, catalogs)
    t = phase('2 files listed and classified', t)
    c = conn(db)
    t = phase('3 connect to the clone', t)
    try:
        cur = c.cursor()
        if SPLIT:
            if guard:
                cur.execute(guard)
            t = phase('4a catalog guard', t)
            cur.execute(restore_stmts)
            t = phase('4b delete + setval', t)
            cur.execute(proof)
            got = cur.fetchone()
            t = phase('4c proof', t)
        else:
            # One round trip: psycopg2 sends the string as one simple query (one implicit
            # transaction; the guard's exception aborts what follows) and returns the last
            # statement's row.
            cur.execute('; '.join(x for x in (guard, restore_stmts, proof) if x))
            got = cur.fetchone()
            t = phase('4 guard + restore + proof (one round trip)', t)
    except psycopg2.Error as e:
        raise Refused(e.diag.message_primary or str(e)) from None
    finally:
        c.close()
    for name, g, e in zip(what, got, expected):
        if g != e:
            raise Refused(f'{name} differ' + ('' if name.startswith('rows') else 's'))
    return tables, sequences, catalogs


def new_stamp(admin, oid, by_filenode):
    """What the next release's proof of an unchanged clone needs: CHECKPOINT (the restore's
    own writes reach the files) and a listing. Could be deferred: the next release's own
    CHECKPOINT flushes them, and its listing against the older stamp lists these files as
    changed, which the restore's proof (against the template, not the stamp) allows."""
    phase_start()
    t = time.perf_counter()
    admin.cursor().execute('CHECKPOINT')
    t = phase('5 checkpoint (new stamp)', t)
    stamp = files(oid), by_filenode
    phase('6 listing (new stamp)', t)
    return stamp


# The three workloads: name, rows per table, tables (None: leasebench's test into `orders`).
WORKLOADS = [('w10', 10, EMPTY_TABLES[:1]), ('w1000', 1000, EMPTY_TABLES), ('orders10', 10, None)]


def test(admin, db, workload, rnd, extra=()):
    """The holder's test, then the wait until its backend has exited (the recycle waits for
    that; otherwise its CPU, counted when the postmaster reaps it, would fall into the
    timing). Returns False when the clone still had a marker (a put-back that left a row)."""
    _, rows, tables = workload
    c = conn(db)
    cur = c.cursor()
    cur.execute('BEGIN')
    cur.execute('SELECT lease_id FROM bench_marker')
    clean = not cur.fetchall()
    if clean:
        cur.execute("INSERT INTO bench_marker (lease_id) VALUES ('x')")
        if tables is None:
            # leasebench's statements (throughput.rs, `work`), one round trip each.
            customer = (rnd * 7919) % 600 + 1
            for i in range(10):
                cur.execute("INSERT INTO orders (customer_id, address_id, status, total) "
                            "VALUES (%s, %s, 'paid', %s::float8)", (customer, customer, i * 10.5 + 1.0))
            cur.execute('SELECT count(*), coalesce(sum(total), 0)::float8 FROM orders '
                        'WHERE customer_id = %s', (customer,))
            cur.fetchone()
        else:
            for t in tables:
                cur.execute(f"INSERT INTO {t} (customer_id, body) SELECT 1 + g %% 100, 'row ' || g "
                            f"FROM generate_series(1, %s) g", (rows,))
    cur.execute('COMMIT' if clean else 'ROLLBACK')
    for statement in extra:
        cur.execute(statement)
    c.close()
    cur = admin.cursor()
    for _ in range(5000):
        cur.execute('SELECT count(*) FROM pg_stat_activity WHERE datname = %s', (db,))
        if cur.fetchone()[0] == 0:
            break
        time.sleep(0.001)
    return clean


class Clone:
    """One clone a way puts back, with its oid and its stamp (files, filenode map)."""

    def __init__(self, admin, tpl, name):
        self.admin, self.tpl, self.name = admin, tpl, name
        self.admin.cursor().execute(f'CREATE DATABASE {name} TEMPLATE tpl STRATEGY FILE_COPY')
        self.stamp_fresh()

    def stamp_fresh(self):
        a = self.admin.cursor()
        a.execute('SELECT oid FROM pg_database WHERE datname = %s', (self.name,))
        self.oid = a.fetchone()[0]
        a.execute('CHECKPOINT')
        self.stamp = files(self.oid), self.tpl.by_filenode

    def drop_and_clone(self, stamp=True):
        a = self.admin.cursor()
        a.execute(f'DROP DATABASE {self.name}')
        a.execute(f'CREATE DATABASE {self.name} TEMPLATE tpl STRATEGY FILE_COPY')
        if stamp:
            self.stamp_fresh()


DEFER = os.environ.get('DEFER') == '1'


def put_back(way, d, tpl, refused):
    """One way's put-back of clone `d`; a refusal counts and falls back to drop + clone.
    Returns True when the clone was put back in place (and is to be checked)."""
    try:
        if way == 'clone':
            d.drop_and_clone(stamp=False)
            return False
        if way == 'reset':
            d.stamp = reset(d.admin, tpl, d.name, d.oid, d.stamp)
        else:
            restore(d.admin, tpl, d.name, d.oid, d.stamp)
        return True
    except Refused as e:
        refused[str(e)] = refused.get(str(e), 0) + 1
        d.drop_and_clone()
        return False


def measure(admin, tpl, pm):
    dbs = {way: Clone(admin, tpl, f'c_{way}') for way in ('clone', 'reset', 'restore')}
    results, refused, unequal, leftover = {}, {}, {}, {}
    for workload in WORKLOADS:
        wname = workload[0]
        for rnd in range(ROUNDS + 5):
            ways = ('clone', 'reset', 'restore')
            for way in ways[rnd % 3:] + ways[:rnd % 3]:
                d = dbs[way]
                warm = rnd < 5  # the first rounds warm caches
                CURRENT[0] = None
                cpu_a = tree_cpu(pm)
                if not test(admin, d.name, workload, rnd):
                    leftover[way] = leftover.get(way, 0) + 1
                cpu_b = tree_cpu(pm)
                CURRENT[0] = None if warm else (wname, way)
                cpu0, own0, t0 = tree_cpu(pm), time.process_time(), time.perf_counter()
                in_place = put_back(way, d, tpl, refused.setdefault((wname, way), {}))
                t1, own1, cpu1 = time.perf_counter(), time.process_time(), tree_cpu(pm)
                sample = [((t1 - t0) * 1000, (cpu1 - cpu0) * 1000, (own1 - own0) * 1000)]
                if way == 'restore' and in_place and not DEFER:
                    own1, t1 = time.process_time(), time.perf_counter()
                    d.stamp = new_stamp(admin, d.oid, d.stamp[1])
                    t2, own2, cpu2 = time.perf_counter(), time.process_time(), tree_cpu(pm)
                    if not warm:
                        results.setdefault((wname, 'stamp'), []).append(
                            ((t2 - t1) * 1000, (cpu2 - cpu1) * 1000, (own2 - own1) * 1000))
                CURRENT[0] = None
                if not warm:
                    results.setdefault((wname, way), []).extend(sample)
                    results.setdefault((wname, 'test'), []).append((0, (cpu_b - cpu_a) * 1000, 0))
                if in_place and full_check(d.name) != tpl.full:
                    unequal[way] = unequal.get(way, 0) + 1
    return results, refused, unequal, leftover


def report(admin, results, refused, unequal, leftover):
    med = statistics.median
    print(f'rounds per workload and way: {ROUNDS}; foreign keys to customers: {bool(FK)}; '
          f'template {pg_size(admin)}; postgres {PGBIN}; restore in one round trip: {not SPLIT}; '
          f'new stamp deferred: {DEFER}; CPU from /proc in ticks of {1000 // HZ} ms')
    print(f"{'workload':9} {'way':8} {'wall ms':>8} {'server CPU ms':>14} {'script CPU ms':>14} "
          f"{'mean server CPU':>16} {'refused':>8}")
    for wname, _, _ in WORKLOADS:
        for way in ('clone', 'reset', 'restore', 'stamp', 'test'):
            r = results.get((wname, way))
            if not r:
                continue
            label = {'stamp': '+stamp', 'test': '(test)'}.get(way, way)
            n = sum(refused.get((wname, way), {}).values())
            print(f"{wname:9} {label:8} {med(x[0] for x in r):8.2f} {med(x[1] for x in r):14.1f} "
                  f"{med(x[2] for x in r):14.2f} {statistics.mean(x[1] for x in r):16.2f} "
                  f"{n if way in ('reset', 'restore') else '':>8}")
        c = results[(wname, 'clone')]
        for way in ('reset', 'restore'):
            rs = results[(wname, way)]
            print(f"{wname:9} clone ÷ {way}: wall {med(x[0] for x in c) / med(x[0] for x in rs):.2f}, "
                  f"mean server+script CPU {statistics.mean(x[1] + x[2] for x in c) / statistics.mean(x[1] + x[2] for x in rs):.2f}")
    for (wname, way), steps in sorted(PHASES.items()):
        # CPU in whole ticks: its mean says more than its median.
        print(f'{wname} {way} steps, median wall ms (mean server CPU ms):',
              ', '.join(f'{k} {statistics.mean(v):.2f}' if k.endswith('CPU]') else f'{k} {med(v):.2f}'
                        for k, v in sorted(steps.items())))
    for key, reasons in sorted(refused.items()):
        if reasons:
            print(f'refused {key}: {reasons}')
    print(f'put back in place but unequal to the template (full check after every round): {unequal or 0}')
    print(f'markers left in a put-back clone: {leftover or 0}')


# ---- Adversarial rounds (ADV=1) ----

ADV_ROUNDS = int(os.environ.get('ADV_ROUNDS', '3'))
# After leasebench's test (the marker and 10 orders), the holder also does one of these.
ADVERSARIAL = [
    ('nothing more (the workload alone)', []),
    ('a template row updated to itself', ['UPDATE orders SET status = status WHERE id = 5']),
    ('a template row deleted, an equal one inserted',
     ['WITH d AS (DELETE FROM order_items WHERE id = 7 RETURNING *) INSERT INTO order_items SELECT * FROM d']),
    ('a template row changed and changed back',
     ["UPDATE customers SET phone = 'x' WHERE id = 4", "UPDATE customers SET phone = '+1-555-0004' WHERE id = 4"]),
    ('a template row deleted', ['DELETE FROM reviews WHERE id = 9']),
    ('a template row locked FOR UPDATE', ['SELECT 1 FROM customers WHERE id = 3 FOR UPDATE']),
    ('a row inserted into a filled table, deleted again',
     ['INSERT INTO reviews (product_id, customer_id, stars) VALUES (1, 1, 5)',
      "DELETE FROM reviews WHERE id = currval('reviews_id_seq')"]),
    ('setval of an owned sequence', ["SELECT setval('payments_id_seq', 5000)"]),
    ('nextval of an unowned sequence', ["SELECT nextval('reset_free_seq')"]),
    ('a sequence restarted', ['ALTER SEQUENCE orders_id_seq RESTART WITH 5000']),
    ('a column default changed', ["ALTER TABLE orders ALTER COLUMN status SET DEFAULT 'paid'"]),
    ('an index added', ['CREATE INDEX ON orders (total)']),
    ('a view (catalog rows only)', ['CREATE VIEW adv_view AS SELECT 1 AS x']),
    ('a comment', ["COMMENT ON TABLE orders IS 'seen'"]),
    ('a grant', ['GRANT SELECT ON orders TO PUBLIC']),
    ('a large object', ['SELECT lo_create(0)']),
    ('a storage option (fillfactor)', ['ALTER TABLE orders SET (fillfactor = 70)']),
    ('a filled table truncated', ['TRUNCATE reviews']),
    ('ANALYZE of the written table', ['ANALYZE orders']),
]


def adversarial(admin, tpl):
    d = Clone(admin, tpl, 'c_adv')
    orders10 = WORKLOADS[2]
    table = []
    for name, extra in ADVERSARIAL:
        seen = {}
        for rnd in range(ADV_ROUNDS):
            clean = test(admin, d.name, orders10, rnd, extra)
            try:
                restore(admin, tpl, d.name, d.oid, d.stamp)
                d.stamp = new_stamp(admin, d.oid, d.stamp[1])
                outcome = 'proven, equal' if full_check(d.name) == tpl.full else 'PROVEN, UNEQUAL'
            except Refused as e:
                outcome = f'refused ({e})'
                d.drop_and_clone()
            if not clean:
                outcome += ', MARKER LEFT'
            seen[outcome] = seen.get(outcome, 0) + 1
        table.append((name, seen))
    table.extend(trigger_in_the_way(admin, tpl))
    print(f'adversarial rounds: {ADV_ROUNDS} per change, after leasebench\'s test; '
          f'restore in one round trip: {not SPLIT}')
    print('| the holder also | outcome (rounds) |')
    print('|---|---|')
    for name, seen in table:
        print(f"| {name} | {'; '.join(f'{k}: {v}' for k, v in sorted(seen.items()))} |")


def trigger_in_the_way(admin, tpl):
    """A holder's trigger on the statement a way itself runs in the clone as superuser (the
    reset's TRUNCATE, the restore's DELETE; ENABLE ALWAYS fires under
    session_replication_role = replica too). The function writes a file as whoever runs it:
    the file existing afterwards means the holder's code ran as the way's superuser."""
    out = []
    for way in ('reset', 'restore'):
        d = Clone(admin, tpl, f'c_trig_{way}')
        seen = {}
        for rnd in range(ADV_ROUNDS):
            mark = f'{root}/trigger-ran-{way}-{rnd}'
            extra = [f"""CREATE FUNCTION adv_ran() RETURNS trigger LANGUAGE plpgsql AS $f$
                         BEGIN COPY (SELECT current_user) TO '{mark}'; RETURN NULL; END $f$""",
                     'CREATE TRIGGER adv_t BEFORE TRUNCATE ON reset_events EXECUTE FUNCTION adv_ran()',
                     'CREATE TRIGGER adv_d BEFORE DELETE ON reset_events EXECUTE FUNCTION adv_ran()',
                     'ALTER TABLE reset_events ENABLE ALWAYS TRIGGER adv_t',
                     'ALTER TABLE reset_events ENABLE ALWAYS TRIGGER adv_d']
            test(admin, d.name, WORKLOADS[0], rnd, extra)
            try:
                if way == 'reset':
                    d.stamp = reset(admin, tpl, d.name, d.oid, d.stamp)
                else:
                    restore(admin, tpl, d.name, d.oid, d.stamp)
                outcome = 'proven, equal' if full_check(d.name) == tpl.full else 'PROVEN, UNEQUAL'
            except Refused as e:
                outcome = f'refused ({e})'
                d.drop_and_clone()
            outcome += '; the trigger RAN as superuser' if os.path.exists(mark) else '; the trigger did not run'
            seen[outcome] = seen.get(outcome, 0) + 1
        out.append((f'w10 + an ALWAYS trigger on reset_events, then the {way}', seen))
    return out


def connection_cost(admin, tpl, pm):
    """What a put-back's own connection into the clone costs: connect, `SELECT 1`, close, and
    the wait until the backend has left (as after a test), 300 times after 20 of warm-up."""
    Clone(admin, tpl, 'c_conn')
    cur = admin.cursor()
    for label, n in (('warm-up', 20), ('measured', 300)):
        cpu0, t0 = tree_cpu(pm), time.perf_counter()
        for _ in range(n):
            c = conn('c_conn')
            c.cursor().execute('SELECT 1')
            c.close()
            for _ in range(5000):
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = 'c_conn'")
                if cur.fetchone()[0] == 0:
                    break
                time.sleep(0.0005)
        cpu1, t1 = tree_cpu(pm), time.perf_counter()
        print(f'{label}: {n} connections, per connection: server CPU {(cpu1 - cpu0) * 1000 / n:.2f} ms '
              f'(the admin session\'s polling included), wall {(t1 - t0) * 1000 / n:.2f} ms')


def main():
    start()
    admin = build_template()
    tpl = Template()
    pm = postmaster_pid()
    PHASE_PM[0] = pm
    if os.environ.get('ADV') == '1':
        adversarial(admin, tpl)
    elif os.environ.get('CONN_COST') == '1':
        connection_cost(admin, tpl, pm)
    else:
        report(admin, *measure(admin, tpl, pm))


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
