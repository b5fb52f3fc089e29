"""pytest-django on a leased database: this plugin's `django_db_setup` replaces
pytest-django's, so that each pytest process (each pytest-xdist worker) leases one database
of the template — Django's own `manage.py migrate`, already applied — and points Django's
`default` database at it, instead of creating and migrating a `test_…` database through the
`postgres` database (which a lease role may not do). It gives the lease back at the end.

pytest-django's per-test isolation is untouched: `django_db` tests run in a transaction
rolled back after them, `transactional_db` tests flush the tables, both inside the leased
database. `--reuse-db`, `--create-db` and `--nomigrations` have nothing left to decide.

`pytest_pglease.plugin` registers this module (as `pglease_django`) at configure time when
pytest-django is active, after every installed plugin, so that its fixture wins over
pytest-django's; a `django_db_setup` in a project's conftest.py still wins over both.
`-p no:pglease_django` leaves pytest-django's own setup in place.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from .leasing import SETTINGS, lease as _lease, release as _release

#: The name this plugin is registered under (and `-p no:` blocks).
PLUGIN_NAME = "pglease_django"


def databases_for_setup(items) -> tuple:
    """The aliases the collected tests use and those that need serializing, as pytest-django
    finds them (a private helper of pytest-django; without it, `default` alone)."""
    try:
        from pytest_django.fixtures import _get_databases_for_setup
    except ImportError:
        return {"default"}, set()
    return _get_databases_for_setup(items)


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_test_environment: None,
    django_db_blocker,
    django_db_modify_db_settings: None,
) -> Iterator[None]:
    """Leases this process's database of the pglease template and points Django's `default`
    database at it; gives it back at the end of the session."""
    from django.db import connections

    from .django import (
        UnsupportedDatabases,
        point_default_at,
        restore_default,
        serialize_default,
        unsupported_aliases,
    )

    settings = request.config.stash[SETTINGS]
    aliases, serialized_aliases = databases_for_setup(request.session.items)
    unsupported = unsupported_aliases(aliases, connections.settings)
    if unsupported:
        pytest.fail(f"pglease: {UnsupportedDatabases(unsupported)}", pytrace=False)
    worker = getattr(request.config, "workerinput", {}).get("workerid", "main")
    database = _lease(settings, settings.template, f"django ({worker})")
    try:
        with django_db_blocker.unblock():
            old = point_default_at(database)
            if "default" in serialized_aliases:
                serialize_default()
    except BaseException:
        _release(settings, database)
        raise
    try:
        yield
        with django_db_blocker.unblock():
            restore_default(old)
    finally:
        _release(settings, database)


def register(config: pytest.Config) -> None:
    """Registers this plugin when pytest-django is active and `-p no:pglease_django` was not
    given. Called from `pytest_configure`, which runs after every installed plugin was
    registered: among plugins, the fixture registered last is the one tests get."""
    manager = config.pluginmanager
    django_active = any(
        getattr(plugin, "__name__", None) == "pytest_django.plugin" for plugin in manager.get_plugins()
    )
    if django_active and not manager.is_blocked(PLUGIN_NAME) and not manager.has_plugin(PLUGIN_NAME):
        import sys

        manager.register(sys.modules[__name__], PLUGIN_NAME)
