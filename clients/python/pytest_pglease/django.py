"""Django on leased databases: what a lease puts into a connection's settings, and the
`manage.py test` runner (`TEST_RUNNER = "pytest_pglease.django.PgleaseTestRunner"`).

pglease builds the template with Django's own `python manage.py migrate --noinput`, so
nothing here creates, migrates or drops a test database: a lease is already the migrated
database, and giving it back drops it. Django's per-test isolation (TestCase's transactions,
TransactionTestCase's flush) runs unchanged inside it.

Only the `default` alias is leased, because `migrate` migrates only `default`; an alias that
is a test mirror of `default` (`"TEST": {"MIRROR": "default"}`) follows it. Tests that need
any other database are refused with `UnsupportedDatabases` rather than silently run against
that database's real server.

The pytest side (pytest-django's `django_db_setup`) is `pytest_pglease.django_plugin`; this
module needs Django but not pytest-django.
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any, Iterable, Optional

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.test.runner import DiscoverRunner, ParallelTestSuite
from django.test.runner import _init_worker as django_init_worker

from .client import Client, Database, PgleaseError, PgleaseUnavailable

#: Where the runner leaves each `--parallel` worker's database in the `default` settings, so
#: that a worker finds its own also when multiprocessing spawns instead of forking (Django
#: hands spawned workers the parent's settings dicts).
WORKER_DATABASES_KEY = "PGLEASE_WORKER_DATABASES"


class UnsupportedDatabases(Exception):
    """Tests need a database alias pglease does not lease (anything but `default` and its
    test mirrors)."""

    def __init__(self, aliases: Iterable[str]) -> None:
        self.aliases = sorted(aliases)
        super().__init__(
            "pglease leases only Django's 'default' database (the one `manage.py migrate` "
            f"migrates into the template); these tests also use {', '.join(map(repr, self.aliases))}: "
            "make those aliases test mirrors of 'default' (\"TEST\": {\"MIRROR\": \"default\"}) "
            "or run them without pglease (pytest: -p no:pglease_django)"
        )


def leased_settings(current: dict, database: Database) -> dict:
    """The keys of a `DATABASES` entry that point it at `database`. `TEST["NAME"]` names the
    leased database too, so that nothing derives a `test_…` name from it."""
    test = dict(current.get("TEST") or {})
    test["NAME"] = database.database
    return {
        "NAME": database.database,
        "USER": database.user,
        "PASSWORD": database.password,
        "HOST": database.host,
        "PORT": str(database.port),
        "TEST": test,
    }


def unsupported_aliases(aliases: Iterable[str], databases: dict) -> set:
    """The aliases among `aliases` that are neither `default` nor a test mirror of it."""
    return {
        alias
        for alias in aliases
        if alias != DEFAULT_DB_ALIAS
        and ((databases.get(alias) or {}).get("TEST") or {}).get("MIRROR") != DEFAULT_DB_ALIAS
    }


def point_default_at(database: Database) -> dict:
    """Points the `default` connection (and `settings.DATABASES`, where that is another dict)
    at `database`, and its test mirrors at it; returns the settings it replaced, for
    `restore_default`. Closes the connection first: an open one is to another database."""
    from django.conf import settings

    connection = connections[DEFAULT_DB_ALIAS]
    connection.close()
    old = copy.deepcopy(connection.settings_dict)
    update = leased_settings(connection.settings_dict, database)
    connection.settings_dict.update(update)
    configured = settings.DATABASES.get(DEFAULT_DB_ALIAS)
    if configured is not None and configured is not connection.settings_dict:
        configured.update(copy.deepcopy(update))
    for alias in connections:
        if alias != DEFAULT_DB_ALIAS and not unsupported_aliases([alias], connections.settings):
            connections[alias].close()
            connections[alias].creation.set_as_test_mirror(connection.settings_dict)
    return old


def restore_default(old: dict) -> None:
    """Gives `default` back the settings `point_default_at` replaced."""
    from django.conf import settings

    connections.close_all()
    connection = connections[DEFAULT_DB_ALIAS]
    connection.settings_dict.clear()
    connection.settings_dict.update(old)
    configured = settings.DATABASES.get(DEFAULT_DB_ALIAS)
    if configured is not None and configured is not connection.settings_dict:
        configured.clear()
        configured.update(copy.deepcopy(old))


def serialize_default() -> None:
    """What Django's own setup does for `serialized_rollback` tests: keeps the database's
    contents as the template left them, to restore after each such test."""
    connection = connections[DEFAULT_DB_ALIAS]
    connection._test_serialized_contents = connection.creation.serialize_db_to_string()


def _init_worker(counter, *args, **kwargs) -> None:
    """A `--parallel` worker's start: Django's own (which names the database `NAME_N`
    after its worker number N), then the database the runner leased for worker N."""
    from django.test import runner

    django_init_worker(counter, *args, **kwargs)
    connection = connections[DEFAULT_DB_ALIAS]
    worker_databases = connection.settings_dict.get(WORKER_DATABASES_KEY) or {}
    mine = worker_databases.get(str(runner._worker_id))
    if mine is not None:
        connection.close()
        connection.settings_dict.update(copy.deepcopy(mine))


class PgleaseParallelTestSuite(ParallelTestSuite):
    """Django's parallel suite whose workers use the databases `PgleaseTestRunner` leased."""

    init_worker = _init_worker


class PgleaseTestRunner(DiscoverRunner):
    """`manage.py test` on leased databases: `setup_databases` leases one database of the
    template for the run (and one more per `--parallel` worker) instead of creating and
    migrating `test_…` databases, and `teardown_databases` gives them back.

    The daemon and template come from `--pglease-url` / `PGLEASE_URL` (default
    http://127.0.0.1:5480), `--pglease-template` / `PGLEASE_TEMPLATE` (default `default`),
    and the token from `PGLEASE_TOKEN`; `--pglease-ttl` gives the leases a longer life than
    the daemon's default for a long run.
    """

    parallel_test_suite = PgleaseParallelTestSuite

    def __init__(
        self,
        pglease_url: Optional[str] = None,
        pglease_template: Optional[str] = None,
        pglease_ttl: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pglease_ttl = pglease_ttl
        self.pglease_client = Client(
            pglease_url or os.environ.get("PGLEASE_URL") or "http://127.0.0.1:5480",
            os.environ.get("PGLEASE_TOKEN") or None,
        )
        self.pglease_template = pglease_template or os.environ.get("PGLEASE_TEMPLATE") or "default"
        self.pglease_leases: list = []
        #: The `default` settings the leases replaced, until teardown restores them.
        self.pglease_old_settings: Optional[dict] = None

    @classmethod
    def add_arguments(cls, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--pglease-url",
            help="the pglease daemon's URL [env PGLEASE_URL; default http://127.0.0.1:5480]",
        )
        parser.add_argument(
            "--pglease-template",
            help="the template to lease, built by `manage.py migrate` [env PGLEASE_TEMPLATE; "
            "default: default]",
        )
        parser.add_argument(
            "--pglease-ttl",
            type=int,
            help="each lease's time to live in seconds, for runs longer than the daemon's "
            "default [default: the daemon's]",
        )

    def lease(self, label: str) -> Database:
        """Leases a database of the template, or stops the command saying why."""
        try:
            database = self.pglease_client.lease(
                self.pglease_template, label=label, ttl_secs=self.pglease_ttl
            )
        except PgleaseError as error:
            raise CommandError(
                f"pglease: cannot lease a database of template {self.pglease_template!r}: "
                f"{error.status} {error.code}: {error.message}"
            ) from None
        except PgleaseUnavailable as error:
            raise CommandError(f"pglease: {error}") from None
        self.pglease_leases.append(database)
        return database

    def setup_databases(self, aliases=None, serialized_aliases=None, **kwargs):
        needed = set(connections) if aliases is None else set(aliases)
        if not needed:
            return None
        unsupported = unsupported_aliases(needed, connections.settings)
        if unsupported:
            raise CommandError(str(UnsupportedDatabases(unsupported)))
        try:
            return self._lease_databases(serialized_aliases)
        except BaseException:
            # Django calls teardown_databases only after a setup that returned: give back
            # what this one leased before it failed.
            self.teardown_databases(None)
            raise

    def _lease_databases(self, serialized_aliases) -> dict:
        database = self.lease("manage.py test")
        self.log(f"Using leased database {database.database!r} for alias 'default'…")
        old = point_default_at(database)
        self.pglease_old_settings = old
        connection = connections[DEFAULT_DB_ALIAS]
        if self.parallel > 1:
            # One database per worker, as Django clones one per worker: worker N (from 1)
            # finds its own under its number in the settings (_init_worker).
            connection.settings_dict[WORKER_DATABASES_KEY] = {
                str(worker): leased_settings(
                    connection.settings_dict, self.lease(f"manage.py test (worker {worker})")
                )
                for worker in range(1, self.parallel + 1)
            }
        if serialized_aliases is None or DEFAULT_DB_ALIAS in serialized_aliases:
            serialize_default()
        if self.debug_sql:
            for alias in connections:
                connections[alias].force_debug_cursor = True
        return old

    def teardown_databases(self, old_config, **kwargs) -> None:
        old = old_config if old_config is not None else self.pglease_old_settings
        self.pglease_old_settings = None
        if old is not None:
            restore_default(old)
        leases, self.pglease_leases = self.pglease_leases, []
        for database in leases:
            try:
                self.pglease_client.release(database.id)
            except (PgleaseError, PgleaseUnavailable) as error:
                warnings.warn(f"pglease: could not release lease {database.id}: {error}")
