"""Connects to a lease with each Python driver, as docs/using-from-tests.md tells users to:
the `url` as it is (psycopg 3, psycopg2, asyncpg, SQLAlchemy), the fields for pg8000, which
takes no URL. The lease answer comes as JSON in PGLEASE_LEASE. Prints `ok <driver>` or
`FAIL <driver>: <error>` per driver; exits 1 if any failed."""

import asyncio
import json
import os
import sys

lease = json.loads(os.environ["PGLEASE_LEASE"])
url = lease["url"]
QUERY = "SELECT current_user, current_database()"
expected = (lease["user"], lease["database"])


def psycopg3():
    import psycopg

    with psycopg.connect(url) as conn:
        return tuple(conn.execute(QUERY).fetchone())


def dbapi_row(conn):
    """The query's row through a DB-API connection, closed afterwards."""
    try:
        cur = conn.cursor()
        cur.execute(QUERY)
        return tuple(cur.fetchone())
    finally:
        conn.close()


def psycopg2_():
    import psycopg2

    return dbapi_row(psycopg2.connect(url))


def asyncpg_():
    import asyncpg

    async def run():
        conn = await asyncpg.connect(url)
        try:
            return tuple(await conn.fetchrow(QUERY))
        finally:
            await conn.close()

    return asyncio.run(run())


def sqlalchemy_():
    import sqlalchemy

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(sqlalchemy.text(QUERY)).one())
    finally:
        engine.dispose()


def pg8000_():
    import pg8000.dbapi

    return dbapi_row(
        pg8000.dbapi.connect(
            host=lease["host"],
            port=lease["port"],
            user=lease["user"],
            password=lease["password"],
            database=lease["database"],
        )
    )


failed = False
for name, check in [
    ("psycopg", psycopg3),
    ("psycopg2", psycopg2_),
    ("asyncpg", asyncpg_),
    ("sqlalchemy", sqlalchemy_),
    ("pg8000", pg8000_),
]:
    try:
        got = check()
        if got != expected:
            raise AssertionError(f"connected as {got}, not {expected}")
        print(f"ok {name}")
    except Exception as error:  # noqa: BLE001 - every driver's failure is reported
        failed = True
        print(f"FAIL {name}: {type(error).__name__}: {error}")
sys.exit(1 if failed else 0)
