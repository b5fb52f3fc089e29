"""Drives pglease's IntegreSQL API with the IntegreSQL client library from PyPI
(integresql-client-python), which sends its initialize body as a form, not JSON:
initialize → migrate (with psql) → finalize, 10 test databases, give back unchanged,
discard, reset. Usage: PGLEASE_INTEGRESQL_URL=http://127.0.0.1:5000/api python3 flow.py
Prints one JSON line of counts; exits non-zero on any failure."""

import json
import os
import pathlib
import subprocess
import sys

from integresql_client_python import IntegreSQL, errors

HERE = pathlib.Path(__file__).resolve().parent
MIGRATIONS = HERE.parent / "js" / "migrations"


def psql(dbinfo, sql):
    url = f"{dbinfo}?sslmode=disable"
    out = subprocess.run(
        ["psql", url, "-v", "ON_ERROR_STOP=1", "-tAc", sql],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def main():
    base_url = os.environ["PGLEASE_INTEGRESQL_URL"]
    migrations = 0
    with IntegreSQL(MIGRATIONS, base_url=base_url) as tpl:
        tpl.integresql.reset_all_tracking()
        # `with` finalizes on exit; a second initializer gets no dbinfo (423) and only
        # finalizes, which is fine once the first has.
        with tpl.initialize() as dbinfo:
            assert dbinfo is not None, "the first initializer must get the template"
            psql(dbinfo, (MIGRATIONS / "001_items.sql").read_text())
            migrations += 1
        with tpl.integresql.get_template().initialize() as again:
            assert again is None, "a second initializer must be told it is locked"
        ids = set()
        names = set()
        tests = 0
        for i in range(10):
            database = tpl.get_database()
            with database as db:
                ids.add(db.db_id)
                names.add(db.name)
                tests += 1
                count = psql(db, "SELECT count(*) FROM items")
                assert count == "1", f"test {i} saw {count} rows"
            database.mark_unmodified(db)
        # Each test gave its database back unchanged: the next one gets it again, under
        # the same id (as from IntegreSQL).
        assert len(ids) == 1 and len(names) == 1, f"ids {ids}, databases {names}"
        tpl.discard()
        try:
            tpl.get_database().open()
            raise AssertionError("a discarded template still gave a database")
        except errors.DatabaseDiscarded:
            pass
        tpl.integresql.reset_all_tracking()
    print(json.dumps({
        "client": "integresql-client-python",
        "migrations": migrations,
        "tests": tests,
        "distinct_ids": len(ids),
        "after_discard": 410,
    }))


if __name__ == "__main__":
    sys.exit(main())
