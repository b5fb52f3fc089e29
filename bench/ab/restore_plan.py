"""The restore's plan (bench/ab/reset.py's third way, issue 44): which of a clone's changed
files it accepts, and the statements it runs in the clone with the row its proof expects.

Pure: no connection, no file. `tpl` is reset.py's Template (what was computed once from
the template). Refused is the refusal of any way (reset or restore): the clone then goes
through drop + clone.
"""


class Refused(Exception):
    """Anything unsure: the clone is dropped and cloned as today; the message says why."""


def filenode_of(name):
    """`16384`, `16384_fsm`, `16384.1` → 16384; anything else → None (unsure)."""
    base = name.split('.')[0]
    for fork in ('_fsm', '_vm', '_init'):
        if base.endswith(fork):
            base = base[:-len(fork)]
    return int(base) if base.isdigit() else None


def row_fingerprint_sql(name):
    """A table's visible rows with their places, in the order a seq scan returns them: the
    same fingerprint means the same rows at the same ctids (a row updated, even to itself,
    or deleted and inserted again moves; a row only locked by a foreign key stays)."""
    return (f"SELECT md5(coalesce(string_agg(ctid::text || ':' || pglease_row::text, ',' "
            f"ORDER BY ctid), '')) FROM {name} pglease_row")


def sequence_state_sql(name):
    return f"(SELECT last_value::text || ',' || is_called::text FROM {name})"


def classify_for_restore(tpl, changed, by_filenode):
    """Changed files → (written tables, written sequences, changed catalogs), or Refused."""
    tables, sequences, catalogs = set(), set(), set()
    for name in changed:
        node = filenode_of(name)
        if node is None:
            raise Refused(f'unknown file {name}')
        rel = by_filenode.get(node)
        if rel is None:
            raise Refused('new file')
        rel_oid, owner = rel
        if owner in tpl.catalog_names:
            catalogs.add(tpl.catalog_names[owner])
        elif owner in tpl.row_fp:
            tables.add(owner)
            if tpl.rels[rel_oid][0] == 'S':
                sequences.add(rel_oid)
        elif owner in tpl.seq_state:
            sequences.add(owner)  # a sequence no table owns
        else:
            raise Refused(f'file of {tpl.names.get(owner, owner)}, not a table, sequence or catalog')
    return tables, sequences, catalogs


def restore_sql(tpl, tables, sequences, catalogs):
    """The three statements of a restore: (guard, restore, proof) and the proof's expected row.

    The guard runs first and raises when a changed catalog differs from the template's: only
    then is the clone's schema the template's, so that the restore's DELETEs, run as superuser,
    meet no trigger, rule or function of the holder's. `pg_statistic` is left to the proof,
    after the restore deleted the statistics of written tables empty in the template (the
    template has none of theirs: autovacuum analyzes such a table once a test filled it)."""
    guard = []
    for name in sorted(catalogs - {'pg_statistic'}):
        sql, expected = tpl.fingerprints[name]
        guard.append(f"IF ({sql}) IS DISTINCT FROM '{expected}' THEN "
                     f"RAISE EXCEPTION 'catalog {name} differs'; END IF;")
    guard_sql = f"DO $pglease$ BEGIN {' '.join(guard)} END $pglease$" if guard else None
    restore = ['SET session_replication_role = replica']
    for oid in sorted(tables):
        restore.append(f"DELETE FROM {tpl.rels[oid][2]} "
                       f"WHERE pg_catalog.age(xmin) < pg_catalog.age('{tpl.seal_xid}'::xid)")
    if sequences:
        restore.append('SELECT ' + ', '.join(
            f"pg_catalog.setval({oid}::oid::regclass, {int(v.split(',')[0])}, {v.split(',')[1]})"
            for oid in sorted(sequences) for v in [tpl.seq_state[oid]]))
    if 'pg_statistic' in catalogs:
        empty = sorted(oid for oid in tables if oid in tpl.empty)
        if empty:
            restore.append(f"DELETE FROM pg_catalog.pg_statistic WHERE starelid IN "
                           f"({', '.join(str(o) for o in empty)})")
    restore.append('RESET session_replication_role')
    proof, expected, what = [], [], []
    for oid in sorted(tables):
        proof.append(f'({row_fingerprint_sql(tpl.rels[oid][2])})')
        expected.append(tpl.row_fp[oid])
        what.append(f'rows of {tpl.names[oid]}')
    for oid in sorted(sequences):
        proof.append(sequence_state_sql(tpl.rels[oid][2]))
        expected.append(tpl.seq_state[oid])
        what.append(f'sequence {tpl.names[oid]}')
    if 'pg_statistic' in catalogs:
        sql, fp = tpl.fingerprints['pg_statistic']
        proof.append(f'({sql})')
        expected.append(fp)
        what.append('catalog pg_statistic')
    proof_sql = 'SELECT ' + (', '.join(proof) if proof else 'true')
    return guard_sql, '; '.join(restore), proof_sql, (tuple(expected) if proof else (True,)), what
