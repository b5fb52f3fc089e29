"""Connects with each Python driver: psycopg 3, psycopg2, asyncpg, SQLAlchemy, pg8000.

Two modes:

- A lease (tests/it/drivers.rs): the lease answer comes as JSON in PGLEASE_LEASE and each
  driver connects as docs/using-from-tests.md tells users to: the `url` as it is, the fields
  for pg8000, which takes no URL.
- The PostgreSQL front (tests/it/front_drivers.rs): PGLEASE_FRONT_URL is
  `postgresql://<user>@<host>:<port>/<template>`, given to each driver as it is (its fields
  for pg8000). Each driver opens two connections, one after the other, and checks what
  docs/front.md promises: a clone of its own, the lease's role, a table round trip, a query
  with a parameter. It prints `ok <driver> <first database> <second database>`.

Arguments name the drivers to run (all when none). Prints `ok <driver> ...` or
`FAIL <driver>: <error>` per driver; exits 1 if any failed."""

import asyncio
import json
import os
import sys
import urllib.parse

FRONT_URL = os.environ.get("PGLEASE_FRONT_URL")


# --- a lease -------------------------------------------------------------------------------

QUERY = "SELECT current_user, current_database()"


def lease_checks():
    lease = json.loads(os.environ["PGLEASE_LEASE"])
    url = lease["url"]
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

    def checked(connect):
        def check():
            got = connect()
            if got != expected:
                raise AssertionError(f"connected as {got}, not {expected}")
            return ""

        return check

    return {
        "psycopg": checked(psycopg3),
        "psycopg2": checked(psycopg2_),
        "asyncpg": checked(asyncpg_),
        "sqlalchemy": checked(sqlalchemy_),
        "pg8000": checked(pg8000_),
    }


# --- the front -----------------------------------------------------------------------------


def probe(run):
    """The front's checks on one connection; `run(sql, params)` returns the rows, with `{}`
    in `sql` standing for each parameter in the driver's own style. Returns the database."""
    user, database = run("SELECT current_user, current_database()", ())[0]
    template = urllib.parse.urlsplit(FRONT_URL).path.lstrip("/")
    named = urllib.parse.urlsplit(FRONT_URL).username
    if database == template:
        raise AssertionError(f"connected to the template's name {database!r}, not a clone")
    # The front logs in as the lease's role, which pglease names after its database; the
    # user the client named is only the front's.
    if user != database or user == named:
        raise AssertionError(f"current_user is {user!r}: not the lease's role of {database!r}")
    # A fresh clone: the table is not there yet (a reused connection would fail here).
    run("CREATE TABLE front_check (id int PRIMARY KEY, name text)", ())
    run("INSERT INTO front_check VALUES ({}, {})", (1, "one"))
    rows = run("SELECT name FROM front_check WHERE id = {}", (1,))
    if [tuple(row) for row in rows] != [("one",)]:
        raise AssertionError(f"round trip: {rows}")
    # Past psycopg 3's prepare_threshold (5) the statement is a named server-side one.
    for n in range(7):
        rows = run("SELECT CAST({} AS int) + 1", (41 + n,))
        if rows[0][0] != 42 + n:
            raise AssertionError(f"a query with a parameter: {rows}")
    return database


def two_connections(connection):
    """Runs `probe` on two connections, one after the other: `connection()` is a context
    manager giving `run`, which commits what it wrote and closes the connection on exit.
    The second must get another database."""
    databases = []
    for _ in range(2):
        with connection() as run:
            databases.append(probe(run))
    if databases[0] == databases[1]:
        raise AssertionError(f"both connections got {databases[0]}")
    return " ".join(databases)


class Session:
    """A context manager over a connection: `run` with a statement adapter, commit and
    close at the end."""

    def __init__(self, open_, run, commit, close):
        self.open_, self.run_, self.commit, self.close = open_, run, commit, close

    def __enter__(self):
        self.conn = self.open_()
        return lambda sql, params: self.run_(self.conn, sql, params)

    def __exit__(self, kind, *_):
        try:
            if kind is None:
                self.commit(self.conn)
        finally:
            self.close(self.conn)


def dbapi_run(conn, sql, params):
    """`run` for a DB-API driver of paramstyle `format` (psycopg, psycopg2, pg8000)."""
    cur = conn.cursor()
    cur.execute(sql.replace("{}", "%s"), params)
    return cur.fetchall() if cur.description else []


def dbapi_session(open_):
    return Session(open_, dbapi_run, lambda c: c.commit(), lambda c: c.close())


def front_checks():
    url = FRONT_URL
    parts = urllib.parse.urlsplit(url)

    def psycopg3():
        import psycopg

        # psycopg 3 sends parameters with the extended protocol (server-side binding).
        return two_connections(lambda: dbapi_session(lambda: psycopg.connect(url)))

    def psycopg2_():
        import psycopg2

        return two_connections(lambda: dbapi_session(lambda: psycopg2.connect(url)))

    def pg8000_():
        import pg8000.dbapi

        def open_():
            return pg8000.dbapi.connect(
                host=parts.hostname,
                port=parts.port,
                user=parts.username,
                database=parts.path.lstrip("/"),
            )

        return two_connections(lambda: dbapi_session(open_))

    def asyncpg_():
        import asyncpg

        loop = asyncio.new_event_loop()

        def run(conn, sql, params):
            # asyncpg prepares every statement (extended protocol, $n parameters).
            numbered = sql
            for n in range(1, len(params) + 1):
                numbered = numbered.replace("{}", f"${n}", 1)
            return loop.run_until_complete(conn.fetch(numbered, *params))

        def session():
            return Session(
                lambda: loop.run_until_complete(asyncpg.connect(url)),
                run,
                lambda _: None,  # asyncpg commits each statement
                lambda c: loop.run_until_complete(c.close()),
            )

        try:
            return two_connections(session)
        finally:
            loop.close()

    def sqlalchemy_():
        import sqlalchemy

        def run(conn, sql, params):
            named = sql
            for n in range(len(params)):
                named = named.replace("{}", f":p{n}", 1)
            values = {f"p{n}": value for n, value in enumerate(params)}
            result = conn.execute(sqlalchemy.text(named), values)
            return result.all() if result.returns_rows else []

        def session():
            # An engine per connection: one engine's pool would hand the first one back.
            engine = sqlalchemy.create_engine(url)

            def close(conn):
                conn.close()
                engine.dispose()

            return Session(engine.connect, run, lambda c: c.commit(), close)

        return two_connections(session)

    return {
        "psycopg": psycopg3,
        "psycopg2": psycopg2_,
        "asyncpg": asyncpg_,
        "sqlalchemy": sqlalchemy_,
        "pg8000": pg8000_,
    }


checks = front_checks() if FRONT_URL else lease_checks()
names = sys.argv[1:] or list(checks)
failed = False
for name in names:
    try:
        print(f"ok {name} {checks[name]()}".rstrip())
    except Exception as error:  # noqa: BLE001 - every driver's failure is reported
        failed = True
        print(f"FAIL {name}: {type(error).__name__}: {error}")
sys.exit(1 if failed else 0)
